package reconciler_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
)

// escalatedOp builds an operation the reconciler escalated after finding
// its attempt absent, as the events would say.
func escalatedOp(t *testing.T, e *env, key, toolName string) events.Operation {
	t.Helper()
	op := started(t, e.st, e.newIntent(t, key, toolName, `{"amount":7}`), time.Now().Add(time.Minute))
	op = unknownOutcome(t, e.st, op, events.NextReconcile, "timeout_after_send")
	return appendEvents(t, e.st, op,
		spec{events.ReconciliationResolved, 0, &events.ReconciliationResolvedData{Source: reconciler.SourceReconcile}},
		spec{events.OperationEscalated, 0, &events.EscalationData{Reason: reconciler.ReasonAbsentDownstream,
			Request: []byte(`{}`), ProposedAction: events.ActionRetry}})
}

func TestDecide(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := time.Now().UTC().Truncate(time.Microsecond)

	t.Run("each action", func(t *testing.T) {
		tests := []struct {
			action events.Action
			tool   string
			want   func(events.Operation) bool
		}{
			{events.ActionRecordSuccess, charge, func(op events.Operation) bool {
				return op.Status == events.StatusCompleted && op.DueAt == nil
			}},
			{events.ActionRetry, charge, func(op events.Operation) bool {
				return op.Status == events.StatusPending && op.Phase == events.PhaseAttempt && op.Approved &&
					op.DueAt != nil && op.DueAt.Equal(now)
			}},
			{events.ActionCompensate, reserve, func(op events.Operation) bool {
				return op.Status == events.StatusPending && op.Phase == events.PhaseCompensation && op.DueAt != nil
			}},
			{events.ActionAbandon, charge, func(op events.Operation) bool {
				return op.Status == events.StatusFailed && op.LastErrorClass == "abandoned"
			}},
		}
		for _, tt := range tests {
			key := "decide/" + string(tt.action)
			escalatedOp(t, e, key, tt.tool)
			op, err := reconciler.Decide(t.Context(), e.st, key, tt.action, "checked downstream", "alice", now)
			if err != nil {
				t.Fatalf("%s: %v", tt.action, err)
			}
			if !tt.want(op) {
				t.Fatalf("%s: got %s/%s due %v approved %v", tt.action, op.Status, op.Phase, op.DueAt, op.Approved)
			}
			_, evs := journal(t, e.st, key)
			d := lastOf[events.DecisionData](t, evs, events.DecisionRecorded)
			if d.Action != tt.action || d.Approver != "alice" || d.Note != "checked downstream" {
				t.Fatalf("decision event = %+v", d)
			}
			if (d.RetryAt != nil) != (tt.action == events.ActionRetry) {
				t.Fatalf("%s: retry_at %v", tt.action, d.RetryAt)
			}
			checkReplay(t, e.st, key)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		done := escalatedOp(t, e, "decide/done", charge)
		if _, err := reconciler.Decide(t.Context(), e.st, done.Key, events.ActionRecordSuccess, "", "alice", now); err != nil {
			t.Fatal(err)
		}
		_, err := reconciler.Decide(t.Context(), e.st, done.Key, events.ActionRetry, "", "bob", now)
		var nw *reconciler.NotWaitingError
		if !errors.Is(err, events.ErrNotWaiting) || !errors.As(err, &nw) || nw.Status != events.StatusCompleted {
			t.Fatalf("decision on a completed operation: %v, want events.ErrNotWaiting (completed)", err)
		}

		running := started(t, e.st, e.newIntent(t, "decide/running", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		if _, err := reconciler.Decide(t.Context(), e.st, running.Key, events.ActionAbandon, "", "alice", now); !errors.Is(err, events.ErrNotWaiting) {
			t.Fatalf("decision on a running operation: %v, want events.ErrNotWaiting", err)
		}

		irreversible := escalatedOp(t, e, "decide/irreversible", charge)
		if _, err := reconciler.Decide(t.Context(), e.st, irreversible.Key, events.ActionCompensate, "", "alice", now); !errors.Is(err, events.ErrInvalidDecision) {
			t.Fatalf("compensate on an irreversible effect: %v, want events.ErrInvalidDecision", err)
		}

		// A compensable tool that requires approval is escalated before its
		// first attempt: nothing to undo yet.
		gate := appendEvents(t, e.st, e.newIntent(t, "decide/gate", reserve, `{"amount":1}`),
			spec{events.OperationEscalated, 0, &events.EscalationData{Reason: "approval_required",
				Request: []byte(`{}`), ProposedAction: events.ActionRetry}})
		if _, err := reconciler.Decide(t.Context(), e.st, gate.Key, events.ActionCompensate, "", "alice", now); !errors.Is(err, events.ErrInvalidDecision) {
			t.Fatalf("compensate before any attempt: %v, want events.ErrInvalidDecision", err)
		}
		if _, err := reconciler.Decide(t.Context(), e.st, irreversible.Key, "undo", "", "alice", now); !errors.Is(err, events.ErrInvalidDecision) {
			t.Fatalf("unknown action: %v, want events.ErrInvalidDecision", err)
		}
		if _, err := reconciler.Decide(t.Context(), e.st, irreversible.Key, events.ActionRetry, "", "", now); !errors.Is(err, events.ErrInvalidDecision) {
			t.Fatalf("no approver: %v, want events.ErrInvalidDecision", err)
		}
		if _, err := reconciler.Decide(t.Context(), e.st, "decide/nope", events.ActionRetry, "", "alice", now); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown key: %v, want store.ErrNotFound", err)
		}
		// Nothing refused was journaled.
		for _, key := range []string{irreversible.Key, gate.Key} {
			if n := countType(journalTypes(t, e, key), events.DecisionRecorded); n != 0 {
				t.Fatalf("%s: %d decisions journaled by refused calls", key, n)
			}
		}
	})

	// Two approvers at once: both decide from the same record, one append
	// wins, the other reloads and finds the operation decided.
	t.Run("concurrent approvers", func(t *testing.T) {
		op := escalatedOp(t, e, "decide/race", charge)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, a := range []events.Action{events.ActionRetry, events.ActionAbandon} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = reconciler.Decide(t.Context(), e.st, op.Key, a, "", "approver", now)
			}()
		}
		wg.Wait()
		ok, notWaiting := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, events.ErrNotWaiting):
				notWaiting++
			default:
				t.Fatal(err)
			}
		}
		if ok != 1 || notWaiting != 1 {
			t.Fatalf("%d decisions recorded, %d refused as not waiting; want 1 and 1", ok, notWaiting)
		}
		if n := countType(journalTypes(t, e, op.Key), events.DecisionRecorded); n != 1 {
			t.Fatalf("%d decisions journaled, want 1", n)
		}
	})
}
