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
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/store"
)

// Decider records an approver's decision on an operation waiting for one
// (contract §4, the approval gate); *reconciler.Decider is one. The API
// declares what it needs rather than importing the reconciler, so it
// depends on no component.
//
// Decide returns the record the decision produced. Its errors must be
// classifiable with errors.Is:
//   - events.ErrNotWaiting: the operation is not waiting for a decision
//     (409); the returned record, when it has a status, says what it is
//     instead;
//   - events.ErrInvalidDecision: the decision cannot apply to this
//     operation (400); its message is shown to the approver;
//   - store.ErrNotFound: no operation under the key (404).
//
// Anything else is the server's fault (500, or 503 for a deadline).
type Decider interface {
	Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error)
}

// DeciderFunc adapts a function to Decider.
type DeciderFunc func(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error)

// Decide implements Decider.
func (f DeciderFunc) Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error) {
	return f(ctx, key, action, note, approver)
}

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
	trace.SpanFromContext(ctx).SetAttributes(semconv.OperationKey.String(key))
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
	case errors.Is(err, events.ErrNotWaiting), errors.Is(err, events.ErrInvalidDecision), errors.Is(err, store.ErrNotFound),
		errors.Is(err, events.ErrRequesterCannotDecide):
	case errors.Is(err, events.ErrEffectFound):
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
	case errors.Is(err, events.ErrNotWaiting):
		detail := "the operation is not waiting for a decision"
		if op.Status != "" {
			detail = fmt.Sprintf("the operation is %s, not waiting for a decision (another approver or a callback may have settled it first)", op.Status)
		}
		return decisionError{status: http.StatusConflict, code: codeNotWaiting, detail: detail}
	case errors.Is(err, events.ErrInvalidDecision):
		// The Decider's message names the action and why it cannot apply
		// (see events.ErrInvalidDecision); it carries no args.
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
