package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"
)

func FuzzCanonicalize(f *testing.F) {
	seeds := []string{
		``,
		`{}`,
		`[]`,
		`null`,
		`true`,
		`0`,
		`-0`,
		`1e21`,
		`1e-7`,
		`4.50`,
		`333333333.33333329`,
		`9007199254740993`,
		`1e400`,
		`1e-400`,
		`{"b":1,"a":2}`,
		`{"a":2,"b":1.0}`,
		`{"x":1,"x":2}`,
		`{"a":1,"\u0061":2}`,
		`{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}`,
		`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`,
		`"<>&\u2028\u2029\u007f"`,
		`"\b\t\n\f\r\u0000\u001f"`,
		`"\ud800"`,
		`"\\ud800"`,
		"\"\xff\"",
		`{"a":[{"b":{"c":[1,2,{"d":null}]}}]}`,
		`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`,
		`{"a":1} x`,
		`NaN`,
		` { "k" : [ 1 , "v" , false ] } `,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q): error %v does not wrap ErrInvalidJSON", in, err)
			}
			return
		}
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q: not valid JSON", in, out)
		}

		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("Canonicalize(%q) (canonical form of %q): %v", out, in, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent for %q:\n first %q\nsecond %q", in, out, again)
		}

		if !json.Valid(in) {
			t.Fatalf("Canonicalize accepted %q, which encoding/json rejects", in)
		}
		want, err := canonFuzzDecode(in)
		if err != nil {
			t.Fatalf("decoding input %q: %v", in, err)
		}
		got, err := canonFuzzDecode(out)
		if err != nil {
			t.Fatalf("decoding output %q: %v", out, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("value changed by canonicalization:\n in %q -> %#v\nout %q -> %#v", in, want, out, got)
		}
	})
}

// canonFuzzDecode decodes data with encoding/json and replaces every number
// with its float64 value, so two documents compare equal exactly when they
// denote the same JSON value under IEEE-754 (where -0 and 0 are equal).
func canonFuzzDecode(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return canonFuzzNormalize(v)
}

func canonFuzzNormalize(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return nil, err
		}
		if f == 0 {
			f = 0 // fold -0 so DeepEqual treats it like 0
		}
		return f, nil
	case []any:
		for i, e := range t {
			n, err := canonFuzzNormalize(e)
			if err != nil {
				return nil, err
			}
			t[i] = n
		}
	case map[string]any:
		for k, e := range t {
			n, err := canonFuzzNormalize(e)
			if err != nil {
				return nil, err
			}
			t[k] = n
		}
	}
	return v, nil
}
