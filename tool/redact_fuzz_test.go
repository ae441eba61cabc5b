package tool

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzSpec marks fields sensitive all three ways: by name (anywhere), by
// writeOnly (cvv, payer.iban) and by x-sensitive (pin).
var fuzzSpec = &Spec{Name: "payments.charge", ArgsSchema: json.RawMessage(`{"type":"object","properties":{
	"cvv":{"type":"string","writeOnly":true},
	"pin":{"x-sensitive":true},
	"payer":{"type":"object","properties":{"iban":{"type":"string","writeOnly":true}}}}}`)}

// FuzzRedact builds args with sensitive values nested anywhere and a result
// that echoes them anywhere (under other names, inside longer strings, as
// object keys), and checks that no sensitive value comes out of Scrub,
// neither from the args nor from the result.
func FuzzRedact(f *testing.F) {
	f.Add("4111111111111111", "hunter22", "sk_live_abc", int64(1))
	f.Add("1234", "DE89370400440532013000", "a\"b\\c", int64(7))
	f.Add("[redacted]x", "ééééé", "0042", int64(-3))
	f.Fuzz(func(t *testing.T, v1, v2, v3 string, seed int64) {
		values := []string{v1, v2, v3}
		for _, v := range values {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				return
			}
		}
		rnd := rand.New(rand.NewPCG(uint64(seed), 0))
		g := &gen{rnd: rnd}
		args := map[string]any{"amount": 100, "currency": "EUR"}
		// Each value goes under a sensitive field: a secret-looking name at
		// a random depth, or a field the schema marks.
		for i, v := range values {
			var val any = v
			if isDigits(v) && len(v) < 16 && rnd.IntN(2) == 0 {
				val = json.Number(strings.TrimLeft(v, "0") + "0")
			}
			g.sensitive = append(g.sensitive, fmtValue(val))
			marked := []string{"cvv", "payer", "pin"}[rnd.IntN(3)]
			switch _, taken := args[marked]; {
			case rnd.IntN(2) == 0 || taken:
				g.nest(args, secretNames[rnd.IntN(len(secretNames))]+string(rune('0'+i)), val)
			case marked == "payer":
				args["payer"] = map[string]any{"iban": val, "name": "A. Payer"}
			default:
				args[marked] = val
			}
		}
		rawArgs, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		// The result echoes every sensitive value somewhere.
		result := map[string]any{"id": "ch_1", "status": "succeeded"}
		for i, v := range g.sensitive {
			suffix := string(rune('0' + i))
			switch rnd.IntN(4) {
			case 0:
				g.nest(result, "source"+suffix, v)
			case 1:
				g.nest(result, "note"+suffix, "charged "+v+" today")
			case 2:
				g.nest(result, "echo"+suffix, map[string]any{v: true})
			default:
				g.nest(result, "list"+suffix, []any{"x", v})
			}
		}
		rawResult, err := json.Marshal(result)
		if err != nil {
			t.Fatal(err)
		}
		for name, out := range map[string]json.RawMessage{
			"args":                           Scrub(fuzzSpec, rawArgs, rawArgs),
			"result":                         Scrub(fuzzSpec, rawArgs, rawResult),
			"result of an unregistered tool": Scrub(nil, rawArgs, rawResult),
		} {
			if name == "result of an unregistered tool" {
				// Without the schema only names tell; what the schema marks
				// is not known to be sensitive.
				continue
			}
			for _, s := range g.sensitive {
				if leaked(out, s) {
					t.Fatalf("%s: sensitive value %q comes out of Scrub:\nargs   %s\nresult %s\nout    %s",
						name, s, rawArgs, rawResult, out)
				}
			}
			if again := Scrub(fuzzSpec, rawArgs, out); string(again) != string(out) {
				t.Fatalf("%s: Scrub is not idempotent:\n%s\n%s", name, out, again)
			}
		}
	})
}

var secretNames = []string{"password", "client_secret", "access_token", "card_number", "CVC", "x_api_key"}

type gen struct {
	rnd       *rand.Rand
	sensitive []string
	n         int // names nested objects apart
}

// nest puts v under name in m, at a random depth of objects and arrays.
func (g *gen) nest(m map[string]any, name string, v any) {
	for g.rnd.IntN(3) == 0 {
		inner := map[string]any{}
		g.n++
		if g.rnd.IntN(2) == 0 {
			m[fmt.Sprintf("n%d", g.n)] = []any{inner}
		} else {
			m[fmt.Sprintf("o%d", g.n)] = inner
		}
		m = inner
	}
	m[name] = v
}

func fmtValue(v any) string {
	if n, ok := v.(json.Number); ok {
		return n.String()
	}
	return v.(string)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// leaked reports whether s appears in a string or number of out, ignoring
// occurrences that only exist by touching a "[redacted]" marker. Values
// shorter than minEchoLen are not looked for outside their own sensitive
// field (by design: "EUR" would redact innocent text), and their field is
// redacted by name or schema, which the longer values check as well.
func leaked(out json.RawMessage, s string) bool {
	if len(s) < minEchoLen || strings.Contains(Redacted, s) {
		return false
	}
	var doc any
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return true // not JSON: cannot be checked, so it fails
	}
	found := false
	var walk func(v any)
	check := func(str string) {
		if strings.Contains(strings.ReplaceAll(str, Redacted, "\x00"), s) {
			found = true
		}
	}
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, e := range t {
				check(k)
				walk(e)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		case string:
			check(t)
		case json.Number:
			check(t.String())
		}
	}
	walk(doc)
	return found
}

// FuzzNothingToRedact: whatever nothingToRedact lets Redact return without
// decoding is what decoding would have returned (unchanged), and has no
// sensitive value an echo could repeat, for a spec that marks nothing and
// for one whose schema spells no mark.
func FuzzNothingToRedact(f *testing.F) {
	for _, doc := range []string{
		`{"amount":1,"currency":"EUR"}`, `{"Password":"x"}`, `{"pass\u0077ord":"hunter22"}`,
		`[{"api_key":"k"}]`, `{"a":{"b":[1,"CVV"]}}`, `{not json`, `"tok"`, `{"id":"ch_1","status":"ok"}`,
	} {
		f.Add(doc, `{"type":"object"}`)
		f.Add(doc, `{"properties":{"pin":{"x-sensitive":true}}}`)
	}
	f.Fuzz(func(t *testing.T, doc, schema string) {
		s := &Spec{Name: "x", ArgsSchema: json.RawMessage(schema)}
		if !s.nothingToRedact([]byte(doc)) {
			return
		}
		if got := s.redactDecoded(json.RawMessage(doc)); string(got) != doc {
			t.Fatalf("nothingToRedact(%q) under %q, but decoding redacts it to %s", doc, schema, got)
		}
		if vals := s.sensitiveValuesDecoded(json.RawMessage(doc)); len(vals) != 0 {
			t.Fatalf("nothingToRedact(%q) under %q, but decoding finds sensitive values %q", doc, schema, vals)
		}
	})
}

// FuzzMentionsSensitiveWord: wherever sensitiveName matches, so does
// mentionsSensitiveWord (it may say yes more often, never less).
func FuzzMentionsSensitiveWord(f *testing.F) {
	for _, s := range []string{`{"Password":1}`, `{"ſecret":1}`, `{"amount":1}`, `TOKEN`, `api-key`, `cv`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		if sensitiveName.MatchString(doc) && !mentionsSensitiveWord([]byte(doc)) {
			t.Fatalf("sensitiveName matches %q, mentionsSensitiveWord does not", doc)
		}
	})
}
