package events

import (
	"errors"
	"fmt"
)

// The refusals and results the components hand the HTTP API. The component
// that refuses wraps one of these sentinels with its own detail; the API
// answers each with its status code by errors.Is. Defining them here, below
// both, is what lets the API take the reconciler and the read model as they
// are, with no layer translating one error into another.
var (
	// ErrNotWaiting: the operation is not waiting for a decision (it is
	// running, settled, or another approver decided first). HTTP 409.
	ErrNotWaiting = errors.New("operation is not waiting for a decision")
	// ErrInvalidDecision: the decision cannot apply to this operation (an
	// unknown action, compensate of an effect that has no undo or before any
	// attempt, a note too long, no approver). Its message is shown to the
	// approver: it names what is wrong, never args or results. HTTP 400.
	ErrInvalidDecision = errors.New("invalid decision")
	// ErrRequesterCannotDecide: the tool's approval rule (not_requester)
	// refuses a decision by the principal that submitted the intent.
	// HTTP 403.
	ErrRequesterCannotDecide = errors.New("the principal that asked may not decide on its own operation")
	// ErrEffectFound: asked again at decision time, the downstream shows the
	// effect; the operation was recorded completed instead of carrying out a
	// retry or an abandon, and the refusal comes with the completed record.
	// HTTP 409.
	ErrEffectFound = errors.New("the downstream shows the effect")

	// ErrUnknownSource: no registered tool by that name accepts callbacks
	// (unknown, or it has no signing secret). HTTP 404.
	ErrUnknownSource = errors.New("unknown webhook source")
	// ErrBadSignature: the Standard Webhooks headers are missing or the
	// signature does not match the body. HTTP 401.
	ErrBadSignature = errors.New("webhook signature invalid")
	// ErrStaleTimestamp: the signed timestamp is too far from now, so the
	// delivery may be a replay. HTTP 401.
	ErrStaleTimestamp = errors.New("webhook timestamp outside the tolerance")
	// ErrInvalidPayload: the verified body is not a callback effectline
	// understands (not JSON, no key). Nothing was recorded, so a corrected
	// delivery is processed. HTTP 400.
	ErrInvalidPayload = errors.New("invalid webhook payload")

	// ErrInvalidFilter is wrapped by every *FilterError. HTTP 400.
	ErrInvalidFilter = errors.New("invalid filter")
)

// Page sizes of a list of operations.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// ListFilter selects a page of operations from the read model; zero fields
// do not filter.
type ListFilter struct {
	// Status, when set, keeps operations in that status.
	Status Status
	// Tool, when set, keeps operations of that tool.
	Tool string
	// Principal, when set, keeps operations that principal submitted: the
	// list of a principal that may read only its own.
	Principal string
	// Limit is the page size: DefaultListLimit when zero, at most
	// MaxListLimit.
	Limit int
	// Cursor is the NextCursor of the previous page; empty for the first.
	Cursor string
}

// ListPage is one page of operations, newest first.
type ListPage struct {
	Items []Operation
	// NextCursor continues after the last item; empty on the last page.
	NextCursor string
}

// WorkflowFilter selects a page of workflow runs from the read model
// (workflow_state); zero fields do not filter.
type WorkflowFilter struct {
	// Status, when set, keeps runs in that status.
	Status WorkflowStatus
	// Principal, when set, keeps runs that principal started: the list of
	// a principal that may read only its own.
	Principal string
	// Limit is the page size: DefaultListLimit when zero, at most
	// MaxListLimit.
	Limit int
	// Cursor is the NextCursor of the previous page; empty for the first.
	Cursor string
}

// WorkflowPage is one page of workflow runs, newest first.
type WorkflowPage struct {
	Items []Workflow
	// NextCursor continues after the last item; empty on the last page.
	NextCursor string
}

// FilterError says which part of a ListFilter or WorkflowFilter is wrong.
type FilterError struct {
	Field  string // "status", "limit" or "cursor"
	Reason string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("invalid filter: %s: %s", e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidFilter) true.
func (e *FilterError) Unwrap() error { return ErrInvalidFilter }

// WebhookResult says what a committed callback delivery did.
type WebhookResult struct {
	// Duplicate: this webhook id was delivered before; nothing was done.
	Duplicate bool
	// OperationKey is the operation the callback named, when it exists.
	OperationKey string
	// Applied: the callback changed the operation (events were appended).
	Applied bool
	// Status is the operation's status after the callback, when it exists.
	Status Status
	// Ignored says why a delivery changed nothing ("unknown_operation",
	// "already_completed", "not_pending", "superseded_key", ...).
	Ignored string
}
