package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Decider records an approver's decision on an operation waiting for one
// (DESIGN §4, the approval gate). In production it is reconciler.Decide
// bound to the store; this package declares what it needs rather than
// importing the reconciler, so the API depends on no component.
//
// Decide returns the record the decision produced. Its errors must be
// classifiable with errors.Is:
//   - ErrNotWaiting: the operation is not waiting for a decision (409);
//     the returned record, when it has a status, says what it is instead;
//   - ErrInvalidDecision: the decision cannot apply to this operation (400);
//   - store.ErrNotFound: no operation under the key (404).
//
// Anything else is the server's fault (500, or 503 for a deadline). An
// adapter over the reconciler wraps its errors with these sentinels, e.g.
// fmt.Errorf("%w: %w", api.ErrNotWaiting, err), which keeps the
// reconciler's own error in the chain for logs.
type Decider interface {
	Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error)
}

// DeciderFunc adapts a function to Decider.
type DeciderFunc func(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error)

// Decide implements Decider.
func (f DeciderFunc) Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error) {
	return f(ctx, key, action, note, approver)
}

var (
	// ErrNotWaiting is wrapped by a Decider's error when the operation is
	// not waiting for a decision (it is running, settled, or another
	// approver decided first).
	ErrNotWaiting = errors.New("operation is not waiting for a decision")
	// ErrInvalidDecision is wrapped by a Decider's error when the decision
	// cannot apply (compensate of an effect that has no undo, a note too
	// long). Its message is shown to the approver: it must name what is
	// wrong, never args or results.
	ErrInvalidDecision = errors.New("invalid decision")
)

// Error codes of decisions.
const (
	codeNotWaiting      = "not_waiting"
	codeInvalidDecision = "invalid_decision"
)

func (s *Server) decisionRoutes() {
	s.HandleFunc("POST /v1/operations/{key}/decisions", s.postDecision, ApproverOnly)
}

// decisionRequest is the body of POST /v1/operations/{key}/decisions. It
// has no approver member: the approver is the authenticated principal, so
// nobody can record a decision in another's name.
type decisionRequest struct {
	Action *string `json:"action"`
	Note   string  `json:"note"`
	// DownstreamID and Result may come with record_success: what the
	// approver saw downstream.
	DownstreamID string          `json:"downstream_id"`
	Result       json.RawMessage `json:"result"`
}

// postDecision records a decision and answers the record it produced.
func (s *Server) postDecision(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.PathValue("key")
	trace.SpanFromContext(ctx).SetAttributes(attrOperationKey.String(key))
	if checkOperationKey(key) != "" {
		writeError(w, http.StatusNotFound, codeNotFound, "no operation with this key")
		return
	}
	var req decisionRequest
	if !s.decodeBody(w, r, &req) {
		return
	}
	if req.Action == nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "action", "action is required")
		return
	}
	action, err := events.ParseAction(*req.Action)
	if err != nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "action",
			fmt.Sprintf("action must be one of %v", events.Actions()))
		return
	}
	approver, _ := PrincipalFrom(ctx)
	op, err := s.decide(ctx, key, action, req.Note, approver, Seen{DownstreamID: req.DownstreamID, Result: req.Result})
	if err != nil {
		d := describeDecisionError(err, op)
		if d.retry {
			writeUnavailable(w, d.detail)
			return
		}
		writeError(w, d.status, d.code, d.detail)
		return
	}
	t, _ := s.tools.Get(op.Tool)
	writeJSON(w, http.StatusOK, renderOperation(op, t))
}

// errNoDecider is what decide returns in a process wired without a Decider.
var errNoDecider = errors.New("this process records no decisions (no Decider is configured)")

// decide calls the Decider, logging what the server got wrong. Refusals are
// the approver's business, not the operator's: they are not logged. The
// note is never logged.
func (s *Server) decide(ctx context.Context, key string, action events.Action, note, approver string, seen Seen) (events.Operation, error) {
	if s.decider == nil {
		return events.Operation{}, errNoDecider
	}
	op, err := s.callDecider(ctx, key, action, note, approver, seen)
	switch {
	case err == nil:
		s.log.InfoContext(ctx, "decision recorded", slog.String("operation_key", key),
			slog.String("action", string(action)), slog.String("approver", approver),
			slog.String("status", string(op.Status)))
	case errors.Is(err, ErrNotWaiting), errors.Is(err, ErrInvalidDecision), errors.Is(err, store.ErrNotFound),
		errors.Is(err, ErrRequesterCannotDecide):
	case errors.Is(err, ErrEffectFound):
		s.log.InfoContext(ctx, "decision refused: the downstream shows the effect", slog.String("operation_key", key),
			slog.String("action", string(action)), slog.String("approver", approver))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		s.log.WarnContext(ctx, "recording a decision did not finish", slog.String("operation_key", key),
			slog.String("action", string(action)), slog.Any("error", err))
	default:
		s.log.ErrorContext(ctx, "recording a decision failed", slog.String("operation_key", key),
			slog.String("action", string(action)), slog.Any("error", err))
	}
	return op, err
}

// decisionError is how a refused or failed decision is answered, shared by
// the JSON API and the UI so both say the same thing.
type decisionError struct {
	status int
	code   string
	detail string
	// retry: the same request may succeed in a moment (Retry-After).
	retry bool
}

func describeDecisionError(err error, op events.Operation) decisionError {
	if d, ok := describeGuardError(err); ok {
		return d
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return decisionError{status: http.StatusNotFound, code: codeNotFound, detail: "no operation with this key"}
	case errors.Is(err, ErrNotWaiting):
		detail := "the operation is not waiting for a decision"
		if op.Status != "" {
			detail = fmt.Sprintf("the operation is %s, not waiting for a decision (another approver or a callback may have settled it first)", op.Status)
		}
		return decisionError{status: http.StatusConflict, code: codeNotWaiting, detail: detail}
	case errors.Is(err, ErrInvalidDecision):
		// The Decider's message names the action and why it cannot apply
		// (see ErrInvalidDecision); it carries no args.
		return decisionError{status: http.StatusBadRequest, code: codeInvalidDecision, detail: err.Error()}
	case errors.Is(err, errNoDecider):
		return decisionError{status: http.StatusServiceUnavailable, code: codeUnavailable, detail: errNoDecider.Error()}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The decision may have committed just before the deadline: a retry
		// then answers 409, and the record says which decision won.
		return decisionError{status: http.StatusServiceUnavailable, code: codeUnavailable, retry: true,
			detail: "recording the decision did not finish; load the operation to see whether it was recorded"}
	}
	return decisionError{status: http.StatusInternalServerError, code: codeInternal, detail: "recording the decision failed"}
}
