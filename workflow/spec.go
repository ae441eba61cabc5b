// Package workflow runs declared sagas: the workflows of the tools file,
// whose steps are operations run in order by the executor like any other.
//
// A workflow run is its own event stream (the workflow journal, beside the
// operations' journal). Step s of workflow run w is the operation
// "wf:<w>/<s>". The intent of step n+1 is recorded only after step n's
// operation completed, in the same transaction that journals the step's
// completion, so a crash anywhere leaves either both or neither; the
// [Driver] finds workflows whose awaited operation settled and takes the
// next transition, each in one transaction under a row lock.
//
// The saga rule: steps up to and including the first irreversible step
// (the pivot) unwind when one of them ends failed or compensated for good:
// every completed compensable step before it is undone, last first, each
// undo its own operation "wf:<w>/<s>~undo". After the pivot nothing unwinds
// by itself: the workflow is escalated and an approver decides (retry_step,
// unwind or abandon).
package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Def is one declared workflow.
type Def struct {
	Name  string
	Steps []Step
	// InputSchema is the JSON Schema the input must match; empty accepts
	// any JSON object.
	InputSchema json.RawMessage
	// Pivot is the index of the first irreversible step, len(Steps) when
	// there is none. A final failure of a step at or before it unwinds; of
	// a step after it, escalates.
	Pivot int

	input *tool.Spec // validates the input with the tools' own validator
}

// Step is one step of a workflow: a registered tool and its templated args.
type Step struct {
	Name   string
	Tool   string
	Effect events.EffectClass
	Args   map[string]any // leaves that are strings are *value templates
	// UndoWith names the tool an approver's unwind runs for this step (an
	// irreversible step: a refund for a charge); UndoArgs are its args.
	UndoWith string
	UndoArgs map[string]any
}

// Tools lists the tools whose operations a run of d may record: each
// step's, the generated undo tool of each compensable step, and each
// step's undo_with. A run's retention is the longest dedup window among
// them (pruner.Config.WorkflowWindow), so no operation of a run outlives
// the run's own record under the tools file in force.
func (d *Def) Tools() []string {
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		if name != "" && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	for _, s := range d.Steps {
		add(s.Tool)
		if s.Effect == events.Compensable {
			add(UndoToolName(s.Tool))
		}
		add(s.UndoWith)
	}
	return out
}

// Set is the workflows of one tools file, by name.
type Set struct {
	defs map[string]*Def
}

// Get returns the workflow named name.
func (s *Set) Get(name string) (*Def, bool) {
	if s == nil {
		return nil, false
	}
	d, ok := s.defs[name]
	return d, ok
}

// Names lists the workflows, sorted.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	var out []string
	for n := range s.defs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ConfigError is one problem of a workflow declaration.
type ConfigError struct {
	Workflow string
	Step     string
	Key      string
	Reason   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("workflow ")
	b.WriteString(e.Workflow)
	if e.Step != "" {
		b.WriteString(", step ")
		b.WriteString(e.Step)
	}
	if e.Key != "" {
		b.WriteString(": ")
		b.WriteString(e.Key)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

type fileDoc struct {
	Workflows []defEntry `yaml:"workflows"`
}

type defEntry struct {
	Name        string      `yaml:"name"`
	Description string      `yaml:"description"`
	InputSchema any         `yaml:"input_schema"`
	Steps       []stepEntry `yaml:"steps"`
}

type stepEntry struct {
	Name     string         `yaml:"name"`
	Tool     string         `yaml:"tool"`
	Args     map[string]any `yaml:"args"`
	UndoWith string         `yaml:"undo_with"`
	UndoArgs map[string]any `yaml:"undo_args"`
}

// Load reads the workflows of the tools file at path; see Parse.
func Load(path string, reg *tool.Registry) (*Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loading workflows: %w", err)
	}
	s, err := Parse(data, reg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse reads the workflows: list of a tools file and checks it against
// the registered tools. Every problem is reported, joined, each naming the
// workflow and the step: an unknown tool, a reference to a step that does
// not come earlier, args that cannot satisfy the tool's schema (a required
// property missing, a constant that the schema refuses, a property the
// schema does not allow), an undo_with tool that does not exist. A file
// without workflows gives an empty set.
func Parse(data []byte, reg *tool.Registry) (*Set, error) {
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(false)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("workflows: %w", err)
	}
	if err := checkKeys(data); err != nil {
		return nil, err
	}
	set := &Set{defs: map[string]*Def{}}
	var errs []error
	for i, e := range doc.Workflows {
		name := e.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
			errs = append(errs, &ConfigError{Workflow: name, Key: "name", Reason: "required"})
			continue
		}
		if _, dup := set.defs[name]; dup {
			errs = append(errs, &ConfigError{Workflow: name, Key: "name", Reason: "duplicate workflow name"})
			continue
		}
		d, derrs := build(e, reg)
		errs = append(errs, derrs...)
		if len(derrs) == 0 {
			set.defs[name] = d
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return set, nil
}

// checkKeys refuses unknown keys in workflow and step mappings: a typo
// (undo_wiht) would silently drop a setting.
func checkKeys(data []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil || len(root.Content) == 0 {
		return nil
	}
	top := root.Content[0]
	var errs []error
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "workflows" {
			continue
		}
		for j, w := range top.Content[i+1].Content {
			wname := scalar(w, "name")
			if wname == "" {
				wname = fmt.Sprintf("#%d", j+1)
			}
			errs = append(errs, unknownKeys(w, wname, "", []string{"name", "description", "input_schema", "steps"})...)
			for k := 0; k+1 < len(w.Content); k += 2 {
				if w.Content[k].Value != "steps" {
					continue
				}
				for _, s := range w.Content[k+1].Content {
					errs = append(errs, unknownKeys(s, wname, scalar(s, "name"), []string{"name", "tool", "args", "undo_with", "undo_args"})...)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func unknownKeys(n *yaml.Node, wf, step string, known []string) []error {
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; !slices.Contains(known, k) {
			errs = append(errs, &ConfigError{Workflow: wf, Step: step, Key: k, Reason: "unknown key"})
		}
	}
	return errs
}

func scalar(n *yaml.Node, key string) string {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

func build(e defEntry, reg *tool.Registry) (*Def, []error) {
	var errs []error
	fail := func(step, key, reason string) {
		errs = append(errs, &ConfigError{Workflow: e.Name, Step: step, Key: key, Reason: reason})
	}
	d := &Def{Name: e.Name, Pivot: -1}
	if e.InputSchema != nil {
		raw, err := json.Marshal(jsonValue(e.InputSchema))
		if err != nil {
			fail("", "input_schema", "cannot be expressed as JSON")
		} else {
			d.InputSchema = raw
			d.input = &tool.Spec{Name: e.Name, Effect: events.Idempotent, ArgsSchema: raw}
			if err := d.input.Prepare(); err != nil {
				fail("", "input_schema", fmt.Sprintf("invalid JSON Schema: %v", err))
			}
		}
	}
	if len(e.Steps) == 0 {
		fail("", "steps", "at least one step is required")
	}
	earlier := map[string]bool{}
	for i, se := range e.Steps {
		sname := se.Name
		if sname == "" {
			sname = fmt.Sprintf("#%d", i+1)
			fail(sname, "name", "required")
			continue
		}
		if strings.ContainsAny(sname, "/~") {
			fail(sname, "name", "must not contain '/' or '~' (they separate the parts of the step's operation key)")
		}
		if earlier[sname] {
			fail(sname, "name", "duplicate step name")
			continue
		}
		st := Step{Name: sname, Tool: se.Tool, UndoWith: se.UndoWith}
		t, ok := reg.Get(se.Tool)
		switch {
		case se.Tool == "":
			fail(sname, "tool", "required")
		case !ok:
			fail(sname, "tool", fmt.Sprintf("unknown tool %q", se.Tool))
		default:
			st.Effect = t.Spec().Effect
		}
		args, aerrs := compileArgs(jsonValue(anyMap(se.Args)).(map[string]any), earlier, "")
		for _, r := range aerrs {
			fail(sname, "args", r)
		}
		st.Args = args
		if ok && len(aerrs) == 0 {
			for _, r := range checkArgs(t.Spec(), args) {
				fail(sname, "args", r)
			}
		}
		if se.UndoWith != "" {
			ut, uok := reg.Get(se.UndoWith)
			switch {
			case !uok:
				fail(sname, "undo_with", fmt.Sprintf("unknown tool %q", se.UndoWith))
			case st.Effect == events.Compensable:
				fail(sname, "undo_with", "a compensable step is undone with its tool's compensate")
			}
			// The undo may refer to this step's own result. Without
			// undo_args it gets the step's downstream id, what a refund
			// or a cancellation usually needs.
			self := maps(earlier, sname)
			raw := se.UndoArgs
			if raw == nil {
				raw = map[string]any{"downstream_id": "{{.Steps." + sname + ".DownstreamID}}"}
			}
			uargs, uerrs := compileArgs(jsonValue(raw).(map[string]any), self, "")
			for _, r := range uerrs {
				fail(sname, "undo_args", r)
			}
			st.UndoArgs = uargs
			if uok && len(uerrs) == 0 {
				for _, r := range checkArgs(ut.Spec(), uargs) {
					fail(sname, "undo_args", r)
				}
			}
		} else if se.UndoArgs != nil {
			fail(sname, "undo_args", "only with undo_with")
		}
		if st.Effect == events.Irreversible && d.Pivot < 0 {
			d.Pivot = i
		}
		earlier[sname] = true
		d.Steps = append(d.Steps, st)
	}
	if d.Pivot < 0 {
		d.Pivot = len(d.Steps)
	}
	return d, errs
}

func maps(m map[string]bool, extra string) map[string]bool {
	out := map[string]bool{extra: true}
	for k := range m {
		out[k] = true
	}
	return out
}

func anyMap(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// jsonValue turns YAML-decoded values into JSON-shaped ones (string keys).
func jsonValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = jsonValue(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[fmt.Sprint(k)] = jsonValue(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = jsonValue(e)
		}
		return out
	}
	return v
}

// checkArgs checks what can be checked before any input exists: every
// required property is present, no property is given that the schema
// forbids, and every constant (a value with no template in it) satisfies
// its property's schema.
func checkArgs(spec *tool.Spec, args map[string]any) []string {
	if len(spec.ArgsSchema) == 0 {
		return nil
	}
	var sch map[string]any
	if err := json.Unmarshal(spec.ArgsSchema, &sch); err != nil {
		return nil
	}
	var out []string
	if req, ok := sch["required"].([]any); ok {
		for _, r := range req {
			if name, ok := r.(string); ok {
				if _, present := args[name]; !present {
					out = append(out, fmt.Sprintf("%s requires %q, which the step does not give", spec.Name, name))
				}
			}
		}
	}
	props, _ := sch["properties"].(map[string]any)
	if ap, ok := sch["additionalProperties"].(bool); ok && !ap {
		for k := range args {
			if _, known := props[k]; !known {
				out = append(out, fmt.Sprintf("%s does not accept %q", spec.Name, k))
			}
		}
	}
	constants := map[string]any{}
	subProps := map[string]any{}
	for k, v := range args {
		if p, ok := props[k]; ok && !templated(v) {
			constants[k] = v
			subProps[k] = p
		}
	}
	if len(constants) == 0 {
		return out
	}
	sub := map[string]any{"properties": subProps}
	if defs, ok := sch["$defs"]; ok {
		sub["$defs"] = defs
	}
	raw, _ := json.Marshal(sub)
	inst, _ := json.Marshal(constants)
	check := &tool.Spec{Name: spec.Name, Effect: spec.Effect, ArgsSchema: raw}
	if err := check.Prepare(); err != nil {
		return out
	}
	if err := check.ValidateArgs(inst); err != nil {
		out = append(out, err.Error())
	}
	return out
}
