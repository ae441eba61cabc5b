package tool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// Redacted replaces the value of a sensitive field.
const Redacted = "[redacted]"

// sensitiveName matches argument names that hold secrets whatever the
// schema says. It matches anywhere in the name (client_secret,
// access_token), because over-redacting evidence costs a human a glance and
// under-redacting leaks a credential into the approval UI and the logs.
var sensitiveName = regexp.MustCompile(`(?i)` + strings.Join(sensitiveWords, "|"))

// sensitiveWords are what sensitiveName matches, lower case.
var sensitiveWords = []string{"password", "secret", "token", "card_number", "cvc", "cvv", "api_key"}

// Redact returns args with the values of sensitive fields replaced by
// "[redacted]", for the approval gate's evidence and for anything else a
// human reads (contract §4, §8). A field is sensitive when its schema says
// "writeOnly": true or "x-sensitive": true, or when its name looks like a
// secret (password, secret, token, card_number, cvc, cvv, api_key), at any depth.
// Args that are not JSON are replaced whole: what cannot be parsed cannot be
// checked.
func (s *Spec) Redact(args json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(args)) == 0 || s.nothingToRedact(args) {
		return args
	}
	return s.redactDecoded(args)
}

// redactDecoded is Redact on the decoded document.
func (s *Spec) redactDecoded(args json.RawMessage) json.RawMessage {
	v, err := decodeJSON(args)
	if err != nil {
		return json.RawMessage(`"` + Redacted + `"`)
	}
	changed := false
	red := redactValue(v, s.argsDoc(), &changed)
	return unlessUnchanged(args, red, changed)
}

// nothingToRedact reports, without decoding doc, that Redact would return
// it unchanged: it is valid JSON, the args schema marks no field (no
// writeOnly, no x-sensitive anywhere in it), and no secret-looking name
// appears anywhere in its text, so none of its members can have one. Most
// args and results have nothing to hide, and decoding each into a tree
// to find that out was most of what redaction cost (the executor scrubs
// every result, the API every answer). A \u escape could spell a name the
// text does not show, so a document or schema with one is decoded.
// FuzzNothingToRedact checks it against decoding.
func (s *Spec) nothingToRedact(doc []byte) bool {
	return !bytes.Contains(s.ArgsSchema, []byte("writeOnly")) &&
		!bytes.Contains(s.ArgsSchema, []byte("x-sensitive")) &&
		!bytes.Contains(s.ArgsSchema, []byte(`\u`)) &&
		!bytes.Contains(doc, []byte(`\u`)) &&
		!mentionsSensitiveWord(doc) &&
		json.Valid(doc)
}

// mentionsSensitiveWord reports whether doc may hold a name sensitiveName
// matches: one of sensitiveWords in any ASCII case, or any byte outside
// ASCII (sensitiveName folds case the Unicode way, so "ſecret" matches;
// those documents are decoded). It is sensitiveName.Match at a tenth of
// the cost.
func mentionsSensitiveWord(doc []byte) bool {
	for i, c := range doc {
		if c >= utf8.RuneSelf {
			return true
		}
		for _, w := range sensitiveWords {
			if len(doc)-i >= len(w) && lower(c) == w[0] && asciiEqualFold(doc[i:i+len(w)], w) {
				return true
			}
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// asciiEqualFold reports whether b, ASCII, is w (lower case) in any case.
func asciiEqualFold(b []byte, w string) bool {
	for i := range len(w) {
		if lower(b[i]) != w[i] {
			return false
		}
	}
	return true
}

// decodeJSON decodes one JSON value, numbers kept as written.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// argsDoc is the args schema as a decoded document: the one decoded when
// the spec was compiled, else ArgsSchema decoded now (a broken schema
// only loses the schema's marks).
func (s *Spec) argsDoc() any {
	if s.schemaDoc != nil || len(s.ArgsSchema) == 0 {
		return s.schemaDoc
	}
	doc, _ := decodeJSON(s.ArgsSchema)
	return doc
}

// unlessUnchanged returns orig when redaction changed nothing in it, and
// red, the redacted decoding, encoded otherwise. A stored result that had
// nothing to hide keeps its bytes (its member order, its spelling of
// numbers), so the redaction of every read path does not alter what a
// client may compare or verify, and costs no second encoding.
func unlessUnchanged(orig []byte, red any, changed bool) json.RawMessage {
	if !changed {
		return json.RawMessage(orig)
	}
	return encodeRedacted(red)
}

// encodeRedacted encodes a redacted value without HTML escaping (the
// value is shown as it was), or "[redacted]" whole if it cannot be.
func encodeRedacted(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage(`"` + Redacted + `"`)
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n"))
}

func redactValue(v any, schema any, changed *bool) any {
	sch, _ := schema.(map[string]any)
	switch t := v.(type) {
	case map[string]any:
		props, _ := sch["properties"].(map[string]any)
		for k, val := range t {
			sub := props[k]
			if sensitiveName.MatchString(k) || markedSensitive(sub) {
				if val != Redacted {
					t[k], *changed = Redacted, true
				}
				continue
			}
			t[k] = redactValue(val, sub, changed)
		}
		return t
	case []any:
		items := sch["items"]
		for i, e := range t {
			t[i] = redactValue(e, items, changed)
		}
		return t
	}
	return v
}

// markedSensitive reports whether a property's schema marks it as secret.
func markedSensitive(schema any) bool {
	sch, ok := schema.(map[string]any)
	if !ok {
		return false
	}
	for _, kw := range []string{"writeOnly", "x-sensitive"} {
		if b, ok := sch[kw].(bool); ok && b {
			return true
		}
		if s, ok := sch[kw].(string); ok && strings.EqualFold(s, "true") {
			return true
		}
	}
	return false
}

// anonymous redacts by field name only: the Spec of a tool that is not
// registered (any more), whose schema's marks are unknown.
var anonymous = &Spec{}

// Scrub is effectline's one redaction: it returns v, a JSON document that
// leaves the event store for a reader (the args themselves, a tool's result,
// escalation evidence), with the values of sensitive fields replaced by
// "[redacted]" and every sensitive value of args replaced wherever v echoes
// it. Scrub(spec, args, args) is the args as they may be shown. spec may be
// nil for a tool that is not registered: then only names mark a field
// sensitive. It is idempotent, so a value scrubbed when it was journaled
// and again when it is served comes out the same.
//
// A field is sensitive when its name looks like a secret (password,
// secret, token, card_number, cvc, cvv, api_key, anywhere in the name and at any
// depth) or when the tool's args_schema marks its property "writeOnly": true
// or "x-sensitive": true.
func Scrub(spec *Spec, args, v json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(v)) == 0 {
		return v
	}
	if spec == nil {
		spec = anonymous
	}
	return spec.RedactEcho(args, v)
}

// minEchoLen is the shortest sensitive value RedactEcho looks for: shorter
// ones ("1", "EUR") would redact innocent values that merely look alike.
const minEchoLen = 4

// RedactEcho returns body, a downstream's answer about an effect (its
// record of a charge, a reservation), as Redact would return args, and with
// the values of args' sensitive fields replaced wherever they appear in it.
// A downstream's record often echoes the request that made it, under names
// of its own ("source": {"number": ...}) or nested where the args schema
// does not reach, which neither the names nor the schema's marks catch;
// the values themselves do. A string that contains a sensitive value has
// that part replaced. Bodies that are not JSON are replaced whole.
func (s *Spec) RedactEcho(args, body json.RawMessage) json.RawMessage {
	red := s.Redact(body)
	values := s.sensitiveValues(args)
	if len(values) == 0 || len(bytes.TrimSpace(red)) == 0 {
		return red
	}
	v, err := decodeJSON(red)
	if err != nil {
		return json.RawMessage(`"` + Redacted + `"`)
	}
	changed := false
	out := replaceValues(v, values, &changed)
	return unlessUnchanged(red, out, changed)
}

// sensitiveValues returns the string and number values (as written) under
// the sensitive fields of args, longest first, so a value that contains
// another is replaced whole.
func (s *Spec) sensitiveValues(args json.RawMessage) []string {
	if len(bytes.TrimSpace(args)) == 0 || s.nothingToRedact(args) {
		return nil
	}
	return s.sensitiveValuesDecoded(args)
}

// sensitiveValuesDecoded is sensitiveValues on the decoded document.
func (s *Spec) sensitiveValuesDecoded(args json.RawMessage) []string {
	v, err := decodeJSON(args)
	if err != nil {
		return nil
	}
	doc := s.argsDoc()
	seen := map[string]bool{}
	var out []string
	var collect func(v, schema any, sensitive bool)
	collect = func(v, schema any, sensitive bool) {
		sch, _ := schema.(map[string]any)
		switch t := v.(type) {
		case map[string]any:
			props, _ := sch["properties"].(map[string]any)
			for k, val := range t {
				sub := props[k]
				collect(val, sub, sensitive || sensitiveName.MatchString(k) || markedSensitive(sub))
			}
		case []any:
			for _, e := range t {
				collect(e, sch["items"], sensitive)
			}
		case string, json.Number:
			str := fmt.Sprint(t)
			if sensitive && len(str) >= minEchoLen && !seen[str] {
				seen[str] = true
				out = append(out, str)
			}
		}
	}
	collect(v, doc, false)
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// replaceValues replaces, in a decoded JSON document, every string or
// number equal to one of values, and every occurrence of one inside a
// string (object keys included).
func replaceValues(v any, values []string, changed *bool) any {
	scrub := func(s string) string {
		for _, val := range values {
			if s == val {
				*changed = true
				return Redacted
			}
			if strings.Contains(s, val) {
				s, *changed = strings.ReplaceAll(s, val, Redacted), true
			}
		}
		return s
	}
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, val := range t {
			out[scrub(k)] = replaceValues(val, values, changed)
		}
		return out
	case []any:
		for i, e := range t {
			t[i] = replaceValues(e, values, changed)
		}
		return t
	case string:
		return scrub(t)
	case json.Number:
		before := *changed
		*changed = false
		s := scrub(t.String())
		hit := *changed
		*changed = before || hit
		if hit {
			return s
		}
		return t
	}
	return v
}
