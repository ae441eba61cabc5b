package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Phase says which step of an operation the executor works on next, or is
// working on now: the attempt itself, or the undo of the last attempt.
type Phase string

const (
	PhaseAttempt      Phase = "attempt"
	PhaseCompensation Phase = "compensation"
)

// ReasonApprovalRequired is the escalation reason of an operation waiting
// in the approval gate before its first attempt.
const ReasonApprovalRequired = "approval_required"

// IntentPickupGrace is how long a fresh intent waits for its Kafka message
// before the executor's due-time poller runs it anyway. It is the safety net
// for an intent whose message was consumed by a worker that died before it
// claimed the attempt.
const IntentPickupGrace = 15 * time.Second

// Operation is the record of one intended business effect (contract §3): the
// fold of its events. It is the one shape of the record: the store keeps it
// as the head of each operation, the projector's read model holds it, and
// the HTTP API answers it (with args redacted), all under these JSON names.
// The fields of the contract are always present, null or "" while not known
// yet; the rest are omitted when empty.
type Operation struct {
	Key         string          `json:"operation_key"`
	Tool        string          `json:"tool"`
	EffectClass EffectClass     `json:"effect_class"`
	PayloadHash string          `json:"payload_hash"`
	Principal   string          `json:"principal"`
	Args        json.RawMessage `json:"args,omitempty"`
	Status      Status          `json:"status"`
	Phase       Phase           `json:"phase"`
	Attempt     int             `json:"attempt"`
	LeaseOwner  string          `json:"lease_owner,omitempty"`
	LeaseUntil  *time.Time      `json:"lease_until"`
	// DueAt is when the executor must act next (a retry, a compensation, an
	// intent nobody picked up). Nil when the executor has nothing to do.
	DueAt         *time.Time      `json:"due_at,omitempty"`
	Result        json.RawMessage `json:"result"`
	DownstreamID  string          `json:"downstream_id"`
	UndoRef       string          `json:"undo_ref"`
	DownstreamKey string          `json:"downstream_key,omitempty"`
	// Compensations counts undone attempts; it picks the next downstream key.
	Compensations int  `json:"compensations"`
	Approved      bool `json:"approved,omitempty"`
	// Approvals lists the distinct approvers who decided retry while the
	// operation waited in the approval gate; it runs once there are as many
	// as its escalation's Approvers.
	Approvals      []string `json:"approvals,omitempty"`
	LastErrorClass string   `json:"last_error_class"`
	// LastFailure is the confirmed failure of the latest attempt, while that
	// is the latest outcome: what the outcome's reason quotes.
	LastFailure *Failure `json:"last_failure,omitempty"`
	// Evidence counts events that changed nothing but were kept: late
	// outcomes of lost leases and rejected intents.
	Evidence       int             `json:"evidence,omitempty"`
	Escalation     *EscalationData `json:"escalation,omitempty"`
	Seq            int64           `json:"seq"`
	FirstAttemptAt *time.Time      `json:"first_attempt_at,omitempty"`
	LastAttemptAt  *time.Time      `json:"last_attempt_at,omitempty"`
	LastOutcomeAt  *time.Time      `json:"last_outcome_at,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
}

// MarshalOperation returns the JSON of op, as encoding/json would write it
// without HTML escaping: the head record and the read model's record are
// written for every event, and the reflective encoder was a tenth of the
// process's CPU spent on them.
func MarshalOperation(op Operation) ([]byte, error) {
	return marshal(op)
}

// OmittedFromBody are the members MarshalOperationBody leaves out: the
// ones a store keeps in columns of their own.
var OmittedFromBody = []string{"operation_key", "tool", "effect_class", "payload_hash", "status", "seq"}

// MarshalOperationBody is MarshalOperation without the members in
// OmittedFromBody, for a store that keeps those in columns beside the JSON
// (the head row in operations). UnmarshalOperation reads it; the caller
// sets the six fields from its columns.
func MarshalOperationBody(op Operation) ([]byte, error) {
	w := fastWriter{ok: true}
	op.appendMembers(&w, false)
	if b, ok := w.end(); ok {
		return b, nil
	}
	// A value the fast writer leaves to encoding/json (a list of
	// approvals): the whole record, less the six members.
	full, err := marshal(op)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(full, &m); err != nil {
		return nil, err
	}
	for _, name := range OmittedFromBody {
		delete(m, name)
	}
	return marshal(m)
}

// UnmarshalOperation decodes a record MarshalOperation wrote. The record
// always carries "result", null until the downstream answered; decoded by
// json.Unmarshal alone that null would become the bytes "null" rather than
// no result, which is what the fold holds.
func UnmarshalOperation(b []byte) (Operation, error) {
	var op Operation
	if err := json.Unmarshal(b, &op); err != nil {
		return Operation{}, err
	}
	if string(op.Result) == "null" {
		op.Result = nil
	}
	return op, nil
}

// DownstreamKeyFor is the idempotency key sent downstream (contract §5): the
// operation key, changed only after an attempt was compensated, so a receiver
// that honors keys dedups every blind retry yet runs a retry after an undo.
func DownstreamKeyFor(operationKey string, compensations int) string {
	if compensations == 0 {
		return operationKey
	}
	return operationKey + "~c" + strconv.Itoa(compensations)
}

// ErrIllegalTransition is wrapped by every *TransitionError.
var ErrIllegalTransition = errors.New("illegal transition")

// TransitionError says which event cannot follow the operation's state.
type TransitionError struct {
	From   Status
	Phase  Phase
	Event  Type
	Seq    int64
	Reason string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("illegal transition: %s (seq %d) on an operation %s/%s: %s",
		e.Event, e.Seq, e.From, e.Phase, e.Reason)
}

func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// Fold replays events in order into an operation record.
func Fold(evs []Envelope) (Operation, error) {
	var op Operation
	for _, e := range evs {
		next, err := Apply(op, e)
		if err != nil {
			return op, err
		}
		op = next
	}
	return op, nil
}

// Apply returns op with e applied. It is pure: the same record and event
// always give the same result, which is what lets the projector rebuild the
// read model from the event store and get the live table back exactly.
func Apply(op Operation, e Envelope) (Operation, error) {
	illegal := func(reason string) (Operation, error) {
		return op, &TransitionError{From: op.Status, Phase: op.Phase, Event: e.Type, Seq: e.Seq, Reason: reason}
	}
	if e.Seq != op.Seq+1 {
		return illegal(fmt.Sprintf("expected seq %d", op.Seq+1))
	}
	if op.Seq > 0 && e.OperationKey != op.Key {
		return illegal("event of operation " + e.OperationKey)
	}
	if op.Seq == 0 && e.Type != IntentRecorded {
		return illegal("the operation has no intent")
	}
	var argsHash string // PayloadHash of an intent's args, a by-product of validating them
	d, err := e.decodeData(&argsHash)
	if err != nil {
		return op, err
	}
	at := e.OccurredAt.UTC()
	next := op
	next.Seq = e.Seq
	next.UpdatedAt = at

	// An outcome for an attempt other than the current one, or arriving when
	// the attempt is no longer running, is a late report from a worker that
	// lost its lease: kept as evidence, never allowed to overwrite the state
	// of a newer attempt.
	if e.Type.HasAttempt() && e.Type != AttemptStarted && e.Type != CompensationStarted {
		if e.Attempt > op.Attempt {
			return illegal(fmt.Sprintf("attempt %d has not started (current %d)", e.Attempt, op.Attempt))
		}
		if e.Attempt < op.Attempt || !outcomeApplies(op, e.Type) {
			if e.Type == AttemptSucceeded && e.Attempt == op.Attempt && successResolves(op) {
				// A late success for the current attempt is the truth about an
				// operation still unresolved: the effect happened.
			} else {
				next.Evidence++
				return next, nil
			}
		}
	}

	if e.Type != AttemptFailed && e.Type != AttemptStarted && e.Type != IntentRejected {
		// Any later outcome or decision replaces the failure as the news.
		next.LastFailure = nil
	}
	switch d := d.(type) {
	case *IntentData:
		if op.Seq != 0 {
			return illegal("operation already exists")
		}
		due := at.Add(IntentPickupGrace)
		args := d.Args
		if d.PayloadHash != "" {
			// A public copy: its args are redacted, so the record keeps the
			// recorded args' hash and no args at all. It can neither pass
			// the redacted values off as the request nor be executed (the
			// executor refuses a record without args).
			argsHash, args = d.PayloadHash, nil
		}
		next = Operation{
			Key: e.OperationKey, Tool: e.Tool, EffectClass: e.EffectClass,
			PayloadHash: argsHash, Principal: d.Principal, Args: args,
			Status: StatusPending, Phase: PhaseAttempt, DueAt: &due,
			Seq: e.Seq, CreatedAt: at, UpdatedAt: at,
		}
		return next, nil
	case *IntentRejectedData:
		next.Evidence++
		return next, nil
	case *AttemptStartedData:
		if !(op.Status == StatusPending && op.Phase == PhaseAttempt) {
			return illegal("an attempt starts only from pending")
		}
		if e.Attempt != op.Attempt+1 {
			return illegal(fmt.Sprintf("attempt must be %d", op.Attempt+1))
		}
		lease := d.LeaseUntil.UTC()
		next.Status, next.Attempt = StatusInProgress, e.Attempt
		next.LeaseOwner, next.LeaseUntil, next.DueAt = d.Worker, &lease, nil
		next.DownstreamKey = d.DownstreamKey
		next.LastAttemptAt = &at
		if next.FirstAttemptAt == nil {
			next.FirstAttemptAt = &at
		}
	case *AttemptSucceededData:
		next.Status, next.Phase = StatusCompleted, PhaseAttempt
		next.Result, next.DownstreamID, next.UndoRef = d.Result, d.DownstreamID, d.UndoRef
		next.LeaseOwner, next.LeaseUntil, next.DueAt = "", nil, nil
		next.LastErrorClass = ""
		next.LastOutcomeAt = &at
	case *AttemptFailedData:
		next.LeaseOwner, next.LeaseUntil = "", nil
		next.LastErrorClass = d.ErrorClass
		next.LastFailure = &Failure{Kind: d.Kind, StatusCode: d.StatusCode, Response: d.Response}
		next.LastOutcomeAt = &at
		if d.Kind == Retryable && d.RetryAt != nil {
			next.Status, next.DueAt = StatusPending, utcPtr(*d.RetryAt)
		} else {
			next.Status, next.DueAt = StatusFailed, nil
		}
	case *AttemptUnknownData:
		next.LeaseOwner, next.LeaseUntil = "", nil
		next.LastErrorClass = d.ErrorClass
		next.LastOutcomeAt = &at
		switch d.Next {
		case NextRetry:
			if d.RetryAt == nil {
				return illegal("a retry needs retry_at")
			}
			next.Status, next.DueAt = StatusPending, utcPtr(*d.RetryAt)
		case NextCompensate:
			if op.EffectClass != Compensable {
				return illegal("only a compensable effect is compensated")
			}
			next.Status, next.Phase, next.DueAt = StatusPending, PhaseCompensation, &at
		case NextReconcile:
			next.Status, next.DueAt = StatusNeedsReconciliation, nil
		}
	case *CompensationStartedData:
		if !(op.Status == StatusPending && op.Phase == PhaseCompensation) {
			return illegal("a compensation starts only when one is pending")
		}
		if e.Attempt != op.Attempt {
			return illegal(fmt.Sprintf("compensation must be of attempt %d", op.Attempt))
		}
		lease := d.LeaseUntil.UTC()
		next.Status = StatusInProgress
		next.LeaseOwner, next.LeaseUntil, next.DueAt = d.Worker, &lease, nil
	case *CompensationSucceededData:
		next.LeaseOwner, next.LeaseUntil = "", nil
		next.Compensations++
		next.Phase = PhaseAttempt
		next.LastOutcomeAt = &at
		if d.RetryAt != nil {
			next.Status, next.DueAt = StatusPending, utcPtr(*d.RetryAt)
		} else {
			next.Status, next.DueAt = StatusCompensated, nil
		}
	case *CompensationFailedData:
		next.LeaseOwner, next.LeaseUntil, next.DueAt = "", nil, nil
		next.Status = StatusNeedsReconciliation
		next.LastErrorClass = d.ErrorClass
		next.LastOutcomeAt = &at
	case *ReconciliationResolvedData:
		switch op.Status {
		case StatusNeedsReconciliation, StatusEscalated, StatusInProgress, StatusPending:
		default:
			return illegal("nothing to reconcile")
		}
		next.LeaseOwner, next.LeaseUntil = "", nil
		next.Phase = PhaseAttempt
		switch {
		case d.Found:
			next.Status, next.DueAt = StatusCompleted, nil
			next.Result, next.DownstreamID = d.Result, d.DownstreamID
			next.LastErrorClass = ""
		case d.RetryAt != nil:
			next.Status, next.DueAt = StatusPending, utcPtr(*d.RetryAt)
			if undoMayHaveRun(op) {
				// A retry under the same key could be answered with the
				// undone effect's stored result, so it goes out under a new
				// key.
				next.Compensations++
			}
		default:
			// Provably absent, but the class forbids a blind retry: a human
			// decides; the escalation event follows.
			next.Status, next.DueAt = StatusNeedsReconciliation, nil
		}
	case *EscalationData:
		switch op.Status {
		case StatusNeedsReconciliation, StatusPending, StatusInProgress, StatusEscalated:
		default:
			return illegal("a finished operation is not escalated")
		}
		next.Status, next.DueAt = StatusEscalated, nil
		next.LeaseOwner, next.LeaseUntil = "", nil
		esc := *d
		next.Escalation = &esc
		next.Approvals = nil // a new question: approvals are counted afresh
	case *DecisionData:
		if !op.Status.AwaitingDecision() {
			return illegal("the operation is not waiting for a decision")
		}
		next.Escalation = nil
		switch d.Action {
		case ActionRecordSuccess:
			next.Status, next.Phase, next.DueAt = StatusCompleted, PhaseAttempt, nil
			next.LastErrorClass = ""
			if d.DownstreamID != "" {
				next.DownstreamID = d.DownstreamID
			}
			if len(d.Result) > 0 {
				next.Result = d.Result
			}
		case ActionRetry:
			if d.RetryAt == nil {
				return illegal("a retry decision needs retry_at")
			}
			if esc := op.Escalation; esc != nil && esc.Reason == ReasonApprovalRequired {
				// The gate counts distinct approvers; until there are
				// enough, the operation keeps waiting with its evidence.
				next.Approvals = appendDistinct(op.Approvals, d.Approver)
				if len(next.Approvals) < max(esc.Approvers, 1) {
					next.Escalation = esc
					return next, nil
				}
			}
			next.Status, next.Phase, next.DueAt = StatusPending, PhaseAttempt, utcPtr(*d.RetryAt)
			next.Approved = true
			if undoMayHaveRun(op) {
				next.Compensations++ // as for a resolution: never retry under an undone key
			}
		case ActionCompensate:
			if op.EffectClass != Compensable {
				return illegal("only a compensable effect is compensated")
			}
			if op.Attempt == 0 {
				return illegal("nothing to compensate before the first attempt")
			}
			next.Status, next.Phase, next.DueAt = StatusPending, PhaseCompensation, &at
		case ActionAbandon:
			next.Status, next.Phase, next.DueAt = StatusFailed, PhaseAttempt, nil
			next.LastErrorClass = "abandoned"
		}
	}
	return next, nil
}

// outcomeApplies reports whether an outcome event of type t is the report of
// the step now running.
func outcomeApplies(op Operation, t Type) bool {
	if op.Status != StatusInProgress {
		return false
	}
	switch t {
	case AttemptSucceeded, AttemptFailed, AttemptUnknown:
		return op.Phase == PhaseAttempt
	case CompensationSucceeded, CompensationFailed:
		return op.Phase == PhaseCompensation
	}
	return false
}

// successResolves reports whether a late success of the current attempt
// settles the operation: it is unresolved and the attempt was not undone.
func successResolves(op Operation) bool {
	if op.DownstreamKey != DownstreamKeyFor(op.Key, op.Compensations) {
		return false // the attempt was compensated: its effect no longer stands
	}
	switch op.Status {
	case StatusNeedsReconciliation, StatusEscalated:
		return op.Phase == PhaseAttempt
	case StatusPending:
		return op.Phase == PhaseAttempt && op.Attempt > 0
	}
	return false
}

// undoMayHaveRun reports whether op is in its compensation phase with the
// current attempt's key not yet retired.
func undoMayHaveRun(op Operation) bool {
	return op.Phase == PhaseCompensation && op.Attempt > 0 &&
		op.DownstreamKey == DownstreamKeyFor(op.Key, op.Compensations)
}

// appendDistinct returns list with s added unless it is there already; list
// itself is never modified, since records share it.
func appendDistinct(list []string, s string) []string {
	for _, v := range list {
		if v == s {
			return list
		}
	}
	return append(append([]string(nil), list...), s)
}

func utcPtr(t time.Time) *time.Time {
	u := t.UTC()
	return &u
}
