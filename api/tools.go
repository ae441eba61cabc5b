package api

import (
	"github.com/effectline/effectline/tool"
)

// Tools looks registered tools up by name; *tool.Registry is one. The API
// checks an intent with the tool's own spec (authorization, args schema)
// and redacts what it shows with the spec's redaction (api/redact.go), so
// intake checks exactly what the executor checks again at execution time.
type Tools interface {
	Get(name string) (tool.Tool, bool)
}
