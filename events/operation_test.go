package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// step is one event of a test history before its seq and time are assigned:
// a history's n-th step gets seq n and occurred_at at(n), so every timestamp
// the fold writes is predictable.
type step struct {
	typ     events.Type
	attempt int
	data    any
}

var intentArgs = json.RawMessage(`{"amount":1299,"currency":"EUR"}`)

func intentStep() step {
	return step{events.IntentRecorded, 0, events.IntentData{Args: intentArgs, Principal: "billing-agent"}}
}

func rejectedStep() step {
	return step{events.IntentRejected, 0, events.IntentRejectedData{Reason: "payload_conflict", PayloadHash: strings.Repeat("0f", 32)}}
}

func startedStep(n int, downstreamKey string) step {
	return step{events.AttemptStarted, n, events.AttemptStartedData{DownstreamKey: downstreamKey, Worker: "executor-0", LeaseUntil: leaseAt}}
}

func succeededStep(n int) step {
	return step{events.AttemptSucceeded, n, events.AttemptSucceededData{
		StatusCode: 201, Result: json.RawMessage(`{"id":"ch_1"}`), DownstreamID: "ch_1", UndoRef: "undo_ch_1"}}
}

func failedStep(n int, kind events.FailureKind, retry *time.Time) step {
	class := "http_422"
	if kind == events.Retryable {
		class = "http_503"
	}
	return step{events.AttemptFailed, n, events.AttemptFailedData{Kind: kind, ErrorClass: class, RetryAt: retry}}
}

func unknownStep(n int, next events.Next, retry *time.Time) step {
	return step{events.AttemptUnknown, n, events.AttemptUnknownData{ErrorClass: "timeout", Next: next, RetryAt: retry}}
}

func compStartedStep(n int) step {
	return step{events.CompensationStarted, n, events.CompensationStartedData{DownstreamKey: testKey, Worker: "executor-1", LeaseUntil: leaseAt}}
}

func compSucceededStep(n int, retry *time.Time) step {
	return step{events.CompensationSucceeded, n, events.CompensationSucceededData{StatusCode: 200, RetryAt: retry}}
}

func compFailedStep(n int) step {
	return step{events.CompensationFailed, n, events.CompensationFailedData{Outcome: events.Unknown, ErrorClass: "undo_timeout"}}
}

func resolvedStep(found bool, retry *time.Time) step {
	d := events.ReconciliationResolvedData{Source: "reconcile", RetryAt: retry}
	if found {
		d.Found, d.Result, d.DownstreamID = true, json.RawMessage(`{"id":"ch_9"}`), "ch_9"
	}
	return step{events.ReconciliationResolved, 0, d}
}

func escalationData(proposed events.Action) events.EscalationData {
	return events.EscalationData{Reason: "unknown_outcome", Request: json.RawMessage(`{"amount":1299}`), ProposedAction: proposed}
}

func escalatedStep(proposed events.Action) step {
	return step{events.OperationEscalated, 0, escalationData(proposed)}
}

func decisionStep(a events.Action, retry *time.Time) step {
	return step{events.DecisionRecorded, 0, events.DecisionData{Action: a, Approver: "alice", RetryAt: retry}}
}

// hist concatenates history parts into a fresh slice, so histories built
// from a shared prefix never alias each other.
func hist(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// The starting states that matter, as the histories that reach them.
var (
	hPending0       = []step{intentStep()}
	hRunning1       = hist(hPending0, []step{startedStep(1, testKey)})
	hRetryDue1      = hist(hRunning1, []step{failedStep(1, events.Retryable, &retryAt)})
	hRunning2       = hist(hRetryDue1, []step{startedStep(2, testKey)})
	hCompleted      = hist(hRunning1, []step{succeededStep(1)})
	hFailed         = hist(hRunning1, []step{failedStep(1, events.Final, nil)})
	hNeedsRec       = hist(hRunning1, []step{unknownStep(1, events.NextReconcile, nil)})
	hEscalated      = hist(hNeedsRec, []step{escalatedStep(events.ActionRecordSuccess)})
	hCompPending    = hist(hRunning1, []step{unknownStep(1, events.NextCompensate, nil)})
	hCompRunning    = hist(hCompPending, []step{compStartedStep(1)})
	hCompensated    = hist(hCompRunning, []step{compSucceededStep(1, nil)})
	hUndoneRetryDue = hist(hCompRunning, []step{compSucceededStep(1, &retryAt)})
	hCompNeedsRec   = hist(hCompRunning, []step{compFailedStep(1)})
	hCompEscalated  = hist(hCompNeedsRec, []step{escalatedStep(events.ActionCompensate)})
	hEscalated0     = hist(hPending0, []step{escalatedStep(events.ActionRetry)})
)

// envAt builds the envelope of s as the event with the given seq.
func envAt(tb testing.TB, class events.EffectClass, seq int64, s step) events.Envelope {
	tb.Helper()
	return mustNew(tb, s.typ, testKey, seq, class, s.attempt, s.data, at(seq))
}

// foldSteps folds a history; the history must be legal.
func foldSteps(tb testing.TB, class events.EffectClass, steps []step) events.Operation {
	tb.Helper()
	evs := make([]events.Envelope, len(steps))
	for i, s := range steps {
		evs[i] = envAt(tb, class, int64(i+1), s)
	}
	op, err := events.Fold(evs)
	if err != nil {
		tb.Fatalf("folding the history: %v", err)
	}
	return op
}

// assertIllegal checks that err is a transition error for e and that Apply
// handed back the record it was given.
func assertIllegal(t *testing.T, before, after events.Operation, e events.Envelope, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("Apply accepted %s (seq %d) on %s/%s; want an illegal transition", e.Type, e.Seq, before.Status, before.Phase)
	}
	if !errors.Is(err, events.ErrIllegalTransition) {
		t.Fatalf("error %v does not wrap ErrIllegalTransition", err)
	}
	var te *events.TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("error %v is not a *TransitionError", err)
	}
	if te.From != before.Status || te.Phase != before.Phase || te.Event != e.Type || te.Seq != e.Seq {
		t.Errorf("TransitionError = %+v; want From %q Phase %q Event %q Seq %d", te, before.Status, before.Phase, e.Type, e.Seq)
	}
	if te.Reason == "" || !strings.Contains(err.Error(), te.Reason) {
		t.Errorf("TransitionError %q has no reason in its message", err)
	}
	if !reflect.DeepEqual(after, before) {
		t.Errorf("an illegal transition changed the record:\n got %+v\nwant %+v", after, before)
	}
}

func TestDownstreamKeyFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		compensations int
		want          string
	}{
		{0, "k"},
		{1, "k~c1"},
		{2, "k~c2"},
		{10, "k~c10"},
	}
	for _, tt := range tests {
		if got := events.DownstreamKeyFor("k", tt.compensations); got != tt.want {
			t.Errorf("DownstreamKeyFor(k, %d) = %q; want %q", tt.compensations, got, tt.want)
		}
	}
}

// TestApplyTransitions walks the state machine transition by transition.
// For a legal event, want turns a copy of the record before the event into
// the exact record expected after it (Seq and UpdatedAt are set for every
// event and need not be repeated), so a case also proves that nothing it
// does not mention changed. A nil want means the event is illegal there.
func TestApplyTransitions(t *testing.T) {
	t.Parallel()
	type mutate func(o *events.Operation, at time.Time)
	evidence := func(o *events.Operation, _ time.Time) { o.Evidence++ }
	completedWith := func(result, id, undo string) mutate {
		return func(o *events.Operation, at time.Time) {
			o.Status, o.Phase = events.StatusCompleted, events.PhaseAttempt
			o.Result, o.DownstreamID, o.UndoRef = json.RawMessage(result), id, undo
			o.LeaseOwner, o.LeaseUntil, o.DueAt = "", nil, nil
			o.LastErrorClass, o.LastFailure = "", nil
			o.LastOutcomeAt = timePtr(at)
		}
	}
	succeeded := completedWith(`{"id":"ch_1"}`, "ch_1", "undo_ch_1")
	resolvedFound := func(o *events.Operation, _ time.Time) {
		o.Status, o.Phase, o.DueAt = events.StatusCompleted, events.PhaseAttempt, nil
		o.Result, o.DownstreamID = json.RawMessage(`{"id":"ch_9"}`), "ch_9"
		o.LeaseOwner, o.LeaseUntil = "", nil
		o.LastErrorClass = ""
	}
	escalated := func(proposed events.Action) mutate {
		return func(o *events.Operation, _ time.Time) {
			esc := escalationData(proposed)
			o.Status, o.DueAt, o.Escalation = events.StatusEscalated, nil, &esc
			o.LeaseOwner, o.LeaseUntil = "", nil
		}
	}
	cet := time.FixedZone("CET", 3600)

	tests := []struct {
		name    string
		class   events.EffectClass
		history []step
		event   step
		want    mutate
	}{
		// intent.recorded
		{"intent creates a pending operation due after the pickup grace", events.Irreversible, nil, intentStep(),
			func(o *events.Operation, at time.Time) {
				hash, err := events.PayloadHash(intentArgs)
				if err != nil {
					panic(err)
				}
				*o = events.Operation{
					Key: testKey, Tool: testTool, EffectClass: events.Irreversible,
					PayloadHash: hash, Principal: "billing-agent", Args: intentArgs,
					Status: events.StatusPending, Phase: events.PhaseAttempt,
					DueAt:     timePtr(at.Add(events.IntentPickupGrace)),
					CreatedAt: at,
				}
			}},
		{"second intent is illegal", events.Irreversible, hPending0, intentStep(), nil},
		{"intent on a completed operation is illegal", events.Irreversible, hCompleted, intentStep(), nil},

		// intent.rejected is journaled as evidence in any state.
		{"rejected intent on pending is evidence", events.Irreversible, hPending0, rejectedStep(), evidence},
		{"rejected intent on completed is evidence", events.Irreversible, hCompleted, rejectedStep(), evidence},
		{"rejected intent on escalated is evidence", events.Irreversible, hEscalated, rejectedStep(), evidence},

		// attempt.started
		{"first attempt starts from pending", events.Irreversible, hPending0, startedStep(1, testKey),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Attempt = events.StatusInProgress, 1
				o.LeaseOwner, o.LeaseUntil, o.DueAt = "executor-0", timePtr(leaseAt), nil
				o.DownstreamKey = testKey
				o.FirstAttemptAt, o.LastAttemptAt = timePtr(at), timePtr(at)
			}},
		{"second attempt keeps the first attempt time and the last error", events.Idempotent, hRetryDue1, startedStep(2, testKey),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Attempt = events.StatusInProgress, 2
				o.LeaseOwner, o.LeaseUntil, o.DueAt = "executor-0", timePtr(leaseAt), nil
				o.LastAttemptAt = timePtr(at)
			}},
		{"attempt after an undo carries the new downstream key", events.Compensable, hUndoneRetryDue, startedStep(2, testKey+"~c1"),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Attempt = events.StatusInProgress, 2
				o.LeaseOwner, o.LeaseUntil, o.DueAt = "executor-0", timePtr(leaseAt), nil
				o.DownstreamKey = testKey + "~c1"
				o.LastAttemptAt = timePtr(at)
			}},
		{"lease in another zone is stored in UTC", events.Idempotent, hPending0,
			step{events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: testKey, Worker: "w", LeaseUntil: leaseAt.In(cet)}},
			func(o *events.Operation, at time.Time) {
				o.Status, o.Attempt = events.StatusInProgress, 1
				o.LeaseOwner, o.LeaseUntil, o.DueAt = "w", timePtr(leaseAt), nil
				o.DownstreamKey = testKey
				o.FirstAttemptAt, o.LastAttemptAt = timePtr(at), timePtr(at)
			}},
		{"attempt number may not skip", events.Idempotent, hPending0, startedStep(2, testKey), nil},
		{"attempt number may not repeat", events.Idempotent, hRetryDue1, startedStep(1, testKey), nil},
		{"attempt does not start while one runs", events.Idempotent, hRunning1, startedStep(2, testKey), nil},
		{"attempt does not start while a compensation is pending", events.Compensable, hCompPending, startedStep(2, testKey), nil},
		{"attempt does not start on completed", events.Idempotent, hCompleted, startedStep(2, testKey), nil},
		{"attempt does not start on needs_reconciliation", events.Irreversible, hNeedsRec, startedStep(2, testKey), nil},
		{"attempt does not start on escalated", events.Irreversible, hEscalated, startedStep(2, testKey), nil},

		// attempt.succeeded
		{"success completes the running attempt", events.Irreversible, hRunning1, succeededStep(1), succeeded},
		{"success clears the last error class", events.Idempotent, hRunning2, succeededStep(2), succeeded},
		{"late success of an older attempt is evidence", events.Idempotent, hRunning2, succeededStep(1), evidence},
		{"success of a future attempt is illegal", events.Idempotent, hRunning1, succeededStep(2), nil},
		{"success before any attempt is illegal", events.Idempotent, hPending0, succeededStep(1), nil},
		{"duplicate success is evidence", events.Idempotent, hCompleted, succeededStep(1), evidence},
		{"late success of the current attempt resolves needs_reconciliation", events.Irreversible, hNeedsRec, succeededStep(1), succeeded},
		// The escalation stays on the record: the success settles the
		// operation, it does not erase what the human was shown.
		{"late success of the current attempt resolves escalated", events.Irreversible, hEscalated, succeededStep(1), succeeded},
		{"late success of the current attempt resolves a pending retry", events.Idempotent, hRetryDue1, succeededStep(1), succeeded},
		{"success while a compensation is pending is evidence", events.Compensable, hCompPending, succeededStep(1), evidence},
		{"success while a compensation runs is evidence", events.Compensable, hCompRunning, succeededStep(1), evidence},
		{"success after a failed compensation is evidence", events.Compensable, hCompNeedsRec, succeededStep(1), evidence},
		{"success on compensated is evidence", events.Compensable, hCompensated, succeededStep(1), evidence},
		{"success on failed is evidence", events.Idempotent, hFailed, succeededStep(1), evidence},

		// attempt.failed
		{"final failure fails the operation", events.Irreversible, hRunning1, failedStep(1, events.Final, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusFailed, nil
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "http_422", timePtr(at)
				o.LastFailure = &events.Failure{Kind: events.Final}
			}},
		{"retryable failure with retry_at is pending and due then, in UTC", events.Irreversible, hRunning1,
			failedStep(1, events.Retryable, timePtr(retryAt.In(cet))),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusPending, timePtr(retryAt)
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "http_503", timePtr(at)
				o.LastFailure = &events.Failure{Kind: events.Retryable}
			}},
		{"retryable failure without retry_at (caps spent) fails", events.Idempotent, hRunning1, failedStep(1, events.Retryable, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusFailed, nil
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "http_503", timePtr(at)
				o.LastFailure = &events.Failure{Kind: events.Retryable}
			}},
		{"late failure of an older attempt is evidence", events.Idempotent, hRunning2, failedStep(1, events.Final, nil), evidence},
		{"failure when nothing runs is evidence", events.Irreversible, hNeedsRec, failedStep(1, events.Final, nil), evidence},
		{"failure on completed is evidence", events.Irreversible, hCompleted, failedStep(1, events.Final, nil), evidence},
		{"failure of a future attempt is illegal", events.Idempotent, hRunning1, failedStep(2, events.Final, nil), nil},

		// attempt.unknown
		{"unknown with retry is pending and due", events.Idempotent, hRunning1, unknownStep(1, events.NextRetry, &retryAt),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusPending, timePtr(retryAt)
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "timeout", timePtr(at)
			}},
		{"unknown with retry but no retry_at is illegal", events.Idempotent, hRunning1, unknownStep(1, events.NextRetry, nil), nil},
		{"unknown with compensate is a compensation due now", events.Compensable, hRunning1, unknownStep(1, events.NextCompensate, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseCompensation, timePtr(at)
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "timeout", timePtr(at)
			}},
		{"unknown with compensate on irreversible is illegal", events.Irreversible, hRunning1, unknownStep(1, events.NextCompensate, nil), nil},
		{"unknown with compensate on idempotent is illegal", events.Idempotent, hRunning1, unknownStep(1, events.NextCompensate, nil), nil},
		{"unknown with reconcile needs reconciliation", events.Irreversible, hRunning1, unknownStep(1, events.NextReconcile, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusNeedsReconciliation, nil
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "timeout", timePtr(at)
			}},
		{"unknown on completed is evidence", events.Irreversible, hCompleted, unknownStep(1, events.NextReconcile, nil), evidence},
		{"late unknown of an older attempt is evidence", events.Idempotent, hRunning2, unknownStep(1, events.NextRetry, &retryAt), evidence},
		{"unknown of a future attempt is illegal", events.Idempotent, hRunning1, unknownStep(2, events.NextReconcile, nil), nil},

		// compensation.started
		{"compensation starts when pending", events.Compensable, hCompPending, compStartedStep(1),
			func(o *events.Operation, _ time.Time) {
				o.Status = events.StatusInProgress
				o.LeaseOwner, o.LeaseUntil, o.DueAt = "executor-1", timePtr(leaseAt), nil
			}},
		{"compensation of another attempt is illegal", events.Compensable, hCompPending, compStartedStep(2), nil},
		{"compensation does not start without a pending one", events.Compensable, hRetryDue1, compStartedStep(1), nil},
		{"compensation does not start twice", events.Compensable, hCompRunning, compStartedStep(1), nil},
		{"compensation does not start on needs_reconciliation", events.Compensable, hCompNeedsRec, compStartedStep(1), nil},

		// compensation.succeeded
		{"undone with retry_at is a retry under the next key", events.Compensable, hCompRunning, compSucceededStep(1, &retryAt),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseAttempt, timePtr(retryAt)
				o.Compensations = 1
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastOutcomeAt = timePtr(at)
			}},
		{"undone without retry_at is compensated", events.Compensable, hCompRunning, compSucceededStep(1, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusCompensated, events.PhaseAttempt, nil
				o.Compensations = 1
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastOutcomeAt = timePtr(at)
			}},
		{"undo report while the attempt runs is evidence", events.Compensable, hRunning1, compSucceededStep(1, nil), evidence},
		{"undo report before the undo started is evidence", events.Compensable, hCompPending, compSucceededStep(1, nil), evidence},
		{"undo report for a future attempt is illegal", events.Compensable, hCompRunning, compSucceededStep(2, nil), nil},

		// compensation.failed
		{"failed undo needs reconciliation", events.Compensable, hCompRunning, compFailedStep(1),
			func(o *events.Operation, at time.Time) {
				o.Status, o.DueAt = events.StatusNeedsReconciliation, nil
				o.LeaseOwner, o.LeaseUntil = "", nil
				o.LastErrorClass, o.LastOutcomeAt = "undo_timeout", timePtr(at)
			}},
		{"failed undo report while the attempt runs is evidence", events.Compensable, hRunning1, compFailedStep(1), evidence},

		// reconciliation.resolved
		{"found completes needs_reconciliation", events.Irreversible, hNeedsRec, resolvedStep(true, nil), resolvedFound},
		{"found completes escalated", events.Irreversible, hEscalated, resolvedStep(true, nil), resolvedFound},
		{"found by a webhook completes a running attempt", events.Irreversible, hRunning1, resolvedStep(true, nil), resolvedFound},
		{"found by a webhook completes a pending operation", events.Irreversible, hPending0, resolvedStep(true, nil), resolvedFound},
		{"found after a failed undo completes", events.Compensable, hCompNeedsRec, resolvedStep(true, nil), resolvedFound},
		{"absent with retry_at is a pending retry", events.Idempotent, hNeedsRec, resolvedStep(false, &retryAt),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseAttempt, timePtr(retryAt)
			}},
		{"absent after a failed undo with retry_at retries under a new key", events.Compensable, hCompNeedsRec, resolvedStep(false, &retryAt),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseAttempt, timePtr(retryAt)
				o.Compensations++ // the undo may have run: the undone key is retired
			}},
		{"absent without retry_at still needs a decision", events.Irreversible, hNeedsRec, resolvedStep(false, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusNeedsReconciliation, events.PhaseAttempt, nil
			}},
		{"absent without retry_at on escalated goes back to needs_reconciliation", events.Irreversible, hEscalated, resolvedStep(false, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusNeedsReconciliation, events.PhaseAttempt, nil
			}},
		{"nothing to reconcile on completed", events.Irreversible, hCompleted, resolvedStep(true, nil), nil},
		{"nothing to reconcile on failed", events.Irreversible, hFailed, resolvedStep(false, nil), nil},
		{"nothing to reconcile on compensated", events.Compensable, hCompensated, resolvedStep(true, nil), nil},

		// operation.escalated
		{"escalated from needs_reconciliation", events.Irreversible, hNeedsRec, escalatedStep(events.ActionRecordSuccess), escalated(events.ActionRecordSuccess)},
		{"escalated from pending stops the due time", events.Irreversible, hPending0, escalatedStep(events.ActionAbandon), escalated(events.ActionAbandon)},
		{"escalated from in_progress drops the lease", events.Irreversible, hRunning1, escalatedStep(events.ActionRetry), escalated(events.ActionRetry)},
		{"escalated again replaces the evidence", events.Irreversible, hEscalated, escalatedStep(events.ActionAbandon), escalated(events.ActionAbandon)},
		{"escalated from a pending compensation", events.Compensable, hCompPending, escalatedStep(events.ActionCompensate), escalated(events.ActionCompensate)},
		{"completed is not escalated", events.Irreversible, hCompleted, escalatedStep(events.ActionRetry), nil},
		{"failed is not escalated", events.Irreversible, hFailed, escalatedStep(events.ActionRetry), nil},
		{"compensated is not escalated", events.Compensable, hCompensated, escalatedStep(events.ActionRetry), nil},

		// decision.recorded
		{"record_success completes", events.Irreversible, hEscalated, decisionStep(events.ActionRecordSuccess, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusCompleted, events.PhaseAttempt, nil
				o.LastErrorClass, o.Escalation = "", nil
			}},
		{"record_success on needs_reconciliation completes", events.Irreversible, hNeedsRec, decisionStep(events.ActionRecordSuccess, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusCompleted, events.PhaseAttempt, nil
				o.LastErrorClass = ""
			}},
		{"retry is an approved pending attempt", events.Irreversible, hEscalated, decisionStep(events.ActionRetry, &retryAt),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseAttempt, timePtr(retryAt)
				o.Approved, o.Escalation = true, nil
			}},
		{"retry after a failed undo retries under a new key", events.Compensable, hCompEscalated, decisionStep(events.ActionRetry, &retryAt),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseAttempt, timePtr(retryAt)
				o.Approved, o.Escalation = true, nil
				o.Compensations++
			}},
		{"retry without retry_at is illegal", events.Irreversible, hEscalated, decisionStep(events.ActionRetry, nil), nil},
		{"compensate is a compensation due now", events.Compensable, hEscalated, decisionStep(events.ActionCompensate, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseCompensation, timePtr(at)
				o.Escalation = nil
			}},
		{"compensate after a failed undo tries the undo again", events.Compensable, hCompEscalated, decisionStep(events.ActionCompensate, nil),
			func(o *events.Operation, at time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusPending, events.PhaseCompensation, timePtr(at)
				o.Escalation = nil
			}},
		{"compensate on irreversible is illegal", events.Irreversible, hEscalated, decisionStep(events.ActionCompensate, nil), nil},
		{"compensate on idempotent is illegal", events.Idempotent, hEscalated, decisionStep(events.ActionCompensate, nil), nil},
		{"compensate before any attempt is illegal", events.Compensable, hEscalated0, decisionStep(events.ActionCompensate, nil), nil},
		{"abandon fails the operation", events.Irreversible, hEscalated, decisionStep(events.ActionAbandon, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusFailed, events.PhaseAttempt, nil
				o.LastErrorClass, o.Escalation = "abandoned", nil
			}},
		{"abandon before any attempt fails the operation", events.Irreversible, hEscalated0, decisionStep(events.ActionAbandon, nil),
			func(o *events.Operation, _ time.Time) {
				o.Status, o.Phase, o.DueAt = events.StatusFailed, events.PhaseAttempt, nil
				o.LastErrorClass, o.Escalation = "abandoned", nil
			}},
		{"decision on completed is illegal", events.Irreversible, hCompleted, decisionStep(events.ActionRecordSuccess, nil), nil},
		{"decision on failed is illegal", events.Irreversible, hFailed, decisionStep(events.ActionRetry, &retryAt), nil},
		{"decision on compensated is illegal", events.Compensable, hCompensated, decisionStep(events.ActionAbandon, nil), nil},
		{"decision on pending is illegal", events.Irreversible, hPending0, decisionStep(events.ActionAbandon, nil), nil},
		{"decision on in_progress is illegal", events.Irreversible, hRunning1, decisionStep(events.ActionRecordSuccess, nil), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			before := foldSteps(t, tt.class, tt.history)
			seq := int64(len(tt.history) + 1)
			e := envAt(t, tt.class, seq, tt.event)
			after, err := events.Apply(before, e)
			if tt.want == nil {
				assertIllegal(t, before, after, e, err)
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			want := before
			tt.want(&want, at(seq))
			want.Seq, want.UpdatedAt = seq, at(seq)
			if !reflect.DeepEqual(after, want) {
				t.Errorf("after %s on %s/%s:\n got %s\nwant %s", e.Type, before.Status, before.Phase, dump(after), dump(want))
			}
			// Apply is pure: the record it was given is untouched.
			if again := foldSteps(t, tt.class, tt.history); !reflect.DeepEqual(before, again) {
				t.Errorf("Apply changed its input record:\n got %s\nwant %s", dump(before), dump(again))
			}
		})
	}
}

func dump(o events.Operation) string {
	b, err := json.Marshal(o)
	if err != nil {
		return fmt.Sprintf("%+v", o)
	}
	return string(b)
}

// matrixEvent is one column of the transition matrix: an event built
// relative to the record it is applied to, so each column means the same
// thing in every row ("the current attempt succeeded").
type matrixEvent struct {
	name string
	mk   func(op events.Operation) step
}

func matrixEvents() []matrixEvent {
	cur := func(op events.Operation) int { return max(op.Attempt, 1) }
	return []matrixEvent{
		{"intent.recorded", func(events.Operation) step { return intentStep() }},
		{"intent.rejected", func(events.Operation) step { return rejectedStep() }},
		{"attempt.started next", func(op events.Operation) step { return startedStep(op.Attempt+1, testKey) }},
		{"attempt.succeeded", func(op events.Operation) step { return succeededStep(cur(op)) }},
		{"attempt.failed final", func(op events.Operation) step { return failedStep(cur(op), events.Final, nil) }},
		{"attempt.failed retryable retry_at", func(op events.Operation) step { return failedStep(cur(op), events.Retryable, &retryAt) }},
		{"attempt.failed retryable spent", func(op events.Operation) step { return failedStep(cur(op), events.Retryable, nil) }},
		{"attempt.unknown retry", func(op events.Operation) step { return unknownStep(cur(op), events.NextRetry, &retryAt) }},
		{"attempt.unknown compensate", func(op events.Operation) step { return unknownStep(cur(op), events.NextCompensate, nil) }},
		{"attempt.unknown reconcile", func(op events.Operation) step { return unknownStep(cur(op), events.NextReconcile, nil) }},
		{"compensation.started", func(op events.Operation) step { return compStartedStep(cur(op)) }},
		{"compensation.succeeded retry_at", func(op events.Operation) step { return compSucceededStep(cur(op), &retryAt) }},
		{"compensation.succeeded", func(op events.Operation) step { return compSucceededStep(cur(op), nil) }},
		{"compensation.failed", func(op events.Operation) step { return compFailedStep(cur(op)) }},
		{"reconciliation.resolved found", func(events.Operation) step { return resolvedStep(true, nil) }},
		{"reconciliation.resolved absent retry_at", func(events.Operation) step { return resolvedStep(false, &retryAt) }},
		{"reconciliation.resolved absent", func(events.Operation) step { return resolvedStep(false, nil) }},
		{"operation.escalated", func(events.Operation) step { return escalatedStep(events.ActionRetry) }},
		{"decision record_success", func(events.Operation) step { return decisionStep(events.ActionRecordSuccess, nil) }},
		{"decision retry", func(events.Operation) step { return decisionStep(events.ActionRetry, &retryAt) }},
		{"decision compensate", func(events.Operation) step { return decisionStep(events.ActionCompensate, nil) }},
		{"decision abandon", func(events.Operation) step { return decisionStep(events.ActionAbandon, nil) }},
	}
}

// TestApplyMatrix applies every event type (and every variant the fold
// branches on) to every starting state, and checks the kind of result:
// T a transition (the exact records are checked by TestApplyTransitions),
// E evidence only (Evidence+1, nothing else changes), I illegal (a
// *TransitionError and the record unchanged). A grid makes a hole in the
// state machine visible at a glance; spaces only group the columns:
//
//	intents | started | 7 attempt outcomes | comp.started | 3 comp outcomes | 3 reconciliations | escalated | 4 decisions
func TestApplyMatrix(t *testing.T) {
	t.Parallel()
	cols := matrixEvents()
	rows := []struct {
		name    string
		class   events.EffectClass
		history []step
		grid    string
		// bugs names cells whose grid value is the intended behaviour but
		// not yet the actual one (a bug in operation.go, reported to its
		// owner); the cell is skipped while the bug stands and fails once it
		// is fixed, so the note cannot go stale.
		bugs map[int]string
	}{
		{"new", events.Compensable, nil, "TI I IIIIIII I III III I IIII", nil},
		{"pending/attempt#0", events.Compensable, hPending0, "IE T IIIIIII I III TTT T IIII", nil},
		{"in_progress/attempt#1", events.Compensable, hRunning1, "IE I TTTTTTT I EEE TTT T IIII", nil},
		{"in_progress/attempt#2", events.Compensable, hRunning2, "IE I TTTTTTT I EEE TTT T IIII", nil},
		{"pending/attempt#1 retry due", events.Compensable, hRetryDue1, "IE T TEEEEEE I EEE TTT T IIII", nil},
		{"completed", events.Compensable, hCompleted, "IE I EEEEEEE I EEE III I IIII", nil},
		{"failed", events.Compensable, hFailed, "IE I EEEEEEE I EEE III I IIII", nil},
		{"needs_reconciliation/attempt", events.Compensable, hNeedsRec, "IE I TEEEEEE I EEE TTT T TTTT", nil},
		{"escalated/attempt", events.Compensable, hEscalated, "IE I TEEEEEE I EEE TTT T TTTT", nil},
		{"escalated before any attempt", events.Compensable, hEscalated0, "IE I IIIIIII I III TTT T TTIT", nil},
		{"pending/compensation", events.Compensable, hCompPending, "IE I EEEEEEE T EEE TTT T IIII", nil},
		{"in_progress/compensation", events.Compensable, hCompRunning, "IE I EEEEEEE I TTT TTT T IIII", nil},
		{"compensated", events.Compensable, hCompensated, "IE I EEEEEEE I EEE III I IIII", nil},
		{"pending/attempt#1 after undo", events.Compensable, hUndoneRetryDue, "IE T EEEEEEE I EEE TTT T IIII", nil},
		{"needs_reconciliation/compensation", events.Compensable, hCompNeedsRec, "IE I EEEEEEE I EEE TTT T TTTT", nil},
		{"escalated/compensation", events.Compensable, hCompEscalated, "IE I EEEEEEE I EEE TTT T TTTT", nil},
		// The class only matters where something would be compensated.
		{"irreversible in_progress", events.Irreversible, hRunning1, "IE I TTTTTIT I EEE TTT T IIII", nil},
		{"idempotent in_progress", events.Idempotent, hRunning1, "IE I TTTTTIT I EEE TTT T IIII", nil},
		{"irreversible needs_reconciliation", events.Irreversible, hNeedsRec, "IE I TEEEEEE I EEE TTT T TTIT", nil},
		{"idempotent escalated", events.Idempotent, hEscalated, "IE I TEEEEEE I EEE TTT T TTIT", nil},
	}
	for _, row := range rows {
		grid := strings.ReplaceAll(row.grid, " ", "")
		if len(grid) != len(cols) {
			t.Fatalf("row %q has %d cells; want %d", row.name, len(grid), len(cols))
		}
		for i, col := range cols {
			want := grid[i]
			t.Run(row.name+"/"+col.name, func(t *testing.T) {
				t.Parallel()
				before := foldSteps(t, row.class, row.history)
				e := envAt(t, row.class, before.Seq+1, col.mk(before))
				after, err := events.Apply(before, e)
				got := classify(before, after, err)
				if bug, ok := row.bugs[i]; ok {
					if got == want {
						t.Fatalf("known bug fixed (%s): remove it from the bugs of row %q", bug, row.name)
					}
					t.Skipf("known bug: %s (want %c, got %c)", bug, want, got)
				}
				if got != want {
					t.Fatalf("%s on %s: got %c (err %v); want %c", col.name, row.name, got, err, want)
				}
				switch want {
				case 'I':
					assertIllegal(t, before, after, e, err)
				case 'E':
					evidence := before
					evidence.Seq, evidence.UpdatedAt, evidence.Evidence = e.Seq, at(e.Seq), before.Evidence+1
					if !reflect.DeepEqual(after, evidence) {
						t.Errorf("evidence changed more than the count:\n got %s\nwant %s", dump(after), dump(evidence))
					}
				}
			})
		}
	}
}

// classify names the kind of result Apply gave: I, E or T.
func classify(before, after events.Operation, err error) byte {
	if err != nil {
		return 'I'
	}
	evidence := before
	evidence.Seq, evidence.UpdatedAt, evidence.Evidence = after.Seq, after.UpdatedAt, before.Evidence+1
	if reflect.DeepEqual(after, evidence) {
		return 'E'
	}
	return 'T'
}

// TestApplyRejectsOutOfOrderAndForeignEvents: the per-operation sequence is
// the claim, so a gap, a replay or another operation's event must never
// fold in.
func TestApplyRejectsOutOfOrderAndForeignEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		history []step
		event   func(tb testing.TB) events.Envelope
	}{
		{"gap", hPending0, func(tb testing.TB) events.Envelope {
			return envAt(tb, events.Idempotent, 3, startedStep(1, testKey))
		}},
		{"replayed seq", hRunning1, func(tb testing.TB) events.Envelope {
			return envAt(tb, events.Idempotent, 2, startedStep(1, testKey))
		}},
		{"older seq", hRunning1, func(tb testing.TB) events.Envelope {
			return envAt(tb, events.Idempotent, 1, intentStep())
		}},
		{"seq 0 on a new operation", nil, func(tb testing.TB) events.Envelope {
			return envAt(tb, events.Idempotent, 0, intentStep())
		}},
		{"intent with seq 2 on a new operation", nil, func(tb testing.TB) events.Envelope {
			return envAt(tb, events.Idempotent, 2, intentStep())
		}},
		{"another operation's event", hRunning1, func(tb testing.TB) events.Envelope {
			s := succeededStep(1)
			return mustNew(tb, s.typ, testKey+"-other", 3, events.Idempotent, 1, s.data, at(3))
		}},
		{"another operation's late report", hCompleted, func(tb testing.TB) events.Envelope {
			s := succeededStep(1)
			return mustNew(tb, s.typ, "other", 4, events.Idempotent, 1, s.data, at(4))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			before := foldSteps(t, events.Idempotent, tt.history)
			e := tt.event(t)
			after, err := events.Apply(before, e)
			assertIllegal(t, before, after, e, err)
		})
	}
}

// TestApplyRejectsInvalidData: Apply decodes the data itself, so an event
// that bypassed Decode cannot fold a half-valid body in; the error is a
// decoding error, not a transition error.
func TestApplyRejectsInvalidData(t *testing.T) {
	t.Parallel()
	before := foldSteps(t, events.Idempotent, hRunning1)
	tests := []struct {
		name string
		typ  events.Type
		data any
	}{
		{"failure without kind", events.AttemptFailed, map[string]any{"error_class": "x"}},
		{"unknown without next", events.AttemptUnknown, map[string]any{"error_class": "x"}},
		{"unknown field", events.AttemptSucceeded, map[string]any{"status_code": 200, "surprise": true}},
		{"data is an array", events.AttemptSucceeded, []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := mustNew(t, tt.typ, testKey, 3, events.Idempotent, 1, tt.data, at(3))
			after, err := events.Apply(before, e)
			if !errors.Is(err, events.ErrInvalidEvent) || !events.IsInvalidEvent(err) {
				t.Fatalf("Apply error = %v; want an invalid event", err)
			}
			if errors.Is(err, events.ErrIllegalTransition) {
				t.Errorf("invalid data reported as an illegal transition: %v", err)
			}
			if !reflect.DeepEqual(after, before) {
				t.Errorf("invalid data changed the record")
			}
		})
	}
}

// TestFoldScenarios folds whole histories the executor writes and checks
// the record a reader sees, including the downstream key of each attempt.
func TestFoldScenarios(t *testing.T) {
	t.Parallel()
	r2 := retryAt.Add(time.Minute)
	tests := []struct {
		name    string
		class   events.EffectClass
		history []step
		check   func(t *testing.T, op events.Operation)
	}{
		{"compensable: two undos then success under ~c2", events.Compensable, hist(hUndoneRetryDue, []step{
			startedStep(2, events.DownstreamKeyFor(testKey, 1)),
			unknownStep(2, events.NextCompensate, nil),
			compStartedStep(2),
			compSucceededStep(2, &r2),
			startedStep(3, events.DownstreamKeyFor(testKey, 2)),
			succeededStep(3),
		}), func(t *testing.T, op events.Operation) {
			if op.Status != events.StatusCompleted || op.Attempt != 3 || op.Compensations != 2 {
				t.Errorf("got %s attempt %d compensations %d; want completed attempt 3 compensations 2", op.Status, op.Attempt, op.Compensations)
			}
			if op.DownstreamKey != testKey+"~c2" || events.DownstreamKeyFor(op.Key, op.Compensations) != op.DownstreamKey {
				t.Errorf("downstream key %q; want %q", op.DownstreamKey, testKey+"~c2")
			}
			if !op.FirstAttemptAt.Equal(at(2)) || !op.LastAttemptAt.Equal(at(10)) {
				t.Errorf("attempt times %v..%v; want %v..%v", op.FirstAttemptAt, op.LastAttemptAt, at(2), at(10))
			}
		}},
		{"irreversible: unknown, escalated, approved retry, success", events.Irreversible, hist(hEscalated, []step{
			decisionStep(events.ActionRetry, &retryAt),
			startedStep(2, testKey),
			succeededStep(2),
		}), func(t *testing.T, op events.Operation) {
			if op.Status != events.StatusCompleted || !op.Approved || op.Escalation != nil || op.Attempt != 2 {
				t.Errorf("got %s approved %v escalation %v attempt %d", op.Status, op.Approved, op.Escalation, op.Attempt)
			}
		}},
		{"lost lease: late reports after a newer attempt are only evidence", events.Idempotent, hist(hRunning1, []step{
			unknownStep(1, events.NextRetry, &retryAt), // the sweeper declared attempt 1 unknown
			startedStep(2, testKey),
			failedStep(1, events.Final, nil), // the old worker reports late
			succeededStep(1),
			succeededStep(2),
			rejectedStep(),
		}), func(t *testing.T, op events.Operation) {
			if op.Status != events.StatusCompleted || op.Evidence != 3 || op.Seq != 8 {
				t.Errorf("got %s evidence %d seq %d; want completed evidence 3 seq 8", op.Status, op.Evidence, op.Seq)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.check(t, foldSteps(t, tt.class, tt.history))
		})
	}
}

// TestFoldStopsAtFirstIllegalEvent: Fold returns the record as of the last
// good event together with the error, so a caller can report where a
// history went wrong.
func TestFoldStopsAtFirstIllegalEvent(t *testing.T) {
	t.Parallel()
	good := []events.Envelope{
		envAt(t, events.Idempotent, 1, intentStep()),
		envAt(t, events.Idempotent, 2, startedStep(1, testKey)),
	}
	bad := envAt(t, events.Idempotent, 3, startedStep(2, testKey))
	after := envAt(t, events.Idempotent, 4, succeededStep(1))
	want, err := events.Fold(good)
	if err != nil {
		t.Fatal(err)
	}
	got, err := events.Fold(append(good, bad, after))
	if !errors.Is(err, events.ErrIllegalTransition) {
		t.Fatalf("Fold error = %v; want an illegal transition", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Fold returned %s; want the record before the illegal event %s", dump(got), dump(want))
	}
}

// TestApplyRandomSequences is a property test: random event sequences,
// mostly near-legal so they reach deep states, never panic; a rejected
// event leaves the record unchanged; Fold equals applying the events one by
// one; and the record's invariants hold after every accepted event.
func TestApplyRandomSequences(t *testing.T) {
	t.Parallel()
	const sequences, maxLen = 1500, 40
	for seed := range uint64(sequences) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		// Half compensable: only that class reaches the undo paths.
		class := events.Compensable
		if r.IntN(2) == 0 {
			class = []events.EffectClass{events.Idempotent, events.Irreversible}[r.IntN(2)]
		}
		var (
			op       events.Operation
			all      []events.Envelope // everything generated, in order
			accepted []events.Envelope
			firstErr error
			atErr    events.Operation
		)
		n := 1 + r.IntN(maxLen)
		for range n {
			e := randomEvent(t, r, op, class)
			all = append(all, e)
			next, err := applyNoPanic(t, op, e, seed)
			if err != nil {
				if !reflect.DeepEqual(next, op) {
					t.Fatalf("seed %d: rejected %s (%v) changed the record", seed, e.Type, err)
				}
				if firstErr == nil {
					firstErr, atErr = err, op
				}
				continue
			}
			// Apply is deterministic.
			if again, err := events.Apply(op, e); err != nil || !reflect.DeepEqual(again, next) {
				t.Fatalf("seed %d: Apply is not deterministic for %s", seed, e.Type)
			}
			checkInvariants(t, seed, op, next, e, len(accepted)+1)
			accepted = append(accepted, e)
			op = next
		}
		folded, err := events.Fold(accepted)
		if err != nil || !reflect.DeepEqual(folded, op) {
			t.Fatalf("seed %d: Fold(accepted) = %s, %v; want %s", seed, dump(folded), err, dump(op))
		}
		// Fold over everything stops at the first rejected event with the
		// record as it stood just before it.
		folded, err = events.Fold(all)
		if firstErr == nil {
			if err != nil || !reflect.DeepEqual(folded, op) {
				t.Fatalf("seed %d: Fold(all) = %v; want the same record as one by one", seed, err)
			}
		} else if err == nil || err.Error() != firstErr.Error() || !reflect.DeepEqual(folded, atErr) {
			t.Fatalf("seed %d: Fold(all) error %v; want %v and the record before it", seed, err, firstErr)
		}
	}
}

func applyNoPanic(t *testing.T, op events.Operation, e events.Envelope, seed uint64) (next events.Operation, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("seed %d: Apply panicked on %s seq %d attempt %d: %v", seed, e.Type, e.Seq, e.Attempt, p)
		}
	}()
	return events.Apply(op, e)
}

// randomEvent draws an event near what the record can take: mostly the
// next seq and an attempt number around the current one, now and then a
// gap, a replay or another operation's key.
func randomEvent(tb testing.TB, r *rand.Rand, op events.Operation, class events.EffectClass) events.Envelope {
	tb.Helper()
	var s step
	cols := matrixEvents()
	switch {
	case op.Seq == 0 && r.IntN(10) < 9:
		s = intentStep()
	case r.IntN(3) < 2:
		// Most draws are a transition the record can take, so sequences
		// walk deep (compensations, second undos, decisions) instead of
		// stalling on rejected events.
		s = cols[r.IntN(len(cols))].mk(op)
		for _, i := range r.Perm(len(cols)) {
			c := cols[i].mk(op)
			e := mustNew(tb, c.typ, testKey, op.Seq+1, class, c.attempt, c.data, at(op.Seq+1))
			next, err := events.Apply(op, e)
			// Terminal states absorb a sequence, so they are taken less often.
			if err == nil && classify(op, next, err) == 'T' && (!next.Status.Terminal() || r.IntN(5) == 0) {
				s = c
				break
			}
		}
	default:
		s = cols[r.IntN(len(cols))].mk(op)
		if s.typ.HasAttempt() && r.IntN(4) == 0 {
			s.attempt = max(0, op.Attempt+r.IntN(4)-2)
		}
	}
	seq := op.Seq + 1
	if r.IntN(20) == 0 {
		seq += int64(r.IntN(5) - 2)
	}
	key := testKey
	if r.IntN(30) == 0 {
		key = "other"
	}
	when := t0.Add(time.Duration(r.IntN(100000)) * time.Millisecond)
	return mustNew(tb, s.typ, key, seq, class, s.attempt, s.data, when)
}

// checkInvariants states what every reader of the record relies on.
func checkInvariants(t *testing.T, seed uint64, prev, op events.Operation, e events.Envelope, accepted int) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, after %s (seq %d, attempt %d) on %s/%s: %s\nrecord %s",
			seed, e.Type, e.Seq, e.Attempt, prev.Status, prev.Phase, fmt.Sprintf(format, args...), dump(op))
	}
	if op.Seq != int64(accepted) {
		fail("seq %d after %d accepted events", op.Seq, accepted)
	}
	if !op.Status.Valid() {
		fail("invalid status %q", op.Status)
	}
	if op.Phase != events.PhaseAttempt && op.Phase != events.PhaseCompensation {
		fail("invalid phase %q", op.Phase)
	}
	if op.Key == "" || op.EffectClass == "" || op.PayloadHash == "" || (prev.Status != "" && op.Key != prev.Key) {
		fail("identity lost")
	}
	if op.Attempt < prev.Attempt || op.Compensations < prev.Compensations || op.Evidence < prev.Evidence {
		fail("a counter went backwards")
	}
	if op.Compensations > op.Attempt {
		fail("%d compensations for %d attempts", op.Compensations, op.Attempt)
	}
	if (op.DueAt != nil) != (op.Status == events.StatusPending) {
		fail("due_at %v with status %s: only a pending operation is due", op.DueAt, op.Status)
	}
	if (op.LeaseUntil != nil) != (op.Status == events.StatusInProgress) || (op.LeaseOwner != "") && op.LeaseUntil == nil {
		fail("lease %v/%q with status %s: only a running step holds a lease", op.LeaseUntil, op.LeaseOwner, op.Status)
	}
	if op.Phase == events.PhaseCompensation && op.EffectClass != events.Compensable {
		fail("compensation phase on a %s effect", op.EffectClass)
	}
	if op.Status == events.StatusCompleted && op.Phase != events.PhaseAttempt {
		fail("completed in phase %s", op.Phase)
	}
	if op.Status == events.StatusInProgress && op.Attempt == 0 {
		fail("in progress before any attempt")
	}
}
