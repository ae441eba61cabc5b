package events

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// Canonicalize is kept beside json v2's jsontext.Value.Canonicalize, which
// implements the same RFC 8785, because it refuses more (docs/design.md,
// "The event codec"). These tests pin that claim: wherever Canonicalize
// accepts a document, the library accepts it too and writes the very same
// bytes; wherever only the library accepts, the document nests deeper than
// canonMaxDepth or holds a number beyond the range of a double, which the
// library silently rounds to ±1.7976931348623157e308.

// canonDiffJSONv2 fails t when Canonicalize and the library disagree on in
// in any other way.
func canonDiffJSONv2(t testing.TB, in []byte) {
	t.Helper()
	got, err := Canonicalize(in)
	lib := append(jsontext.Value(nil), in...)
	libErr := lib.Canonicalize()
	switch {
	case err == nil && libErr != nil:
		t.Fatalf("json v2 refuses %q (%v), which Canonicalize accepts as %q", in, libErr, got)
	case err == nil && !bytes.Equal(got, lib):
		t.Fatalf("Canonicalize(%q)\n got %q\njson v2 %q", in, got, lib)
	case err != nil && libErr == nil && !canonTooDeep(in) && !canonOutOfRange(in):
		t.Fatalf("Canonicalize(%q) refuses what json v2 accepts as %q, for no reason of the kept ones: %v", in, lib, err)
	}
}

// canonTooDeep reports whether in nests deeper than canonMaxDepth (the
// library's limit is 10000, and this version offers no option to lower it).
func canonTooDeep(in []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(in))
	for {
		if _, err := dec.ReadToken(); err != nil {
			return false
		}
		if dec.StackDepth() > canonMaxDepth {
			return true
		}
	}
}

// canonOutOfRange reports whether in holds a number whose magnitude does not
// fit a double.
func canonOutOfRange(in []byte) bool {
	dec := jsontext.NewDecoder(bytes.NewReader(in))
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return false
		}
		if tok.Kind() != '0' {
			continue
		}
		if f, err := strconv.ParseFloat(tok.String(), 64); errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0) {
			return true
		}
	}
}

func TestCanonicalizeAgreesWithJSONv2(t *testing.T) {
	t.Parallel()
	for _, in := range canonDiffCases {
		canonDiffJSONv2(t, []byte(in))
	}
	// The kept rejections are reached, so the comparison proves them.
	for _, in := range []string{`{"a":1e400}`, `[-1e400]`, `1` + string(bytes.Repeat([]byte("0"), 400)),
		string(bytes.Repeat([]byte("["), canonMaxDepth+1)) + string(bytes.Repeat([]byte("]"), canonMaxDepth+1))} {
		if _, err := Canonicalize([]byte(in)); err == nil {
			t.Errorf("Canonicalize accepted %.40q", in)
		}
		if v := jsontext.Value(in).Clone(); v.Canonicalize() != nil {
			t.Errorf("json v2 refuses %.40q; the reason to keep Canonicalize is gone", in)
		}
	}
	r := rand.New(rand.NewPCG(11, 12))
	n := 5000
	if testing.Short() {
		n = 500
	}
	for range n {
		doc := canonRandomValue(r, nil, 0)
		canonDiffJSONv2(t, doc)
		for range 3 {
			canonDiffJSONv2(t, canonMutate(r, doc))
		}
	}
}

func FuzzCanonicalizeJSONv2(f *testing.F) {
	for _, in := range canonDiffCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		canonDiffJSONv2(t, in)
	})
}
