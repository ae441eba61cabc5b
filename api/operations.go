package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// Operations pages the read model (the projector's operation_state);
// *projector.Reader is one. A filter it cannot apply (a cursor it did not
// issue) is an error wrapping an *events.FilterError, answered 400.
type Operations interface {
	List(ctx context.Context, f events.ListFilter) (events.ListPage, error)
}

// Limits of GET /v1/operations.
const (
	maxCursorBytes   = 1024
	maxToolNameBytes = 256
)

// OperationsFunc adapts a function to Operations.
type OperationsFunc func(ctx context.Context, f events.ListFilter) (events.ListPage, error)

// List implements Operations.
func (f OperationsFunc) List(ctx context.Context, filter events.ListFilter) (events.ListPage, error) {
	return f(ctx, filter)
}

// operationBody is the operation record of a response: the record itself,
// whose JSON names are the contract's, with its args and the escalation's
// request redacted, and on GET of one operation its history.
type operationBody struct {
	events.Operation
	// Outcome is the agent's reading of the record (events.OutcomeOf).
	Outcome events.OperationOutcome `json:"outcome"`
	Events  []json.RawMessage       `json:"events,omitempty"`
}

// renderOperation returns op as a response record, redacted by t (nil: the
// tool is gone, and the args are withheld whole). The lease is shown as the
// fold left it: it clears the lease whenever no step runs, so it is non-null
// exactly while an attempt or compensation holds it.
func renderOperation(op events.Operation, t tool.Tool) operationBody {
	red := redactOperation(op, t)
	return operationBody{Operation: red, Outcome: events.OutcomeOf(red)}
}

// summarizeOperation is the record without args, escalation or history: a
// list item.
func summarizeOperation(op events.Operation) operationBody {
	op.Args, op.Escalation = nil, nil
	return operationBody{Operation: op, Outcome: events.OutcomeOf(op)}
}

// renderEvent returns an event envelope of the operation whose args are
// args as it may leave in a response: the envelope of the contract, redacted
// by redactEvent.
func renderEvent(e events.Envelope, t tool.Tool, args json.RawMessage) (json.RawMessage, error) {
	red, err := redactEvent(e, t, args)
	if err != nil {
		return nil, err
	}
	return json.Marshal(red)
}

// writeNoOperation answers 404 for an operation that is not there, or
// that the caller may not see: the two look the same.
func writeNoOperation(w http.ResponseWriter) {
	writeError(w, http.StatusNotFound, codeNotFound, "no operation with this key")
}

// answerUnreadable answers the outcome of loading key when it is no
// record the caller may read: 404 for a missing operation or another
// principal's, the server's failure for any other error. It reports
// whether op is readable, when it answered nothing.
func (s *Server) answerUnreadable(ctx context.Context, w http.ResponseWriter, key string, op events.Operation, err error) bool {
	if errors.Is(err, store.ErrNotFound) || err == nil && !s.mayRead(readerOf(ctx), op) {
		writeNoOperation(w)
		return false
	}
	if err != nil {
		s.fail(ctx, w, "loading the operation", key, err)
		return false
	}
	return true
}

// getOperation answers the head record and the history of one operation.
// The head is the write side's, not the read model's, so a client that just
// posted an intent finds it.
func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.PathValue("key")
	trace.SpanFromContext(ctx).SetAttributes(semconv.OperationKey.String(key))
	if checkOperationKey(key) != "" {
		// No stored key is malformed, so this is a miss, not a bad request.
		writeNoOperation(w)
		return
	}
	var wt *waiter
	if d, given, ok := queryWait(r); !ok {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "wait", "wait must be a duration such as 10s, at most 60s")
		return
	} else if given {
		wt = s.startWait(w, key, d)
		defer wt.close()
	}
	op, err := s.store.Load(ctx, key)
	if tomb, ok := store.AsPruned(err); ok {
		if !s.mayRead(readerOf(ctx), events.Operation{Principal: tomb.Principal}) {
			writeNoOperation(w)
			return
		}
		writeJSON(w, http.StatusOK, renderTombstone(tomb))
		return
	}
	if !s.answerUnreadable(ctx, w, key, op, err) {
		return
	}
	op = wt.until(ctx, w, op)
	stored, err := s.store.Events(ctx, key, 0)
	if err != nil {
		s.fail(ctx, w, "loading the operation's events", key, err)
		return
	}
	t, _ := s.tools.Get(op.Tool)
	body := renderOperation(op, t)
	body.Events = make([]json.RawMessage, 0, len(stored))
	for _, e := range stored {
		// Events appended after the head was read are left out, so the
		// history is the one that folds into the record shown.
		if e.Seq > op.Seq {
			break
		}
		raw, err := renderEvent(e.Envelope, t, op.Args)
		if err != nil {
			s.fail(ctx, w, "rendering the operation's events", key, err)
			return
		}
		body.Events = append(body.Events, raw)
	}
	if wt != nil && !settled(op) {
		writeJSON(w, http.StatusAccepted, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// listBody is a page of GET /v1/operations.
type listBody struct {
	Items      []operationBody `json:"items"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

// listOperations answers a page of the read model.
func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	f := events.ListFilter{Limit: events.DefaultListLimit, Tool: q.Get("tool"), Cursor: q.Get("cursor")}
	if v := q.Get("status"); v != "" {
		f.Status = events.Status(v)
		if !f.Status.Valid() {
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "status",
				fmt.Sprintf("status must be one of %v", events.Statuses()))
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > events.MaxListLimit {
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "limit",
				fmt.Sprintf("limit must be an integer from 1 to %d", events.MaxListLimit))
			return
		}
		f.Limit = n
	}
	if len(f.Tool) > maxToolNameBytes {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "tool", "tool is too long")
		return
	}
	if len(f.Cursor) > maxCursorBytes {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "cursor", "cursor is not one this server issued")
		return
	}
	scope, ok := s.listScope(readerOf(ctx))
	if !ok {
		writeJSON(w, http.StatusOK, listBody{Items: []operationBody{}})
		return
	}
	f.Principal = scope
	page, err := s.operations.List(ctx, f)
	if errors.Is(err, events.ErrInvalidFilter) {
		// Status, limit and tool are checked above, so the cursor is what
		// the read model could not apply.
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "cursor", "cursor is not one this server issued")
		return
	}
	if err != nil {
		s.log.ErrorContext(ctx, "listing operations failed", slog.String("status", string(f.Status)),
			slog.String("tool", f.Tool), slog.Any("error", err))
		if errors.Is(err, context.DeadlineExceeded) {
			writeUnavailable(w, "listing operations did not finish")
			return
		}
		writeError(w, http.StatusInternalServerError, codeInternal, "listing operations failed")
		return
	}
	body := listBody{Items: make([]operationBody, 0, len(page.Items)), NextCursor: page.NextCursor}
	for _, op := range page.Items {
		t, _ := s.tools.Get(op.Tool)
		body.Items = append(body.Items, summarizeOperation(redactOperation(op, t)))
	}
	writeJSON(w, http.StatusOK, body)
}
