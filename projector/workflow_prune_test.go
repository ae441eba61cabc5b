package projector_test

import (
	"errors"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
)

// Settled runs are pruned to tombstones, in either order with their
// operations: the step operations are pruned first (all but the one a
// running run still awaits), an escalated run whose operations are
// tombstones is still decided and unwound, and then the settled runs are
// pruned while the running one never is. Afterwards the read model holds
// exactly the live runs, a rebuild writes the same table, and replaying the
// workflows topic from offset 0 brings no pruned run back.
func TestPrunedRunsStayPrunedAndRebuildTheSame(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	live := h.start(projector.DefaultGroup, h.withWorkflows("wf-prune-live"))
	s := newSaga(h, h.prod)
	s.runAll() // two runs unwound, one running
	const stuck = "ord-stuck"
	s.start(stuck)
	s.settle(workflow.StepKey(stuck, "reserve", 0), true)
	s.advance()
	s.settle(workflow.StepKey(stuck, "charge", 0), true)
	s.advance()
	s.settle(workflow.StepKey(stuck, "confirm", 0), false)
	s.advance()
	if rec, err := s.svc.Get(ctx, stuck); err != nil || rec.Status != events.WorkflowEscalated {
		t.Fatalf("run %s: %s, %v; want escalated", stuck, rec.Status, err)
	}
	// The running run's first step settles while no driver runs: the run
	// still awaits it.
	awaited := workflow.StepKey(runRunning, "reserve", 0)
	s.settle(awaited, true)

	far := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	j := workflow.NewJournal(h.pool)
	pruneOps := func() int {
		t.Helper()
		if _, err := h.pool.Exec(ctx, `DELETE FROM outbox`); err != nil {
			t.Fatal(err)
		}
		total := 0
		tools, err := h.store.SettledTools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range tools {
			n, err := h.store.PruneSettled(ctx, tl, far, far, 100)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		return total
	}
	if pruneOps() == 0 {
		t.Fatal("no operation was pruned")
	}
	if op, err := h.store.Load(ctx, awaited); err != nil || op.Status != events.StatusCompleted {
		t.Fatalf("the operation a run awaits: %+v, %v; want it kept", op, err)
	}
	if _, err := h.store.Load(ctx, workflow.StepKey(stuck, "confirm", 0)); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("the escalated run's failed step: %v, want pruned", err)
	}
	// Nothing of the live runs may go yet: the escalated one waits for a
	// decision, the running one on its step.
	if n, err := j.PruneSettled(ctx, "order", far, far, 100); err != nil || n != 2 {
		t.Fatalf("pruned %d runs (err %v), want the 2 unwound ones", n, err)
	}
	for _, id := range []string{runRunning, stuck} {
		if _, err := s.svc.Get(ctx, id); err != nil {
			t.Fatalf("run %s after the prune: %v", id, err)
		}
	}

	// The escalated run reads its pruned operations' tombstones and is
	// unwound from its own record: its steps' results and downstream ids.
	rec, err := s.svc.Get(ctx, stuck)
	if err != nil {
		t.Fatal(err)
	}
	if o := rec.Operations[workflow.StepKey(stuck, "confirm", 0)]; !o.Pruned || o.Status != events.StatusFailed {
		t.Fatalf("a pruned step's operation in the run: %+v", o)
	}
	s.decide(stuck, events.WorkflowUnwind)
	s.settle(workflow.UndoKey(stuck, "charge", 0), true)
	s.advance()
	s.settle(workflow.UndoKey(stuck, "reserve", 0), true)
	s.advance()
	// The running run moves on from the operation kept for it.
	s.advance()
	if rec, err := s.svc.Get(ctx, runRunning); err != nil || rec.Current != "charge" {
		t.Fatalf("run %s: %+v, %v; want it at its charge", runRunning, rec, err)
	}
	if pruneOps() == 0 {
		t.Fatal("the awaited operation was not pruned once the run moved on")
	}
	if _, err := h.store.Load(ctx, awaited); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("%s: %v, want pruned now", awaited, err)
	}
	if n, err := j.PruneSettled(ctx, "order", far, far, 100); err != nil || n != 1 {
		t.Fatalf("pruned %d runs (err %v), want the unwound %s", n, err, stuck)
	}
	for _, id := range []string{runUnwound, runEscalated, stuck} {
		if _, err := s.svc.Get(ctx, id); !errors.Is(err, workflow.ErrPruned) || !errors.Is(err, workflow.ErrNotFound) {
			t.Fatalf("run %s: %v, want pruned", id, err)
		}
	}
	if n, err := j.CountTombstones(ctx); err != nil || n != 3 {
		t.Fatalf("%d run tombstones (err %v), want 3", n, err)
	}
	var left int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_events WHERE workflow_id <> $1`, runRunning).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d journaled events of pruned runs (err %v)", left, err)
	}

	liveHeads := map[string]int64{}
	for id, seq := range h.idSeqs(`SELECT workflow_id, seq FROM workflows WHERE pruned_at IS NULL`) {
		liveHeads[id] = seq
	}
	h.waitWorkflowSeqs(liveHeads)
	h.assertRowsAreTheHeads()
	live.stop()
	after := h.workflowSnapshot()

	rebuilt, err := projector.Rebuild(ctx, h.store, j)
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.Workflows != len(liveHeads) {
		t.Errorf("Rebuild wrote %d runs, want %d", rebuilt.Workflows, len(liveHeads))
	}
	assertSameTable(t, "workflow_state rebuilt after pruning", h.workflowSnapshot(), after)

	// The topic still holds every event of the pruned runs.
	var published int64
	for _, seq := range h.idSeqs(`SELECT workflow_id, (CASE WHEN pruned_at IS NULL THEN seq ELSE seq - 1 END) FROM workflows`) {
		published += seq
	}
	replay := h.start("replay-after-prune", h.withWorkflows("wf-prune-replay"))
	waitUntil(t, "the replay to handle every workflow event", func() bool {
		return replay.countStream(t, projector.StreamWorkflows, projector.OutcomeApplied)+
			replay.countStream(t, projector.StreamWorkflows, projector.OutcomeSkipped)+
			replay.countStream(t, projector.StreamWorkflows, projector.OutcomeRejected) >= published
	})
	replay.stop()
	assertSameTable(t, "workflow_state after a replay of the pruned runs' events", h.workflowSnapshot(), after)
}

// A projector's write racing the prune of the same run leaves the run
// pruned. The prune is held open in a transaction taking the locks its
// statement takes (the head row FOR UPDATE, the tombstone written, the
// state row deleted) while a flush writes the run's last record, as a live
// projector a moment behind the driver or a replay does. A write that
// checked the tombstone only in its snapshot (NOT EXISTS) waited for the
// deleted row and then inserted it again, once the prune had committed.
func TestAWriteRacingThePruneLeavesTheRunPruned(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	s := newSaga(h, nil)
	s.runAll()
	rec, err := s.svc.Get(ctx, runUnwound)
	if err != nil || rec.Status != events.WorkflowUnwound {
		t.Fatalf("run %s: %s, %v; want unwound", runUnwound, rec.Status, err)
	}
	if _, err := projector.WriteWorkflows(ctx, h.pool, rec); err != nil {
		t.Fatal(err)
	}

	prune, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer prune.Rollback(ctx)
	for _, sql := range []string{
		`SELECT 1 FROM workflows WHERE workflow_id = $1 FOR UPDATE`,
		`UPDATE workflows SET pruned_at = now(), seq = seq + 1 WHERE workflow_id = $1`,
		`DELETE FROM workflow_state WHERE workflow_id = $1`,
	} {
		if _, err := prune.Exec(ctx, sql, runUnwound); err != nil {
			t.Fatal(err)
		}
	}
	wrote := make(chan error, 1)
	go func() {
		ids, err := projector.WriteWorkflows(ctx, h.pool, rec)
		if err == nil && len(ids) > 0 {
			err = errors.New("the write wrote the row")
		}
		wrote <- err
	}()
	// The write waits on a lock the prune holds (the head row, or the
	// deleted state row), whichever form it takes.
	waitUntil(t, "the write to wait for the prune", func() bool {
		var n int
		err := h.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		 WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := prune.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Errorf("the racing write: %v", err)
	}
	var n int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_state WHERE workflow_id = $1`, runUnwound).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d workflow_state rows of the pruned run (err %v), want 0", n, err)
	}
}
