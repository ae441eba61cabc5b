package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The single-pass Canonicalize must be indistinguishable from the reference
// implementation in canonical_ref_test.go: the same bytes for every document
// the reference accepts, an error for every document it refuses.

// canonDiff fails t when Canonicalize and the reference disagree on in.
func canonDiff(t testing.TB, in []byte) {
	t.Helper()
	want, wantErr := refCanonicalize(in)
	got, err := Canonicalize(in)
	switch {
	case (err != nil) != (wantErr != nil):
		t.Fatalf("Canonicalize(%q): error %v, reference error %v", in, err, wantErr)
	case err != nil && !errors.Is(err, ErrInvalidJSON):
		t.Fatalf("Canonicalize(%q): error %v does not wrap ErrInvalidJSON", in, err)
	case !bytes.Equal(got, want):
		t.Fatalf("Canonicalize(%q)\n got %q\nwant %q", in, got, want)
	}
	hash, err := PayloadHash(in)
	if len(in) == 0 {
		return // hashed as "{}"
	}
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("PayloadHash(%q): error %v, reference error %v", in, err, wantErr)
	}
	if err == nil {
		sum := sha256.Sum256(want)
		if hash != hex.EncodeToString(sum[:]) {
			t.Fatalf("PayloadHash(%q) = %s, not the hash of %q", in, hash, want)
		}
	}
}

// canonDiffCases are documents, valid and not, that probe every branch of
// the scanner; the fuzz target starts from them too.
var canonDiffCases = []string{
	``, ` `, `{}`, `[]`, `{ }`, `[ ]`, `null`, `true`, `false`, `nul`, `nulll`, `tru`, `truex`, `[true1]`,
	`0`, `-0`, `-`, `--1`, `00`, `01`, `-01`, `1.`, `1.e5`, `.5`, `1e`, `1e+`, `1E-0`, `0e0`, `-0.0`, `0.0000`,
	`123456789012345`, `-123456789012345`, `1234567890123456`, `9007199254740993`, `99999999999999999999`,
	`999999999999999999999`, `100000000000000000000000`, `1e21`, `1e-7`, `1e-6`, `4.50`, `1e400`, `-1e400`, `1e-400`,
	`2.2250738585072011e-308`, `4.9e-324`, `2e-324`, `1.7976931348623158e308`, `1.7976931348623159e308`,
	`0.1e1`, `10e-1`, `123.456e2`, `1` + strings.Repeat("0", 400), `0.` + strings.Repeat("0", 400) + "1",
	`"`, `"abc`, `"\"`, `"\\"`, `"\u"`, `"\u12"`, `"\u12g4"`, `"\U0041"`, `"\x41"`, `"\'"`, "\"\t\"", "\"\x7f\"",
	`"\u0000\u001f\u0020\u007f\u0080\u00ff\u2028\ufeff\uffff"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\ud83d"`,
	`"\ud83d\u0041"`, `"\ud83dx"`, `"\ude00"`, `"\ud83d\ud83d"`, `"\\ud83d"`, `"\\\ud83d"`, `"\/\b\f\n\r\t"`,
	"\"\xe2\x82\xac\xf0\x9f\x98\x80\"", "\"\xe2\x82\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
	"\xff", "\xef\xbb\xbf{}", "{}\xff", "[1,\"\xff\"]x",
	`{"a":1,"b":2}`, `{"b":1,"a":2}`, `{"a":1,"a":2}`, `{"b":1,"a":2,"b":3,"a":4}`, `{"a":1,"\u0061":2}`,
	`{"\u0061":1,"a":2}`, `{"a\"":1,"a":2,"a\\":3,"a\n":4}`, `{"\n":1,"A":2}`, `{"a":1,"b":2,"a":3}`,
	"{\"\uffff\":1,\"\U00010000\":2,\"\ud7ff\":3,\"\ue000\":4}", `{"\ud800\udc00":1,"\uffff":2,"\ue000":3}`,
	`{"aé":1,"a😀":2,"a":3,"a\uffff":4,"a\u0000":5}`, `{"x":{"b":1,"a":[{"d":1,"c":{"f":1,"e":2}}]},"w":0}`,
	`{"a" 1}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":1 "b":2}`, `{a:1}`, `{"a":1]`, `[1}`, `[1 2]`, `[,1]`, `[1,,2]`,
	`{"a":1}}`, `[[]]]`, `{"a":1} x`, `{"a":1}{}`, `1 2`, `1x`, `"a""b"`, ` {"a" : [ 1 , 2 ] } `, "\t\n\r{}\r\n\t",
	"\v{}", "{}\f", `{"a":1,"a":[[[`, `{"a":1,"a":1e400}`, `{"a":1e400,"a":1}`, `["\ud800",1e400]`,
	`[1e400,"\ud800"]`, `[1e400,"\xff"]`, `{"a":"\ud800","a":1}`,
	strings.Repeat("[", canonMaxDepth) + strings.Repeat("]", canonMaxDepth),
	strings.Repeat("[", canonMaxDepth+1) + strings.Repeat("]", canonMaxDepth+1),
	strings.Repeat(`{"a":`, canonMaxDepth) + "1" + strings.Repeat("}", canonMaxDepth),
	strings.Repeat(`{"a":`, canonMaxDepth+1) + "1" + strings.Repeat("}", canonMaxDepth+1),
	strings.Repeat("[", canonMaxDepth+1),
}

func TestCanonicalizeMatchesReference(t *testing.T) {
	t.Parallel()
	for _, in := range canonDiffCases {
		canonDiff(t, []byte(in))
	}
	r := rand.New(rand.NewPCG(1, 2))
	n := 10000
	if testing.Short() {
		n = 1000
	}
	for range n {
		doc := canonRandomValue(r, nil, 0)
		canonDiff(t, doc)
		// Mutations reach the error paths, and the places where a valid
		// document turns invalid.
		for range 3 {
			canonDiff(t, canonMutate(r, doc))
		}
	}
}

// TestCanonicalNumbersMatchReference runs random doubles and number
// spellings through both formatters and both canonicalizers.
func TestCanonicalNumbersMatchReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	n := 300000
	if testing.Short() {
		n = 30000
	}
	for i := range n {
		var f float64
		switch i % 3 {
		case 0: // any bit pattern, NaN and ±Inf included
			f = math.Float64frombits(r.Uint64())
		case 1: // integers and near-integers around 2^53, where the fast path ends
			f = float64(r.Int64N(1<<55)-1<<54) + float64(r.IntN(3)-1)*0.5
		default: // ordinary magnitudes
			f = (r.Float64() - 0.5) * math.Pow(10, float64(r.IntN(60)-30))
		}
		got, gotOK := canonFormatFloat(f)
		want, wantOK := refCanonFormatFloat(f)
		if got != want || gotOK != wantOK {
			t.Fatalf("canonFormatFloat(%v) = %q, %v; reference %q, %v", f, got, gotOK, want, wantOK)
		}
		if i%10 != 0 {
			continue // the whole documents are slower to compare
		}
		if wantOK {
			canonDiff(t, []byte(want))
			canonDiff(t, strconv.AppendFloat(nil, f, 'g', -1, 64))
		}
		canonDiff(t, canonRandomNumber(r))
	}
}

func FuzzCanonicalizeReference(f *testing.F) {
	for _, in := range canonDiffCases {
		f.Add([]byte(in))
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		f.Add(canonRandomValue(r, nil, 0))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		canonDiff(t, in)
	})
}

// canonRandomValue appends a random JSON document, with random whitespace,
// key orders, escapes, characters on both sides of the UTF-16 ordering
// quirk, and numbers in every spelling.
func canonRandomValue(r *rand.Rand, dst []byte, depth int) []byte {
	space := func() {
		if r.IntN(4) == 0 {
			dst = append(dst, " \t\n\r"[r.IntN(4)])
		}
	}
	space()
	kind := r.IntN(10)
	if depth > 4 && kind < 4 {
		kind += 4
	}
	switch kind {
	case 0, 1:
		dst = append(dst, '{')
		n := r.IntN(6)
		keys := []string{"a", "b", "é", "😀", "\uffff", "id", "amount", "ab", ""}
		for i := range n {
			if i > 0 {
				dst = append(dst, ',')
			}
			space()
			key := keys[r.IntN(len(keys))]
			if r.IntN(3) == 0 {
				key = canonRandomString(r)
			} else {
				key = strconv.Quote(key)
			}
			dst = append(dst, key...)
			space()
			dst = append(dst, ':')
			dst = canonRandomValue(r, dst, depth+1)
		}
		space()
		dst = append(dst, '}')
	case 2, 3:
		dst = append(dst, '[')
		n := r.IntN(5)
		for i := range n {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = canonRandomValue(r, dst, depth+1)
		}
		space()
		dst = append(dst, ']')
	case 4, 5:
		dst = append(dst, canonRandomString(r)...)
	case 6, 7:
		dst = append(dst, canonRandomNumber(r)...)
	default:
		dst = append(dst, []string{"true", "false", "null"}[r.IntN(3)]...)
	}
	space()
	return dst
}

func canonRandomString(r *rand.Rand) string {
	pieces := []string{
		"a", "Z", "0", " ", "é", "€", "😀", "\uffff", "\ue000", "\ud7ff", "\u2028", "<", "&", "\x7f",
		`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000`, `\u001F`, `\u0041`, `\u00e9`, `\u20AC`,
		`\ud83d\ude00`, `\uDBFF\uDFFF`, `\ufffd`, `\uffff`, `\u0022`, `\u005c`,
	}
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(6) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	b.WriteByte('"')
	return b.String()
}

func canonRandomNumber(r *rand.Rand) []byte {
	var b []byte
	if r.IntN(3) == 0 {
		b = append(b, '-')
	}
	switch r.IntN(4) {
	case 0:
		b = append(b, '0')
	default:
		b = append(b, byte('1'+r.IntN(9)))
		for range r.IntN(25) {
			b = append(b, byte('0'+r.IntN(10)))
		}
	}
	if r.IntN(3) == 0 {
		b = append(b, '.')
		for range 1 + r.IntN(20) {
			b = append(b, byte('0'+r.IntN(10)))
		}
	}
	if r.IntN(3) == 0 {
		b = append(b, "eE"[r.IntN(2)])
		if r.IntN(2) == 0 {
			b = append(b, "+-"[r.IntN(2)])
		}
		b = strconv.AppendInt(b, int64(r.IntN(400)), 10)
	}
	return b
}

// canonMutate returns doc with one random byte changed, inserted, deleted
// or duplicated.
func canonMutate(r *rand.Rand, doc []byte) []byte {
	out := bytes.Clone(doc)
	if len(out) == 0 {
		return []byte{byte(r.IntN(256))}
	}
	i := r.IntN(len(out))
	alphabet := []byte("{}[]\",:\\u0123456789abcdefABCDEF.eE+- \t\n\x00\x1f\x7f\x80\xbf\xc3\xed\xf0\xff")
	switch r.IntN(4) {
	case 0:
		out[i] = alphabet[r.IntN(len(alphabet))]
	case 1:
		out = append(out[:i], append([]byte{alphabet[r.IntN(len(alphabet))]}, out[i:]...)...)
	case 2:
		out = append(out[:i], out[i+1:]...)
	default:
		j := i + r.IntN(len(out)-i)
		out = append(out[:j], append(bytes.Clone(out[i:j]), out[j:]...)...)
	}
	return out
}
