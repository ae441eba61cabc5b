// Package events is effectline's shared vocabulary: effect classes, outcomes,
// operation statuses, event types, the event envelope and its strict decoder,
// canonical JSON, and the pure fold of an operation's events into its record.
//
// Everything else in effectline depends on this package and it depends only on
// the standard library, so producers and consumers in any component agree on
// one definition of every word in the contract (contract §1–§4).
package events

import "fmt"

// EffectClass says what may be done when the outcome of a call is unknown.
// It belongs to the effect, not to the HTTP verb.
type EffectClass string

const (
	// Idempotent effects may be retried blindly within the caps.
	Idempotent EffectClass = "idempotent"
	// Compensable effects are undone before a retry under a new downstream key.
	Compensable EffectClass = "compensable"
	// Irreversible effects are never retried after an unknown outcome.
	Irreversible EffectClass = "irreversible"
)

// EffectClasses lists every effect class.
func EffectClasses() []EffectClass { return []EffectClass{Idempotent, Compensable, Irreversible} }

// Valid reports whether c is one of EffectClasses.
func (c EffectClass) Valid() bool {
	switch c {
	case Idempotent, Compensable, Irreversible:
		return true
	}
	return false
}

// Outcome is how one attempt ended (contract §2).
type Outcome string

const (
	// Succeeded: the downstream confirmed the effect.
	Succeeded Outcome = "succeeded"
	// Failed: confirmed no effect.
	Failed Outcome = "failed"
	// Unknown: the effect may have happened. Never collapsed into Failed.
	Unknown Outcome = "unknown"
)

// FailureKind says whether a confirmed failure may be retried.
type FailureKind string

const (
	// Retryable failures (429, 503, never sent) left no effect and may be retried.
	Retryable FailureKind = "retryable"
	// Final failures (400, 401, 403, 422, rejected args) are not retried.
	Final FailureKind = "final"
)

// Status is the state of an operation (contract §3).
type Status string

const (
	StatusPending             Status = "pending"
	StatusInProgress          Status = "in_progress"
	StatusCompleted           Status = "completed"
	StatusFailed              Status = "failed"
	StatusCompensated         Status = "compensated"
	StatusNeedsReconciliation Status = "needs_reconciliation"
	StatusEscalated           Status = "escalated"
)

// Statuses lists every status.
func Statuses() []Status {
	return []Status{StatusPending, StatusInProgress, StatusCompleted, StatusFailed,
		StatusCompensated, StatusNeedsReconciliation, StatusEscalated}
}

// Valid reports whether s is one of Statuses.
func (s Status) Valid() bool {
	for _, v := range Statuses() {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether nothing more happens to the operation without a
// new intent. Compensated is terminal: the effect was undone and the retry
// budget is spent.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCompensated
}

// AwaitingDecision reports whether a human decision may be recorded.
func (s Status) AwaitingDecision() bool {
	return s == StatusEscalated || s == StatusNeedsReconciliation
}

// Type is an event type name (contract, contract §4).
type Type string

const (
	IntentRecorded         Type = "intent.recorded"
	AttemptStarted         Type = "attempt.started"
	AttemptSucceeded       Type = "attempt.succeeded"
	AttemptFailed          Type = "attempt.failed"
	AttemptUnknown         Type = "attempt.unknown"
	CompensationStarted    Type = "compensation.started"
	CompensationSucceeded  Type = "compensation.succeeded"
	CompensationFailed     Type = "compensation.failed"
	ReconciliationResolved Type = "reconciliation.resolved"
	OperationEscalated     Type = "operation.escalated"
	DecisionRecorded       Type = "decision.recorded"
	// IntentRejected extends the contract: a second intent under an existing
	// key with other args. It is journaled so the history shows it, and it
	// changes nothing else.
	IntentRejected Type = "intent.rejected"
)

// Types lists every event type.
func Types() []Type {
	return []Type{IntentRecorded, AttemptStarted, AttemptSucceeded, AttemptFailed,
		AttemptUnknown, CompensationStarted, CompensationSucceeded, CompensationFailed,
		ReconciliationResolved, OperationEscalated, DecisionRecorded, IntentRejected}
}

// Valid reports whether t is one of Types.
func (t Type) Valid() bool {
	for _, v := range Types() {
		if t == v {
			return true
		}
	}
	return false
}

// HasAttempt reports whether events of this type belong to one attempt and
// so carry an attempt number.
func (t Type) HasAttempt() bool {
	switch t {
	case AttemptStarted, AttemptSucceeded, AttemptFailed, AttemptUnknown,
		CompensationStarted, CompensationSucceeded, CompensationFailed:
		return true
	}
	return false
}

// Action is a decision an approver records (contract §4, approval gate).
type Action string

const (
	ActionRecordSuccess Action = "record_success"
	ActionRetry         Action = "retry"
	ActionCompensate    Action = "compensate"
	ActionAbandon       Action = "abandon"
)

// Actions lists every decision action.
func Actions() []Action {
	return []Action{ActionRecordSuccess, ActionRetry, ActionCompensate, ActionAbandon}
}

// ParseAction returns the action named s.
func ParseAction(s string) (Action, error) {
	for _, a := range Actions() {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown action %q (want record_success, retry, compensate or abandon)", s)
}

// Topic names (contract): a topic's full name is a prefix, by default
// DefaultTopicPrefix, and one of these suffixes.
const (
	TopicIntents     = "intents"
	TopicOutcomes    = "outcomes"
	TopicEscalations = "escalations"
	// TopicIntentsDLQ holds copies of the messages on the intents topic
	// that could never become an operation (dead letters).
	TopicIntentsDLQ = TopicIntents + ".dlq"
)

// DefaultTopicPrefix is the prefix of the contract's topic names; a
// deployment may replace it.
const DefaultTopicPrefix = "effectline."

// TopicFor says which topic an event is published to, by its suffix. The
// intent goes to the executor's topic and also to outcomes, so a consumer of
// outcomes sees every operation's stream from seq 1 without gaps.
func TopicsFor(t Type) []string {
	switch t {
	case IntentRecorded:
		return []string{TopicIntents, TopicOutcomes}
	case OperationEscalated:
		return []string{TopicOutcomes, TopicEscalations}
	}
	return []string{TopicOutcomes}
}
