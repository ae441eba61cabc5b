// Package tool is how effectline calls the outside world: the registry of
// tools (contract §6), the HTTP invoker, and the one classification of what a
// call returned into Succeeded, Failed or Unknown (contract §2).
//
// Classification is the heart of the product's promise. Failed means
// "provably no effect" and may be retried; Unknown means "it may have
// happened" and is never collapsed into Failed. So every rule here leans
// the same way: when a response or an error does not prove that nothing
// happened, the answer is Unknown, and the executor's policy (package policy)
// decides per effect class what is safe to do next.
//
// A tool is either declared in the YAML tools file (an [HTTPTool]) or written
// in Go (a [GoTool], or any type implementing [Tool]); both meet the executor
// through the same small interfaces.
//
// Before every attempt the executor asks a [Checker] whether the call still
// applies: the tools file's precondition (a request and an expect schema on
// its answer) or a Go tool's check hook ([WithCheck]). A rejection fails the
// operation for good and nothing is sent.
package tool

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/effectline/effectline/events"
)

// Call is one request to a tool: an attempt, its compensation, or a
// reconciliation query.
type Call struct {
	// OperationKey identifies the intended effect across every retry.
	OperationKey string
	// DownstreamKey is the idempotency key sent downstream (contract §5): the
	// operation key, changed only after a compensated attempt.
	DownstreamKey string
	// DownstreamID is what the downstream called the effect, when known
	// (from an earlier response); compensation and reconciliation use it.
	DownstreamID string
	// UndoRef is how to undo the attempt, for compensable Go tools.
	UndoRef string
	// Principal is who asked; tools authorize it again at execution time.
	Principal string
	// Attempt is the number of the attempt (1 for the first).
	Attempt int
	// Args are the tool arguments, a JSON object.
	Args json.RawMessage
}

// CallOf is the call for op as its record stands: its keys and ids, who
// asked, the attempt and the args.
func CallOf(op events.Operation) Call {
	return Call{
		OperationKey:  op.Key,
		DownstreamKey: op.DownstreamKey,
		DownstreamID:  op.DownstreamID,
		UndoRef:       op.UndoRef,
		Principal:     op.Principal,
		Attempt:       op.Attempt,
		Args:          op.Args,
	}
}

// Result is how a call ended.
type Result struct {
	Outcome events.Outcome
	// Kind is set when Outcome is Failed.
	Kind events.FailureKind
	// ErrorClass is a short snake_case name for why the call did not
	// succeed ("http_503", "timeout_after_send", "dns", ...): low-cardinality,
	// fit for a metric label and a span attribute.
	ErrorClass string
	Err        error
	// StatusCode is the HTTP status, when there was a response.
	StatusCode int
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
	// Body is the response body as JSON; a body that is not JSON is carried
	// as a JSON string.
	Body json.RawMessage
	// DownstreamID is the downstream's id for the effect, from the response
	// body's id field (downstream_id_field in the tools file).
	DownstreamID string
	// UndoRef tells a later compensation how to undo this attempt.
	UndoRef string
}

// Answer is what a reconciliation learned about "did it happen?".
type Answer string

const (
	// Found: the downstream shows the effect; its body is the result.
	Found Answer = "found"
	// Absent: the downstream provably has no such effect.
	Absent Answer = "absent"
	// CannotTell: no answer (an error, a timeout, an unexpected status).
	CannotTell Answer = "cannot_tell"
)

// Reconciliation is the answer to "did the effect for this key happen?".
type Reconciliation struct {
	Answer       Answer
	Body         json.RawMessage
	DownstreamID string
	ErrorClass   string
	Err          error
}

// Tool is a registered tool. Invoke runs one attempt and must never return an
// Outcome it cannot prove: when in doubt, Unknown.
type Tool interface {
	Spec() *Spec
	Invoke(ctx context.Context, c Call) Result
}

// Compensator is implemented by tools that can undo an attempt. Compensating
// an attempt that never took effect must succeed: the executor compensates
// exactly when it does not know.
type Compensator interface {
	Compensate(ctx context.Context, c Call) Result
}

// Reconciler is implemented by tools that can answer "did the effect for
// c.DownstreamKey (or c.DownstreamID) happen?".
type Reconciler interface {
	Reconcile(ctx context.Context, c Call) Reconciliation
}

// DefaultDownstreamIDField is the field of a tool's JSON answer that holds
// the downstream's id for the effect, unless the tool names another.
const DefaultDownstreamIDField = "id"

// SucceededResult, FailedResult and UnknownResult build Results; they keep
// the three outcomes spelled one way across the tools.
func SucceededResult() Result { return Result{Outcome: events.Succeeded} }

// FailedResult is a Failed Result of the given kind and error class.
func FailedResult(kind events.FailureKind, class string, err error) Result {
	return Result{Outcome: events.Failed, Kind: kind, ErrorClass: class, Err: err}
}

// UnknownResult is an Unknown Result of the given error class.
func UnknownResult(class string, err error) Result {
	return Result{Outcome: events.Unknown, ErrorClass: class, Err: err}
}

// JSONBody returns body if it is JSON, else body as a JSON string; empty is nil.
func JSONBody(body []byte) json.RawMessage {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if json.Valid(body) {
		return json.RawMessage(append([]byte(nil), body...))
	}
	s, _ := json.Marshal(string(body)) // invalid UTF-8 becomes U+FFFD
	return s
}

// BodyField reads a top-level string or number field from a JSON object.
func BodyField(body json.RawMessage, field string) string {
	if field == "" || len(body) == 0 || body[0] != '{' {
		return ""
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	raw, ok := obj[field]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// Preflight runs the checks every tool makes before anything is sent: the
// principal is still allowed, and the args match the schema. Both failures
// are final: nothing was sent, and the same call would fail the same way.
func (s *Spec) Preflight(c Call) (Result, bool) {
	if err := s.Authorize(c.Principal); err != nil {
		return FailedResult(events.Final, "forbidden", err), false
	}
	if err := s.ValidateArgs(c.Args); err != nil {
		return FailedResult(events.Final, "invalid_args", err), false
	}
	return Result{}, true
}
