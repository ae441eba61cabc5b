package api

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Tool is what the API needs of a registered tool: its effect class for the
// intent it journals, the intake checks, and the redaction of its args for
// responses.
type Tool interface {
	EffectClass() events.EffectClass
	// Authorize returns an error when principal may not use the tool.
	Authorize(principal string) error
	// ValidateArgs checks args against the tool's schema. Invalid args are
	// reported as (or wrapping) an *ArgsError; any other error is the
	// server's fault.
	ValidateArgs(args json.RawMessage) error
	// Redact returns v (the args themselves, a result, evidence) with the
	// values of sensitive fields replaced, and the sensitive values of args
	// replaced wherever v echoes them (tool.Scrub).
	Redact(args, v json.RawMessage) json.RawMessage
}

// Tools looks tools up by name.
type Tools interface {
	Get(name string) (Tool, bool)
}

// ArgsError says which argument a tool rejected and why. Field is a JSON
// pointer into the args ("/amount"), empty for the args as a whole.
type ArgsError struct {
	Field  string
	Reason string
	Err    error
}

func (e *ArgsError) Error() string {
	field := e.Field
	if field == "" {
		field = "args"
	}
	return fmt.Sprintf("invalid args: %s: %s", field, e.Reason)
}

func (e *ArgsError) Unwrap() error { return e.Err }

// ToolsFunc adapts a function to Tools.
type ToolsFunc func(name string) (Tool, bool)

// Get implements Tools.
func (f ToolsFunc) Get(name string) (Tool, bool) { return f(name) }

// Registry is what RegistryTools needs of the tool registry (*tool.Registry).
type Registry interface {
	Get(name string) (tool.Tool, bool)
}

// RegistryTools adapts the tool registry to Tools: the specs' own
// authorization, schema validation and redaction, so intake checks exactly
// what the executor checks again at execution time.
func RegistryTools(r Registry) Tools {
	return ToolsFunc(func(name string) (Tool, bool) {
		t, ok := r.Get(name)
		if !ok || t == nil || t.Spec() == nil {
			return nil, false
		}
		return specTool{t.Spec()}, true
	})
}

type specTool struct{ spec *tool.Spec }

func (t specTool) EffectClass() events.EffectClass { return t.spec.Effect }

func (t specTool) Authorize(principal string) error { return t.spec.Authorize(principal) }

func (t specTool) Redact(args, v json.RawMessage) json.RawMessage { return tool.Scrub(t.spec, args, v) }

func (t specTool) ValidateArgs(args json.RawMessage) error {
	err := t.spec.ValidateArgs(args)
	var ae *tool.ArgsError
	if errors.As(err, &ae) {
		return &ArgsError{Field: ae.Field, Reason: ae.Reason, Err: err}
	}
	return err
}
