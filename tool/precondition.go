package tool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/template/parse"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/effectline/effectline/events"
)

// Verdict is what an execution-time check concluded.
type Verdict string

const (
	// Passed: the call still applies; the attempt may be sent.
	Passed Verdict = "passed"
	// Rejected: the call must not be sent, now or later (a stale record, a
	// business rule). The operation fails for good; nothing was sent.
	Rejected Verdict = "rejected"
	// Unchecked: the check could not be made (its endpoint answered 5xx,
	// timed out, refused the connection). Nothing was sent, so the attempt
	// fails retryably within the caps.
	Unchecked Verdict = "unchecked"
)

// Error classes of execution-time checks.
const (
	// ClassPreconditionFailed: the precondition's record did not match its
	// expect schema, or the record does not exist (404).
	ClassPreconditionFailed = "precondition_failed"
	// ClassPreconditionUnavailable: the precondition could not be asked.
	ClassPreconditionUnavailable = "precondition_unavailable"
	// ClassCheckRejected: a Go tool's check hook refused the call.
	ClassCheckRejected = "check_rejected"
)

// Check is the answer of an execution-time check, made after the attempt
// was claimed and before anything is sent.
type Check struct {
	Verdict    Verdict
	ErrorClass string
	// Reason says why a check did not pass, for the agent and the approver
	// (the schema's message for a precondition).
	Reason     string
	StatusCode int
	RetryAfter time.Duration
	// Evidence is what was asked and what came back, journaled with the
	// attempt's outcome (sensitive args redacted).
	Evidence json.RawMessage
}

// Checker is implemented by tools that check, at execution time, before
// every attempt, that the call still applies: the tools file's precondition,
// a Go tool's check hook. ok is false when the tool declares no check.
type Checker interface {
	Check(ctx context.Context, c Call) (chk Check, ok bool)
}

// Result turns a check that did not pass into the outcome of the attempt:
// failed (nothing was sent), final when rejected and retryable when the
// check could not be made. Its body is {"check_failed": reason}, so the
// reason the record's outcome quotes carries the schema's message; it has
// no status code, because the mutation's downstream was never asked (the
// check's own status is in its evidence).
func (k Check) Result() Result {
	kind := events.Final
	if k.Verdict == Unchecked {
		kind = events.Retryable
	}
	r := FailedResult(kind, k.ErrorClass, errors.New(k.Reason))
	r.RetryAfter = k.RetryAfter
	r.Body, _ = json.Marshal(map[string]string{"check_failed": k.Reason})
	return r
}

// Expect is a precondition's expect: a JSON Schema on the answer's body in
// which a string that is exactly one template action stands for the call's
// typed value.
type Expect struct {
	doc any // the decoded schema, actions not yet substituted
}

// expectActions are the values an expect action may name.
var expectActions = map[string]bool{"Args": true, "Principal": true, "Key": true, "OperationKey": true, "DownstreamID": true}

// ParseExpect checks expect (JSON): every string that holds a template
// action must be exactly one action naming a field of the call, and the
// schema must compile with the actions filled in.
func ParseExpect(raw json.RawMessage) (*Expect, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, errors.New("expect: required (a JSON Schema on the 2xx body)")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("expect: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("expect: must be a JSON Schema object")
	}
	var bad error
	walkStrings(doc, func(s string) any {
		if bad == nil && strings.Contains(s, "{{") {
			if _, err := parseExpectAction(s); err != nil {
				bad = err
			}
		}
		return nil
	})
	if bad != nil {
		return nil, fmt.Errorf("expect: %w", bad)
	}
	// The actions' types are known only per call; the schema must compile
	// with a number or a string in their place.
	var compileErr error
	for _, sample := range []any{json.Number("0"), ""} {
		filled := substitute(doc, func([]string) (any, bool) { return sample, true })
		if _, compileErr = compileDoc(filled); compileErr == nil {
			break
		}
	}
	if compileErr != nil {
		return nil, fmt.Errorf("expect: invalid JSON Schema: %w", compileErr)
	}
	return &Expect{doc: doc}, nil
}

// parseExpectAction returns the field path of a string that is exactly one
// action such as {{.Args.amount}} or {{.Principal}}.
func parseExpectAction(s string) ([]string, error) {
	trees, err := parse.Parse("expect", s, "{{", "}}")
	if err != nil {
		return nil, fmt.Errorf("%q: not a valid template action: %w", s, err)
	}
	root := trees["expect"].Root
	if len(root.Nodes) != 1 {
		return nil, fmt.Errorf("%q: a template action must be the whole string", s)
	}
	act, ok := root.Nodes[0].(*parse.ActionNode)
	if !ok || len(act.Pipe.Decl) > 0 || len(act.Pipe.Cmds) != 1 || len(act.Pipe.Cmds[0].Args) != 1 {
		return nil, fmt.Errorf("%q: the action must name one value, such as {{.Args.amount}}", s)
	}
	f, ok := act.Pipe.Cmds[0].Args[0].(*parse.FieldNode)
	if !ok || !expectActions[f.Ident[0]] || (f.Ident[0] != "Args" && len(f.Ident) > 1) {
		return nil, fmt.Errorf("%q: the action must name .Args.<field>, .Principal, .Key, .OperationKey or .DownstreamID", s)
	}
	return f.Ident, nil
}

// walkStrings calls f for every string in v (map values and array items;
// never map keys) and replaces the string with f's answer when it is not nil.
func walkStrings(v any, f func(string) any) any {
	switch t := v.(type) {
	case string:
		if r := f(t); r != nil {
			return r
		}
		return t
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = walkStrings(e, f)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = walkStrings(e, f)
		}
		return out
	}
	return v
}

// substitute returns a copy of doc with each action string replaced by
// value(path); a path value does not know is left for the caller to report.
func substitute(doc any, value func(path []string) (any, bool)) any {
	return walkStrings(doc, func(s string) any {
		if !strings.Contains(s, "{{") {
			return nil
		}
		path, err := parseExpectAction(s)
		if err != nil {
			return nil
		}
		if v, ok := value(path); ok {
			return v
		}
		return nil
	})
}

// compileDoc compiles a decoded schema with the same refusing loader as
// args_schema.
func compileDoc(doc any) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	if err := c.AddResource("urn:effectline:expect", doc); err != nil {
		return nil, err
	}
	return c.Compile("urn:effectline:expect")
}

// Verify checks body against expect filled in for c. The reason names the
// failing field and why ("" when it matches); err means expect could not
// be filled in for these args.
func (x *Expect) Verify(c Call, body json.RawMessage) (reason string, err error) {
	var args map[string]any
	if len(bytes.TrimSpace(c.Args)) > 0 {
		a, err := jsonschema.UnmarshalJSON(bytes.NewReader(c.Args))
		if err != nil {
			return "", fmt.Errorf("args: %w", err)
		}
		args, _ = a.(map[string]any)
	}
	var missing []string
	doc := substitute(x.doc, func(path []string) (any, bool) {
		switch path[0] {
		case "Principal":
			return c.Principal, true
		case "Key":
			return c.DownstreamKey, true
		case "OperationKey":
			return c.OperationKey, true
		case "DownstreamID":
			return c.DownstreamID, true
		}
		if len(path) == 1 {
			return args, args != nil
		}
		var v any = args
		for _, f := range path[1:] {
			m, ok := v.(map[string]any)
			if !ok {
				missing = append(missing, strings.Join(path, "."))
				return nil, false
			}
			if v, ok = m[f]; !ok {
				missing = append(missing, strings.Join(path, "."))
				return nil, false
			}
		}
		return v, true
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("expect names .%s, which the args do not have", missing[0])
	}
	sch, err := compileDoc(doc)
	if err != nil {
		return "", fmt.Errorf("expect does not compile for these args: %w", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		return "the precondition's answer is not JSON", nil
	}
	if err := sch.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return err.Error(), nil
		}
		field, why := describeValidation(ve)
		if field == "" {
			return why, nil
		}
		return field + ": " + why, nil
	}
	return "", nil
}

// CheckEvidence is the journaled record of one check: which check, what was
// asked (method and URL, for a request), what came back (redacted like a
// reconciliation's answer), and the verdict.
func CheckEvidence(check string, s *Spec, c Call, method, url string, chk Check, body json.RawMessage) json.RawMessage {
	if len(body) > 0 {
		body = s.RedactEcho(c.Args, body)
		if len(body) > maxEvidenceBody {
			body, _ = json.Marshal(string(body[:maxEvidenceBody]) + "…")
		}
	}
	b, _ := json.Marshal(struct {
		Check      string          `json:"check"`
		Method     string          `json:"method,omitempty"`
		URL        string          `json:"url,omitempty"`
		Verdict    Verdict         `json:"verdict"`
		Reason     string          `json:"reason,omitempty"`
		StatusCode int             `json:"status_code,omitempty"`
		Body       json.RawMessage `json:"body,omitempty"`
	}{check, method, url, chk.Verdict, chk.Reason, chk.StatusCode, body})
	return b
}

// maxEvidenceBody bounds the answer kept in a check's evidence.
const maxEvidenceBody = 4096
