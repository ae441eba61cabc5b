package tool

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// Redacted replaces the value of a sensitive field.
const Redacted = "[redacted]"

// sensitiveName matches argument names that hold secrets whatever the
// schema says. It matches anywhere in the name (client_secret,
// access_token), because over-redacting evidence costs a human a glance and
// under-redacting leaks a credential into the approval UI and the logs.
var sensitiveName = regexp.MustCompile(`(?i)password|secret|token|card_number|cvc|api_key`)

// Redact returns args with the values of sensitive fields replaced by
// "[redacted]", for the approval gate's evidence and for anything else a
// human reads (DESIGN §4, §8). A field is sensitive when its schema says
// "writeOnly": true or "x-sensitive": true, or when its name looks like a
// secret (password, secret, token, card_number, cvc, api_key), at any depth.
// Args that are not JSON are replaced whole: what cannot be parsed cannot be
// checked.
func (s *Spec) Redact(args json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(args)) == 0 {
		return args
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return json.RawMessage(`"` + Redacted + `"`)
	}
	doc := s.schemaDoc
	if doc == nil && len(s.ArgsSchema) > 0 {
		sd := json.NewDecoder(bytes.NewReader(s.ArgsSchema))
		sd.UseNumber()
		_ = sd.Decode(&doc) // a broken schema only loses the schema's marks
	}
	v = redactValue(v, doc)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage(`"` + Redacted + `"`)
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n"))
}

func redactValue(v any, schema any) any {
	sch, _ := schema.(map[string]any)
	switch t := v.(type) {
	case map[string]any:
		props, _ := sch["properties"].(map[string]any)
		for k, val := range t {
			sub := props[k]
			if sensitiveName.MatchString(k) || markedSensitive(sub) {
				t[k] = Redacted
				continue
			}
			t[k] = redactValue(val, sub)
		}
		return t
	case []any:
		items := sch["items"]
		for i, e := range t {
			t[i] = redactValue(e, items)
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
