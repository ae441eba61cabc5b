package workflow

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
	"text/template/parse"
)

// value is one templated string of a step's args. A string that is exactly
// one action naming a field ("{{.Input.amount}}") becomes the JSON value
// that field holds, typed (a number stays a number); any other string is
// rendered as text.
type value struct {
	raw   string
	t     *template.Template
	field []string // set when the string is exactly one field action
}

// compileArgs parses every string of args as a template and checks its
// references: .Input..., or .Steps.<name>.Result... / .Steps.<name>.DownstreamID
// of a step in known. Strings without an action stay plain strings.
func compileArgs(args map[string]any, known map[string]bool, at string) (map[string]any, []string) {
	var errs []string
	var walk func(v any, path string) any
	walk = func(v any, path string) any {
		switch t := v.(type) {
		case string:
			if !strings.Contains(t, "{{") {
				return t
			}
			tm, err := template.New(path).Option("missingkey=error").Parse(t)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: template does not parse: %v", path, err))
				return t
			}
			val := &value{raw: t, t: tm}
			for _, ref := range fieldRefs(tm.Tree.Root) {
				if r := checkRef(ref, known); r != "" {
					errs = append(errs, fmt.Sprintf("%s: %s", path, r))
				}
			}
			if nodes := tm.Tree.Root.Nodes; len(nodes) == 1 {
				if a, ok := nodes[0].(*parse.ActionNode); ok && len(a.Pipe.Decl) == 0 && len(a.Pipe.Cmds) == 1 &&
					len(a.Pipe.Cmds[0].Args) == 1 {
					if f, ok := a.Pipe.Cmds[0].Args[0].(*parse.FieldNode); ok {
						val.field = f.Ident
					}
				}
			}
			return val
		case map[string]any:
			out := make(map[string]any, len(t))
			for k, e := range t {
				out[k] = walk(e, path+"/"+k)
			}
			return out
		case []any:
			out := make([]any, len(t))
			for i, e := range t {
				out[i] = walk(e, fmt.Sprintf("%s/%d", path, i))
			}
			return out
		}
		return v
	}
	return walk(args, at).(map[string]any), errs
}

// fieldRefs lists the field chains a template reads.
func fieldRefs(n parse.Node) [][]string {
	var out [][]string
	var walk func(n parse.Node)
	walk = func(n parse.Node) {
		switch t := n.(type) {
		case *parse.ListNode:
			if t == nil {
				return
			}
			for _, c := range t.Nodes {
				walk(c)
			}
		case *parse.ActionNode:
			walk(t.Pipe)
		case *parse.PipeNode:
			if t == nil {
				return
			}
			for _, c := range t.Cmds {
				walk(c)
			}
		case *parse.CommandNode:
			for _, a := range t.Args {
				walk(a)
			}
		case *parse.FieldNode:
			out = append(out, t.Ident)
		case *parse.ChainNode:
			walk(t.Node)
		case *parse.IfNode:
			walk(t.Pipe)
			walk(t.List)
			walk(t.ElseList)
		case *parse.RangeNode:
			walk(t.Pipe)
			walk(t.List)
			walk(t.ElseList)
		case *parse.WithNode:
			walk(t.Pipe)
			walk(t.List)
			walk(t.ElseList)
		}
	}
	walk(n)
	return out
}

func checkRef(ref []string, known map[string]bool) string {
	switch {
	case len(ref) == 0:
		return ""
	case ref[0] == "Input":
		return ""
	case ref[0] != "Steps":
		return fmt.Sprintf("unknown reference .%s (templates see .Input and .Steps.<step>.Result or .DownstreamID)", strings.Join(ref, "."))
	case len(ref) < 3:
		return fmt.Sprintf(".%s: name a step and its Result or DownstreamID", strings.Join(ref, "."))
	case !known[ref[1]]:
		return fmt.Sprintf("reference to step %q, which is not an earlier step", ref[1])
	case ref[2] != "Result" && ref[2] != "DownstreamID":
		return fmt.Sprintf(".%s: a step has Result and DownstreamID", strings.Join(ref, "."))
	case ref[2] == "DownstreamID" && len(ref) > 3:
		return fmt.Sprintf(".%s: DownstreamID is a string", strings.Join(ref, "."))
	}
	return ""
}

// templated reports whether v holds a template anywhere.
func templated(v any) bool {
	switch t := v.(type) {
	case *value:
		return true
	case map[string]any:
		for _, e := range t {
			if templated(e) {
				return true
			}
		}
	case []any:
		for _, e := range t {
			if templated(e) {
				return true
			}
		}
	}
	return false
}

// StepData is what a later step's templates see of a completed one.
type StepData struct {
	Result       any
	DownstreamID string
}

// scope is the data templates are executed on.
func scope(input json.RawMessage, steps map[string]StepData) (map[string]any, error) {
	var in any
	if len(input) > 0 {
		if err := json.Unmarshal(input, &in); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
	}
	st := make(map[string]any, len(steps))
	for k, s := range steps {
		st[k] = map[string]any{"Result": s.Result, "DownstreamID": s.DownstreamID}
	}
	return map[string]any{"Input": in, "Steps": st}, nil
}

// render executes args on data and returns the JSON object.
func render(args map[string]any, data map[string]any) (json.RawMessage, error) {
	var walk func(v any) (any, error)
	walk = func(v any) (any, error) {
		switch t := v.(type) {
		case *value:
			if t.field != nil {
				return lookup(data, t.field, t.raw)
			}
			var b strings.Builder
			if err := t.t.Execute(&b, data); err != nil {
				return nil, fmt.Errorf("%s: %w", t.raw, err)
			}
			return b.String(), nil
		case map[string]any:
			out := make(map[string]any, len(t))
			for k, e := range t {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				out[k] = r
			}
			return out, nil
		case []any:
			out := make([]any, len(t))
			for i, e := range t {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				out[i] = r
			}
			return out, nil
		}
		return v, nil
	}
	out, err := walk(args)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func lookup(data any, path []string, raw string) (any, error) {
	cur := data
	for i, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: .%s is not an object", raw, strings.Join(path[:i], "."))
		}
		v, ok := m[p]
		if !ok {
			return nil, fmt.Errorf("%s: no .%s", raw, strings.Join(path[:i+1], "."))
		}
		cur = v
	}
	return cur, nil
}
