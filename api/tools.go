package api

import (
	"encoding/json"

	"github.com/effectline/effectline/tool"
)

// Tools looks registered tools up by name; *tool.Registry is one. The API
// checks an intent with the tool's own spec (authorization, args schema)
// and redacts args with the spec's redaction, so intake checks exactly what
// the executor checks again at execution time.
type Tools interface {
	Get(name string) (tool.Tool, bool)
}

// redactedWhole stands for args that cannot be redacted field by field
// because their tool is no longer registered: without its schema nothing
// says which fields are secret, so none are shown.
var redactedWhole = json.RawMessage(`"[redacted]"`)

// redactArgs returns args as they may leave in a response.
func redactArgs(t tool.Tool, args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return nil
	}
	if t == nil || t.Spec() == nil {
		return redactedWhole
	}
	return t.Spec().Redact(args)
}
