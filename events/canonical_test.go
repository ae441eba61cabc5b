package events

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"whitespace removed", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } } \n", `{"a":[1,2],"b":{}}`},
		{"keys sorted", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"number spelling normalised", `{"a":2,"b":1.0}`, `{"a":2,"b":1}`},
		{"scalars at top level", `"x"`, `"x"`},
		{"null", ` null `, `null`},
		{"true", `true`, `true`},
		{"false", `false`, `false`},
		{"empty object", `{}`, `{}`},
		{"empty array", `[]`, `[]`},
		{"nested", `{"z":[{"y":[],"x":{"b":null,"a":[true,false]}}],"a":{"c":{"b":1,"a":2}}}`,
			`{"a":{"c":{"a":2,"b":1}},"z":[{"x":{"a":[true,false],"b":null},"y":[]}]}`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"sorting is per level", `{"b":{"d":1,"c":2},"a":[{"f":1,"e":2}]}`, `{"a":[{"e":2,"f":1}],"b":{"c":2,"d":1}}`},
		{"prefix key sorts first", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{
			// RFC 8785 §3.2.3: UTF-16 code unit order. U+1F600 (D83D DE00)
			// sorts before U+FB33 here, though after it by code point/UTF-8.
			"RFC 8785 3.2.3 sort example",
			`{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\"," +
				"\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		{
			"supplementary key vs BMP private use",
			"{\"\uffff\":1,\"\U00010000\":2}",
			"{\"\U00010000\":2,\"\uffff\":1}",
		},
		{
			// RFC 8785 §3.2.4 / Appendix example.
			"RFC 8785 3.2.4 example",
			`{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{"short escapes", `"\b\t\n\f\r\"\\"`, `"\b\t\n\f\r\"\\"`},
		{"other controls lowercase hex", `"\u0000\u0001\u001F\u000B"`, `"\u0000\u0001\u001f\u000b"`},
		{"solidus unescaped", `"\/"`, `"/"`},
		{"html and separators not escaped", `"<>&\u2028\u2029\u007f"`, "\"<>&\u2028\u2029\u007f\""},
		{"non-ascii escapes decoded", `"\u00e9\u20AC"`, `"é€"`},
		{"surrogate pair escape decoded", `"\ud83d\ude00"`, `"😀"`},
		{"raw utf-8 kept", `"héllo 😀"`, `"héllo 😀"`},
		{"escaped backslash before u", `"\\ud800"`, `"\\ud800"`},
		{"key escaping", "{\"a\\nb\":1,\"\\u0001\":2}", `{"\u0001":2,"a\nb":1}`},
		{"negative zero", `-0`, `0`},
		{"negative zero float", `-0.0e5`, `0`},
		{"big integer exact", `9007199254740993`, `9007199254740992`},
		{"underflow to zero", `1e-400`, `0`},
		{"exponent normalised", `1E+2`, `100`},
		{"deep but allowed", strings.Repeat("[", canonMaxDepth) + strings.Repeat("]", canonMaxDepth),
			strings.Repeat("[", canonMaxDepth) + strings.Repeat("]", canonMaxDepth)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonicalize(%q): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonicalize(%q)\n got %s\nwant %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestCanonicalizeNumbers(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"1", "1"},
		{"-1", "-1"},
		{"1.0", "1"},
		{"4.50", "4.5"},
		{"2e-3", "0.002"},
		{"0.000001", "0.000001"},
		{"1e-6", "0.000001"},
		{"1e-7", "1e-7"},
		{"0.0000001", "1e-7"},
		{"1.5e-7", "1.5e-7"},
		{"-1e-7", "-1e-7"},
		{"123e-20", "1.23e-18"},
		{"1e21", "1e+21"},
		{"1e20", "100000000000000000000"},
		{"1e30", "1e+30"},
		{"1.5e300", "1.5e+300"},
		{"333333333.3333333", "333333333.3333333"},
		{"333333333.33333329", "333333333.3333333"},
		{"9007199254740992", "9007199254740992"},
		{"-9007199254740992", "-9007199254740992"},
		{"295147905179352830000", "295147905179352830000"},
		{"999999999999999999999", "1e+21"},
		{"0.1", "0.1"},
		{"100", "100"},
		{"123456.789", "123456.789"},
		{"5e-324", "5e-324"},
		{"1.7976931348623157e308", "1.7976931348623157e+308"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonicalize(%s): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonicalize(%s) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

// TestCanonicalNumberVectors checks the IEEE-754 test vectors of RFC 8785
// Appendix B against the ECMAScript formatter directly.
func TestCanonicalNumberVectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		bits uint64
		want string // "" means the value must be rejected
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x7fffffffffffffff, ""},
		{0x7ff0000000000000, ""},
		{0xfff0000000000000, ""},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tt := range tests {
		f := math.Float64frombits(tt.bits)
		got, ok := canonFormatFloat(f)
		if tt.want == "" {
			if ok {
				t.Errorf("%016x: formatted non-finite value as %q", tt.bits, got)
			}
			continue
		}
		if !ok || got != tt.want {
			t.Errorf("%016x: got %q (ok=%v), want %q", tt.bits, got, ok, tt.want)
			continue
		}
		// Parsing the expected text back must land on the same spelling.
		back, err := Canonicalize([]byte(tt.want))
		if err != nil || string(back) != tt.want {
			t.Errorf("Canonicalize(%s) = %s, %v", tt.want, back, err)
		}
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		msg  string // substring expected in the error
	}{
		{"empty", ``, "end of input"},
		{"only whitespace", "  \n", "end of input"},
		{"duplicate key", `{"x":1,"x":2}`, `duplicate object key "x"`},
		{"duplicate key after unescaping", `{"a":1,"\u0061":2}`, `duplicate object key "a"`},
		{"nested duplicate key", `[{"k":{"y":1,"z":2,"y":3}}]`, `duplicate object key "y"`},
		{"invalid utf-8 in string", "\"a\xffb\"", "UTF-8"},
		{"invalid utf-8 in key", "{\"\xc3\x28\":1}", "UTF-8"},
		{"encoded surrogate in utf-8", "\"\xed\xa0\x80\"", "UTF-8"},
		{"lone high surrogate", `"\ud800"`, "surrogate"},
		{"lone high surrogate then text", `"\ud800abcdef"`, "surrogate"},
		{"lone low surrogate", `"\udc00"`, "surrogate"},
		{"reversed surrogates", `"\ude00\ud83d"`, "surrogate"},
		{"two high surrogates", `"\ud83d\ud83d"`, "surrogate"},
		{"trailing garbage", `{"a":1} x`, "trailing data"},
		{"trailing second value", `{"a":1}{"b":2}`, "trailing data"},
		{"trailing number", `1 2`, "trailing data"},
		{"trailing comma", `[1,]`, ""},
		{"too deep arrays", strings.Repeat("[", canonMaxDepth+1) + strings.Repeat("]", canonMaxDepth+1), "nesting"},
		{"too deep objects", strings.Repeat(`{"a":`, canonMaxDepth+1) + "1" + strings.Repeat("}", canonMaxDepth+1), "nesting"},
		{"very deep", strings.Repeat("[", 100000), "nesting"},
		{"NaN", `NaN`, ""},
		{"Infinity", `Infinity`, ""},
		{"negative Infinity", `-Infinity`, ""},
		{"NaN in object", `{"a":NaN}`, ""},
		{"overflow", `1e400`, "out of range"},
		{"negative overflow", `[-1e309]`, "out of range"},
		{"hex number", `0x10`, ""},
		{"leading zero", `01`, ""},
		{"leading plus", `+1`, ""},
		{"unterminated", `{"a":1`, ""},
		{"unquoted key", `{a:1}`, ""},
		{"single quotes", `'a'`, ""},
		{"raw control char", "\"a\nb\"", ""},
		{"bad escape", `"\x"`, ""},
		{"comment", `{"a":1 /* c */}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.in))
			if err == nil {
				t.Fatalf("Canonicalize(%q) = %s, want error", tt.in, got)
			}
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q) error %v does not wrap ErrInvalidJSON", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Canonicalize(%q) error %q, want it to mention %q", tt.in, err, tt.msg)
			}
		})
	}
}

func TestPayloadHash(t *testing.T) {
	t.Parallel()
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	equal := [][]string{
		{`{"b":1,"a":2}`, `{"a":2,"b":1.0}`, "{ \"a\" : 2e0 ,\n \"b\" : 10E-1 }", `{"\u0061":2,"b":1}`},
		{``, `{}`, ` { } `},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
		{`[0]`, `[-0]`, `[0.0e10]`},
	}
	for _, group := range equal {
		want, err := PayloadHash([]byte(group[0]))
		if err != nil {
			t.Fatalf("PayloadHash(%q): %v", group[0], err)
		}
		for _, in := range group[1:] {
			got, err := PayloadHash([]byte(in))
			if err != nil {
				t.Fatalf("PayloadHash(%q): %v", in, err)
			}
			if got != want {
				t.Errorf("PayloadHash(%q) = %s, want %s (same as %q)", in, got, want, group[0])
			}
		}
	}

	// The hash is of the canonical bytes, so anyone with a JCS library and
	// sha256 can reproduce it.
	got, err := PayloadHash([]byte(`{"b":1,"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := sum(`{"a":2,"b":1}`); got != want {
		t.Errorf("PayloadHash = %s, want sha256 of canonical bytes %s", got, want)
	}
	if got, _ := PayloadHash(nil); got != sum(`{}`) {
		t.Errorf("PayloadHash(nil) = %s, want sha256(\"{}\")", got)
	}

	distinct := []string{`{"a":1}`, `{"a":"1"}`, `{"a":[1]}`, `{"A":1}`, `[]`, `null`, `{"a":1,"b":null}`}
	seen := map[string]string{}
	for _, in := range distinct {
		h, err := PayloadHash([]byte(in))
		if err != nil {
			t.Fatalf("PayloadHash(%q): %v", in, err)
		}
		if prev, dup := seen[h]; dup {
			t.Errorf("PayloadHash(%q) collides with %q", in, prev)
		}
		seen[h] = in
	}

	for _, bad := range []string{`{"x":1,"x":1}`, `{"a":1} trailing`, "\"\xff\"", " "} {
		h, err := PayloadHash([]byte(bad))
		if !errors.Is(err, ErrInvalidJSON) || h != "" {
			t.Errorf("PayloadHash(%q) = %q, %v; want \"\", ErrInvalidJSON", bad, h, err)
		}
	}
}
