package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Operations pages the read model (the projector's operation_state).
type Operations interface {
	List(ctx context.Context, f ListFilter) (ListPage, error)
}

// ListFilter selects a page of operations; zero fields do not filter.
type ListFilter struct {
	Status events.Status
	Tool   string
	// Limit is between 1 and MaxListLimit.
	Limit int
	// Cursor is the NextCursor of the previous page, "" for the first.
	Cursor string
}

// ListPage is one page of operations, newest first.
type ListPage struct {
	Items []events.Operation
	// NextCursor fetches the next page; "" on the last.
	NextCursor string
}

// ErrInvalidCursor is returned (wrapped) by an Operations whose cursor
// argument it cannot read; it is answered 400.
var ErrInvalidCursor = errors.New("invalid cursor")

// Limits of GET /v1/operations.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
	maxCursorBytes   = 1024
	maxToolNameBytes = 256
)

// OperationsFunc adapts a function to Operations.
type OperationsFunc func(ctx context.Context, f ListFilter) (ListPage, error)

// List implements Operations.
func (f OperationsFunc) List(ctx context.Context, filter ListFilter) (ListPage, error) {
	return f(ctx, filter)
}

// operationBody is the operation record of a response: the contract fields
// of DESIGN §3, always present (null or "" when not known yet), then what a
// client or the approval UI needs besides. Args are redacted.
type operationBody struct {
	OperationKey   string             `json:"operation_key"`
	Tool           string             `json:"tool"`
	EffectClass    events.EffectClass `json:"effect_class"`
	PayloadHash    string             `json:"payload_hash"`
	Principal      string             `json:"principal"`
	Status         events.Status      `json:"status"`
	Attempt        int                `json:"attempt"`
	LeaseUntil     *time.Time         `json:"lease_until"`
	Result         json.RawMessage    `json:"result"`
	DownstreamID   string             `json:"downstream_id"`
	UndoRef        string             `json:"undo_ref"`
	LastErrorClass string             `json:"last_error_class"`
	CreatedAt      time.Time          `json:"created_at"`
	UpdatedAt      time.Time          `json:"updated_at"`
	Seq            int64              `json:"seq"`
	Args           json.RawMessage    `json:"args,omitempty"`
	Escalation     *escalationBody    `json:"escalation,omitempty"`
	Approvals      []string           `json:"approvals,omitempty"`
	Events         []json.RawMessage  `json:"events,omitempty"`
}

// escalationBody is the evidence of an escalated operation, for the
// approver. Request is redacted like args.
type escalationBody struct {
	Reason         string          `json:"reason"`
	Request        json.RawMessage `json:"request,omitempty"`
	Downstream     json.RawMessage `json:"downstream,omitempty"`
	ProposedAction events.Action   `json:"proposed_action"`
	Detail         string          `json:"detail,omitempty"`
	Approvers      int             `json:"approvers,omitempty"`
}

// renderOperation returns op as a response record with its args redacted by
// t (nil: the tool is gone, and the args are withheld whole).
func renderOperation(op events.Operation, t Tool) operationBody {
	b := summarizeOperation(op)
	b.Args = redactArgs(t, op.Args)
	b.Approvals = op.Approvals
	if e := op.Escalation; e != nil {
		b.Escalation = &escalationBody{
			Reason:         e.Reason,
			Request:        redactArgs(t, e.Request),
			Downstream:     e.Downstream,
			ProposedAction: e.ProposedAction,
			Detail:         e.Detail,
			Approvers:      e.Approvers,
		}
	}
	return b
}

// summarizeOperation is the record without args, escalation or history: a
// list item.
func summarizeOperation(op events.Operation) operationBody {
	b := operationBody{
		OperationKey:   op.Key,
		Tool:           op.Tool,
		EffectClass:    op.EffectClass,
		PayloadHash:    op.PayloadHash,
		Principal:      op.Principal,
		Status:         op.Status,
		Attempt:        op.Attempt,
		Result:         op.Result,
		DownstreamID:   op.DownstreamID,
		UndoRef:        op.UndoRef,
		LastErrorClass: op.LastErrorClass,
		CreatedAt:      op.CreatedAt,
		UpdatedAt:      op.UpdatedAt,
		Seq:            op.Seq,
		// The fold clears the lease whenever no step runs, so it is
		// non-null exactly while an attempt or compensation holds it.
		LeaseUntil: op.LeaseUntil,
	}
	return b
}

// renderEvent returns an event envelope as it may leave in a response: the
// envelope of the contract, with the args of an intent and the request of an
// escalation redacted.
func renderEvent(e events.Envelope, t Tool) (json.RawMessage, error) {
	d, err := e.DecodeData()
	if err != nil {
		return nil, err
	}
	var data any
	switch d := d.(type) {
	case *events.IntentData:
		red := *d
		red.Args = redactArgs(t, d.Args)
		data = red
	case *events.EscalationData:
		red := *d
		red.Request = redactArgs(t, d.Request)
		data = red
	}
	if data != nil {
		if e.Data, err = json.Marshal(data); err != nil {
			return nil, err
		}
	}
	return json.Marshal(e)
}

// getOperation answers the head record and the history of one operation.
// The head is the write side's, not the read model's, so a client that just
// posted an intent finds it.
func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.PathValue("key")
	trace.SpanFromContext(ctx).SetAttributes(attrOperationKey.String(key))
	if checkOperationKey(key) != "" {
		// No stored key is malformed, so this is a miss, not a bad request.
		writeError(w, http.StatusNotFound, codeNotFound, "no operation with this key")
		return
	}
	op, err := s.store.Load(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, codeNotFound, "no operation with this key")
		return
	}
	if err != nil {
		s.fail(ctx, w, "loading the operation", key, err)
		return
	}
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
		raw, err := renderEvent(e.Envelope, t)
		if err != nil {
			s.fail(ctx, w, "rendering the operation's events", key, err)
			return
		}
		body.Events = append(body.Events, raw)
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
	f := ListFilter{Limit: DefaultListLimit, Tool: q.Get("tool"), Cursor: q.Get("cursor")}
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
		if err != nil || n < 1 || n > MaxListLimit {
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "limit",
				fmt.Sprintf("limit must be an integer from 1 to %d", MaxListLimit))
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
	page, err := s.operations.List(ctx, f)
	if errors.Is(err, ErrInvalidCursor) {
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
		body.Items = append(body.Items, summarizeOperation(op))
	}
	writeJSON(w, http.StatusOK, body)
}
