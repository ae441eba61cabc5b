package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/policy"
)

// DefaultIdempotencyHeader carries the downstream key (contract §5).
const DefaultIdempotencyHeader = "Idempotency-Key"

// Spec is what the executor needs to know about a tool, whichever way it is
// implemented: its effect class (which decides what happens after an
// unknown outcome), its retry caps, who may use it, and what its arguments
// look like.
type Spec struct {
	Name string
	// Description tells a model what the tool does (the MCP catalogue).
	Description string
	Effect      events.EffectClass
	// Caps bound automatic retries; zero fields take policy's defaults.
	Caps             policy.Caps
	RequiresApproval bool
	// Approval is the approval gate in full (when, approvers,
	// not_requester); nil with RequiresApproval set is the simple form.
	Approval *Approval
	// AllowedPrincipals may use the tool; empty means any authenticated
	// principal.
	AllowedPrincipals []string
	// IdempotencyHeader carries the downstream key; "" means
	// Idempotency-Key.
	IdempotencyHeader string
	// CanReconcile and CanCompensate say whether the tool answers "did it
	// happen?" and can undo an attempt.
	CanReconcile  bool
	CanCompensate bool
	// Timeout bounds one invocation; the executor keeps its lease longer
	// than this. Zero means the tool sets no bound of its own.
	Timeout time.Duration
	// ArgsSchema is the JSON Schema the args must match; empty accepts any
	// JSON object.
	ArgsSchema json.RawMessage
	// DedupWindow is how long a settled operation of this tool keeps its
	// events and record before it is pruned to a tombstone. Zero means the
	// deployment's default (EFFECTLINE_RETENTION).
	DedupWindow time.Duration
	// Internal marks a tool effectline generated for its own operations
	// (a workflow step's undo, "<tool>~undo"). It runs like any tool, but
	// it is not offered to models: MCP tools/list leaves it out, so no
	// model can call an undo directly.
	Internal bool

	// schema and schemaDoc are ArgsSchema compiled and decoded, set by
	// Prepare so that validation does not recompile per call.
	schema    *jsonschema.Schema
	schemaDoc any
	// pathArgs are the args the tool's URL templates print in a path (see
	// checkPathArgs), set by the tools file's parser.
	pathArgs [][]string
}

// Prepare checks the spec and compiles its ArgsSchema. Registry.Register and
// NewGoTool call it; a Spec is prepared once, at wiring, before it is
// shared between goroutines.
func (s *Spec) Prepare() error {
	if s.Name == "" {
		return errors.New("tool spec: name is required")
	}
	if !s.Effect.Valid() {
		return fmt.Errorf("tool %q: effect: unknown effect class %q (want idempotent, compensable or irreversible)", s.Name, s.Effect)
	}
	if err := s.Caps.WithDefaults().Validate(); err != nil {
		return fmt.Errorf("tool %q: retry: %w", s.Name, err)
	}
	if s.IdempotencyHeader == "" {
		s.IdempotencyHeader = DefaultIdempotencyHeader
	}
	if s.Timeout < 0 {
		return fmt.Errorf("tool %q: timeout must not be negative", s.Name)
	}
	if s.Approval != nil {
		if err := s.Approval.prepare(); err != nil {
			return fmt.Errorf("tool %q: %w", s.Name, err)
		}
	}
	if s.DedupWindow < 0 {
		return fmt.Errorf("tool %q: dedup_window must not be negative", s.Name)
	}
	if len(s.ArgsSchema) == 0 {
		s.schema, s.schemaDoc = nil, nil
		return nil
	}
	sch, doc, err := compileSchema(s.ArgsSchema)
	if err != nil {
		return fmt.Errorf("tool %q: args_schema: %w", s.Name, err)
	}
	s.schema, s.schemaDoc = sch, doc
	return nil
}

// Authorize checks, at execution time as well as at intake, that principal
// may use the tool: a principal removed from allowed_principals after the
// intent was recorded must not get the effect anyway.
func (s *Spec) Authorize(principal string) error {
	if len(s.AllowedPrincipals) == 0 {
		return nil
	}
	if principal != "" && slices.Contains(s.AllowedPrincipals, principal) {
		return nil
	}
	return &ForbiddenError{Tool: s.Name, Principal: principal}
}

// ValidateArgs checks args against the tool's args_schema. Args must be a
// JSON object (absent args count as {}). The error is an *ArgsError naming
// the first failing field as a JSON pointer, so a caller (often a model)
// learns what to fix.
func (s *Spec) ValidateArgs(args json.RawMessage) error {
	args = bytes.TrimSpace(args)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if field, err := checkPathArgs(s.pathArgs, args); err != nil {
		return &ArgsError{Tool: s.Name, Field: field, Reason: err.Error()}
	}
	if s.schema == nil && len(s.ArgsSchema) == 0 && json.Valid(args) {
		// No schema: only the shape is checked, without building the tree
		// a schema would walk (this runs again for every attempt).
		if args[0] != '{' {
			return &ArgsError{Tool: s.Name, Reason: "must be a JSON object"}
		}
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return &ArgsError{Tool: s.Name, Reason: "not valid JSON: " + err.Error()}
	}
	if _, ok := inst.(map[string]any); !ok {
		return &ArgsError{Tool: s.Name, Reason: "must be a JSON object"}
	}
	sch := s.schema
	if sch == nil && len(s.ArgsSchema) > 0 {
		// Not prepared: compile for this call only, rather than cache
		// without a lock.
		if sch, _, err = compileSchema(s.ArgsSchema); err != nil {
			return fmt.Errorf("tool %q: args_schema: %w", s.Name, err)
		}
	}
	if sch == nil {
		return nil
	}
	if err := sch.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return &ArgsError{Tool: s.Name, Reason: err.Error()}
		}
		field, reason := describeValidation(ve)
		return &ArgsError{Tool: s.Name, Field: field, Reason: reason}
	}
	return nil
}

// CheckSchema reports whether raw compiles as an args_schema, with the
// same rules [Spec.Prepare] applies (no $ref leaves the document).
func CheckSchema(raw json.RawMessage) error {
	_, _, err := compileSchema(raw)
	return err
}

// schemaURL names the one resource each args_schema compiler holds.
const schemaURL = "urn:effectline:args_schema"

// compileSchema compiles a JSON Schema from memory. Its loader refuses every
// URL, so a $ref can neither read local files nor reach the network when
// the tools file is loaded.
func compileSchema(raw json.RawMessage) (*jsonschema.Schema, any, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, nil, errors.New("must be a JSON Schema object")
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, nil, err
	}
	return sch, doc, nil
}

type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("loading %s: external schema references are not allowed", url)
}

var printer = message.NewPrinter(language.English)

// describeValidation names the failing field and why. Of all the leaves of
// the error tree (the most specific complaints) it reports the one with the
// smallest JSON pointer: the validator walks properties in map order, and
// the same args must always get the same answer.
func describeValidation(ve *jsonschema.ValidationError) (field, reason string) {
	var leaves []*jsonschema.ValidationError
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	best := ""
	for i, l := range leaves {
		f := leafField(l)
		if i == 0 || f < best {
			best, reason = f, l.ErrorKind.LocalizedString(printer)
		}
	}
	return best, reason
}

// leafField is the JSON pointer of the field a caller must fix. Required and
// additionalProperties are reported on the object; the field is the missing
// or extra member.
func leafField(ve *jsonschema.ValidationError) string {
	loc := ve.InstanceLocation
	var member []string
	switch k := ve.ErrorKind.(type) {
	case *kind.Required:
		member = k.Missing
	case *kind.AdditionalProperties:
		member = k.Properties
	case *kind.DependentRequired:
		member = k.Missing
	}
	if len(member) > 0 {
		loc = append(slices.Clone(loc), slices.Min(member))
	}
	return jsonPointer(loc)
}

func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}
