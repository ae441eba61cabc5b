package events

import (
	"encoding/json"
	"time"
)

// Envelope is the one JSON shape of every event (contract, contract §4). Data
// holds the type-specific body, whose Go shape is the matching *Data struct
// below.
type Envelope struct {
	EventID      string          `json:"event_id"`
	Type         Type            `json:"type"`
	OperationKey string          `json:"operation_key"`
	Seq          int64           `json:"seq"`
	OccurredAt   time.Time       `json:"occurred_at"`
	Tool         string          `json:"tool"`
	EffectClass  EffectClass     `json:"effect_class"`
	Attempt      int             `json:"attempt,omitempty"`
	Data         json.RawMessage `json:"data"`
}

// IntentData is the data of intent.recorded. A non-Go producer writes exactly
// this envelope, with seq 1, to the intents topic.
type IntentData struct {
	Args      json.RawMessage `json:"args"`
	Principal string          `json:"principal"`
	// PayloadHash is set only on the public copy of an intent (see
	// PublicIntent), whose args are redacted: the hash of the args as
	// recorded, which the redacted ones no longer give. A producer to the
	// intents topic never sets it.
	PayloadHash string `json:"payload_hash,omitempty"`
}

// IntentRejectedData is the data of intent.rejected.
type IntentRejectedData struct {
	Reason      string `json:"reason"`
	PayloadHash string `json:"payload_hash"`
	Principal   string `json:"principal,omitempty"`
	EventID     string `json:"rejected_event_id,omitempty"`
}

// AttemptStartedData is the data of attempt.started: the claim of one attempt.
type AttemptStartedData struct {
	DownstreamKey string    `json:"downstream_key"`
	Worker        string    `json:"worker"`
	LeaseUntil    time.Time `json:"lease_until"`
	// BackoffWaitedMS is how long the operation waited for this attempt since
	// the previous outcome, for the trace and the timeline.
	BackoffWaitedMS int64 `json:"backoff_waited_ms,omitempty"`
}

// AttemptSucceededData is the data of attempt.succeeded.
type AttemptSucceededData struct {
	StatusCode   int             `json:"status_code,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	DownstreamID string          `json:"downstream_id,omitempty"`
	UndoRef      string          `json:"undo_ref,omitempty"`
	// Late marks an outcome reported by a worker that had lost its lease. It
	// is evidence: an effect that happened is never dropped.
	Late bool `json:"late,omitempty"`
	// Precondition is the evidence of the execution-time check made before
	// the attempt was sent (what was asked, the answer, the verdict).
	Precondition json.RawMessage `json:"precondition,omitempty"`
}

// AttemptFailedData is the data of attempt.failed: confirmed no effect.
type AttemptFailedData struct {
	Kind       FailureKind `json:"kind"`
	ErrorClass string      `json:"error_class"`
	Error      string      `json:"error,omitempty"`
	StatusCode int         `json:"status_code,omitempty"`
	// RetryAt is when the next attempt is due; absent when none will follow.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	Late    bool       `json:"late,omitempty"`
	// Precondition is the evidence of the execution-time check; when it did
	// not pass, nothing was sent and this is why the attempt failed.
	Precondition json.RawMessage `json:"precondition,omitempty"`
	// Response is the downstream's own answer to a rejected request (its
	// body, sensitive values redacted, at most MaxResponseBytes), so the
	// agent that asked can correct its input.
	Response json.RawMessage `json:"response,omitempty"`
}

// MaxResponseBytes caps the downstream answer journaled on a failed
// attempt: enough for any validation message, small enough that a chatty
// error page does not bloat every record that carries it.
const MaxResponseBytes = 4 << 10

// Next says what the executor decided after an unknown outcome.
type Next string

const (
	NextRetry      Next = "retry"      // idempotent: retry with the same key
	NextCompensate Next = "compensate" // compensable: undo, then retry under a new key
	NextReconcile  Next = "reconcile"  // ask the downstream (irreversible, or caps exhausted)
)

// AttemptUnknownData is the data of attempt.unknown: the effect may have happened.
type AttemptUnknownData struct {
	ErrorClass string     `json:"error_class"`
	Error      string     `json:"error,omitempty"`
	StatusCode int        `json:"status_code,omitempty"`
	Next       Next       `json:"next"`
	RetryAt    *time.Time `json:"retry_at,omitempty"`
	Late       bool       `json:"late,omitempty"`
	// Precondition is the evidence of the check that passed before the
	// attempt was sent.
	Precondition json.RawMessage `json:"precondition,omitempty"`
}

// CompensationStartedData is the data of compensation.started.
type CompensationStartedData struct {
	DownstreamKey string    `json:"downstream_key"`
	DownstreamID  string    `json:"downstream_id,omitempty"`
	Worker        string    `json:"worker"`
	LeaseUntil    time.Time `json:"lease_until"`
}

// CompensationSucceededData is the data of compensation.succeeded.
type CompensationSucceededData struct {
	StatusCode int `json:"status_code,omitempty"`
	// RetryAt is when the retry under a new key is due; absent when the caps
	// are spent and the operation ends compensated.
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

// CompensationFailedData is the data of compensation.failed: the undo failed
// or its outcome is unknown, so whether the effect stands is unknown.
type CompensationFailedData struct {
	Outcome    Outcome `json:"outcome"`
	ErrorClass string  `json:"error_class"`
	Error      string  `json:"error,omitempty"`
	StatusCode int     `json:"status_code,omitempty"`
}

// ReconciliationResolvedData is the data of reconciliation.resolved: the
// downstream answered "did it happen?".
type ReconciliationResolvedData struct {
	Found        bool            `json:"found"`
	Result       json.RawMessage `json:"result,omitempty"`
	DownstreamID string          `json:"downstream_id,omitempty"`
	// Source names who answered: "reconcile" (the tool's query) or
	// "webhook:<source>" (a verified callback).
	Source string `json:"source"`
	// RetryAt is set when the effect is provably absent and the class allows
	// a retry.
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

// EscalationData is the data of operation.escalated: the evidence a human
// needs to decide.
type EscalationData struct {
	Reason         string          `json:"reason"`
	Request        json.RawMessage `json:"request"`
	Downstream     json.RawMessage `json:"downstream,omitempty"`
	ProposedAction Action          `json:"proposed_action"`
	Detail         string          `json:"detail,omitempty"`
	// Approvers is how many distinct approvers must decide retry before an
	// approval_required operation runs; 0 means one.
	Approvers int `json:"approvers,omitempty"`
}

// DecisionData is the data of decision.recorded.
type DecisionData struct {
	Action   Action `json:"action"`
	Note     string `json:"note,omitempty"`
	Approver string `json:"approver"`
	// RetryAt is set for a retry decision.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// DownstreamID and Result may come with record_success: what the
	// approver (or the decision-time re-check) saw downstream.
	DownstreamID string          `json:"downstream_id,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
}

// dataFor returns a pointer to a zero value of the Go shape of t's data.
func dataFor(t Type) any {
	switch t {
	case IntentRecorded:
		return &IntentData{}
	case IntentRejected:
		return &IntentRejectedData{}
	case AttemptStarted:
		return &AttemptStartedData{}
	case AttemptSucceeded:
		return &AttemptSucceededData{}
	case AttemptFailed:
		return &AttemptFailedData{}
	case AttemptUnknown:
		return &AttemptUnknownData{}
	case CompensationStarted:
		return &CompensationStartedData{}
	case CompensationSucceeded:
		return &CompensationSucceededData{}
	case CompensationFailed:
		return &CompensationFailedData{}
	case ReconciliationResolved:
		return &ReconciliationResolvedData{}
	case OperationEscalated:
		return &EscalationData{}
	case DecisionRecorded:
		return &DecisionData{}
	}
	return nil
}

// Spec is an operation's next event before it is numbered: what
// Following turns into envelopes.
type Spec struct {
	Type    Type
	Attempt int
	Data    any
}

// Following returns specs as the events that follow op's last one,
// numbered op.Seq+1, op.Seq+2, … in order and stamped now.
func Following(op Operation, now time.Time, specs ...Spec) ([]Envelope, error) {
	evs := make([]Envelope, len(specs))
	for i, s := range specs {
		ev, err := New(s.Type, op.Key, op.Seq+int64(i)+1, op.Tool, op.EffectClass, s.Attempt, s.Data, now)
		if err != nil {
			return nil, err
		}
		evs[i] = ev
	}
	return evs, nil
}
