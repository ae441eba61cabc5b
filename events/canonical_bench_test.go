package events_test

import (
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/go-json-experiment/json/jsontext"
)

// benchArgs are tool-call arguments of the sizes and shapes effectline sees:
// a small object as Go's json.Marshal of a map writes it (keys already in
// order), the same object as a struct or a Python dict writes it (keys out
// of order), and a larger one with fractions, escapes and non-ASCII text.
var benchArgs = []struct {
	name string
	args string
}{
	{"small", `{"amount":1234,"currency":"EUR","customer":{"id":"c_1","tags":["a","b"]}}`},
	{"small_unsorted", `{"customer":{"tags":["a","b"],"id":"c_1"},"currency":"EUR","amount":1234}`},
	{"medium", `{"order_id":"ord_8f3a2c","amount":129.95,"currency":"EUR","tax_rate":0.19,"lines":[` +
		`{"sku":"A-1001","qty":2,"unit_price":49.5,"title":"Kaffeebohnen \"Röstung\" 1kg"},` +
		`{"sku":"B-2002","qty":1,"unit_price":30.95,"title":"Milchschäumer <Edelstahl> & Deckel"}],` +
		`"customer":{"id":"cus_42","email":"anna@example.com","name":"Anna Müller","tags":["vip","eu"],"created":1767225600},` +
		`"shipping":{"method":"express","address":{"street":"Hauptstraße 5","city":"Köln","zip":"50667","country":"DE"}},` +
		`"metadata":{"source":"agent","trace":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","retry":false,"note":null}}`},
}

func BenchmarkCanonicalize(b *testing.B) {
	for _, bc := range benchArgs {
		b.Run(bc.name, func(b *testing.B) {
			in := []byte(bc.args)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.Canonicalize(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPayloadHash(b *testing.B) {
	for _, bc := range benchArgs {
		b.Run(bc.name, func(b *testing.B) {
			in := []byte(bc.args)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.PayloadHash(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCanonicalizeJSONv2 is BenchmarkCanonicalize through json v2's
// RFC 8785 implementation, the library Canonicalize is measured against
// (docs/benchmarks.md). It copies its input, as Canonicalize returns a copy.
func BenchmarkCanonicalizeJSONv2(b *testing.B) {
	for _, bc := range benchArgs {
		b.Run(bc.name, func(b *testing.B) {
			in := []byte(bc.args)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				v := append(jsontext.Value(nil), in...)
				if err := v.Canonicalize(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
