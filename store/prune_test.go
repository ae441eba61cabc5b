package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// next appends one event of type typ onto op and returns the new record.
func next(t *testing.T, s *store.Store, op events.Operation, typ events.Type, attempt int, data any) events.Operation {
	t.Helper()
	e, err := events.New(typ, op.Key, op.Seq+1, op.Tool, op.EffectClass, attempt, data, op.UpdatedAt.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Append(context.Background(), store.Append{Base: op, Events: []events.Envelope{e}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// completed journals an operation through to completed, with a
// downstream id.
func completed(t *testing.T, s *store.Store, key string) events.Operation {
	t.Helper()
	op := create(t, s, key)
	op = next(t, s, op, events.AttemptStarted, 1,
		events.AttemptStartedData{DownstreamKey: key, Worker: "w1", LeaseUntil: t0.Add(time.Minute)})
	return next(t, s, op, events.AttemptSucceeded, 1,
		events.AttemptSucceededData{StatusCode: 200, Result: json.RawMessage(`{"id":"ch_1"}`), DownstreamID: "ch_1"})
}

// relayed stands in for the relay: the outbox is drained, which the pruner
// waits for.
func relayed(t *testing.T, s *store.Store) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
}

// project stands in for the projector: a read-model row for op.
func project(t *testing.T, s *store.Store, op events.Operation) {
	t.Helper()
	rec, err := events.MarshalOperation(op)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Pool().Exec(context.Background(), `INSERT INTO operation_state (operation_key, tool, effect_class,
		payload_hash, principal, status, phase, attempt, last_seq, record, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		op.Key, op.Tool, op.EffectClass, op.PayloadHash, op.Principal, op.Status, op.Phase, op.Attempt, op.Seq, rec, op.CreatedAt, op.UpdatedAt)
	if err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, s *store.Store, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var farFuture = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)

func TestPruneLeavesATombstone(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	op := completed(t, s, "retention/1")
	project(t, s, op)

	// Still in the outbox: the relay reads the events it publishes from
	// the journal, so nothing is pruned yet.
	if n, err := s.PruneSettled(ctx, op.Tool, farFuture, t0, 10); err != nil || n != 0 {
		t.Fatalf("pruned %d (err %v) before the relay drained the outbox, want 0", n, err)
	}
	relayed(t, s)
	// Within its window: not yet.
	if n, err := s.PruneSettled(ctx, op.Tool, op.UpdatedAt, t0, 10); err != nil || n != 0 {
		t.Fatalf("pruned %d (err %v) inside the window, want 0", n, err)
	}
	prunedAt := time.Date(2026, 12, 30, 0, 0, 0, 0, time.UTC)
	if n, err := s.PruneSettled(ctx, op.Tool, op.UpdatedAt.Add(time.Microsecond), prunedAt, 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want 1", n, err)
	}
	if n := count(t, s, `SELECT count(*) FROM events WHERE operation_key = $1`, op.Key); n != 0 {
		t.Fatalf("%d events left", n)
	}
	if n := count(t, s, `SELECT count(*) FROM operation_state WHERE operation_key = $1`, op.Key); n != 0 {
		t.Fatal("the read-model row is left")
	}

	_, err := s.Load(ctx, op.Key)
	tomb, ok := store.AsPruned(err)
	if !ok || !errors.Is(err, store.ErrNotFound) || !errors.Is(err, store.ErrPruned) {
		t.Fatalf("Load = %v, want a *PrunedError wrapping ErrNotFound and ErrPruned", err)
	}
	want := store.Tombstone{
		OperationKey: op.Key, Tool: op.Tool, EffectClass: op.EffectClass, PayloadHash: op.PayloadHash,
		Principal: "billing-agent", Status: events.StatusCompleted, DownstreamID: "ch_1", Seq: op.Seq,
		CreatedAt: op.CreatedAt, SettledAt: op.UpdatedAt, PrunedAt: prunedAt,
	}
	if !tomb.CreatedAt.Equal(want.CreatedAt) || !tomb.SettledAt.Equal(want.SettledAt) || !tomb.PrunedAt.Equal(want.PrunedAt) {
		t.Fatalf("tombstone times = %+v, want %+v", tomb, want)
	}
	tomb.CreatedAt, tomb.SettledAt, tomb.PrunedAt = want.CreatedAt, want.SettledAt, want.PrunedAt
	if tomb != want {
		t.Fatalf("tombstone = %+v, want %+v", tomb, want)
	}
	if ts, err := s.Tombstones(ctx, []string{op.Key, "retention/none"}); err != nil || len(ts) != 1 || ts[op.Key].Status != events.StatusCompleted {
		t.Fatalf("Tombstones = %v, %v", ts, err)
	}
	if ops, err := s.LoadMany(ctx, []string{op.Key}); err != nil || len(ops) != 0 {
		t.Fatalf("LoadMany = %v, %v; want no live operation", ops, err)
	}

	// A duplicate intent conflicts with the tombstone, and so does a writer
	// that read the live record before the prune.
	if _, err := s.Append(ctx, store.Append{Events: []events.Envelope{intent(t, op.Key, `{"amount":1}`)}}); !store.IsConflict(err) {
		t.Fatalf("a duplicate intent after the prune: %v, want a conflict", err)
	}
	late, _ := events.New(events.AttemptSucceeded, op.Key, op.Seq+1, op.Tool, op.EffectClass, 1,
		events.AttemptSucceededData{StatusCode: 200, Late: true}, t0)
	if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{late}}); !store.IsConflict(err) {
		t.Fatalf("a late outcome after the prune: %v, want a conflict", err)
	}
	if n := count(t, s, `SELECT count(*) FROM events WHERE operation_key = $1`, op.Key); n != 0 {
		t.Fatalf("%d events written onto the tombstone", n)
	}
	// Pruning again finds nothing.
	if n, err := s.PruneSettled(ctx, op.Tool, farFuture, prunedAt, 10); err != nil || n != 0 {
		t.Fatalf("pruned %d again (err %v)", n, err)
	}
}

// TestPruneNeverTakesUnsettled: pending, in progress, needs reconciliation
// and escalated operations stay, however old.
func TestPruneNeverTakesUnsettled(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	pending := create(t, s, "unsettled/pending")
	inProgress := next(t, s, create(t, s, "unsettled/in_progress"), events.AttemptStarted, 1,
		events.AttemptStartedData{DownstreamKey: "unsettled/in_progress", Worker: "w1", LeaseUntil: t0.Add(time.Minute)})
	unknown := func(key string) events.Operation {
		op := next(t, s, create(t, s, key), events.AttemptStarted, 1,
			events.AttemptStartedData{DownstreamKey: key, Worker: "w1", LeaseUntil: t0.Add(time.Minute)})
		return next(t, s, op, events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout", Next: events.NextReconcile})
	}
	needsRec := unknown("unsettled/needs_reconciliation")
	escalated := next(t, s, unknown("unsettled/escalated"), events.OperationEscalated, 1, events.EscalationData{
		Reason: "cannot_ask", Request: json.RawMessage(`{}`), ProposedAction: events.ActionAbandon})
	done := completed(t, s, "unsettled/control")
	relayed(t, s)
	for _, op := range []events.Operation{pending, inProgress, needsRec, escalated} {
		if want := events.Status(op.Key[len("unsettled/"):]); op.Status != want {
			t.Fatalf("%s is %s, want %s", op.Key, op.Status, want)
		}
	}

	n, err := s.PruneSettled(ctx, "payments.charge", farFuture, farFuture, 100)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want only the completed one", n, err)
	}
	for _, op := range []events.Operation{pending, inProgress, needsRec, escalated} {
		got, err := s.Load(ctx, op.Key)
		if err != nil || got.Seq != op.Seq || got.Status != op.Status {
			t.Fatalf("%s after the prune: %+v, %v", op.Key, got, err)
		}
	}
	if _, err := s.Load(ctx, done.Key); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("the completed operation: %v, want pruned", err)
	}
}

// TestPruneRacesLateDuplicates runs prunes and late duplicates of the same
// intents at once. Whatever the interleaving, a duplicate conflicts: it
// never creates the operation afresh (which would run it again).
func TestPruneRacesLateDuplicates(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const n = 60
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("race/%03d", i)
		completed(t, s, keys[i])
	}
	relayed(t, s)

	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				// Small batches, so prunes and duplicates interleave.
				got, err := s.PruneSettled(ctx, "payments.charge", farFuture, farFuture, 3+w)
				if err != nil {
					errs <- err
					return
				}
				if got == 0 {
					return
				}
			}
		}()
	}
	for _, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				_, err := s.Append(ctx, store.Append{Events: []events.Envelope{intent(t, key, `{"amount":1}`)}})
				if !store.IsConflict(err) {
					errs <- fmt.Errorf("duplicate of %s: %v, want a conflict", key, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := count(t, s, `SELECT count(*) FROM operations WHERE pruned_at IS NOT NULL`); got != n {
		t.Fatalf("%d tombstones, want %d", got, n)
	}
	if got := count(t, s, `SELECT count(*) FROM events`); got != 0 {
		t.Fatalf("%d events left", got)
	}
}

func TestExpireTombstones(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	old, recent := completed(t, s, "expire/old"), completed(t, s, "expire/recent")
	relayed(t, s)
	day := 24 * time.Hour
	if _, err := s.PruneSettled(ctx, old.Tool, farFuture, t0.Add(day), 10); err != nil {
		t.Fatal(err)
	}
	// Make the second tombstone younger.
	if _, err := s.Pool().Exec(ctx, `UPDATE operations SET pruned_at = $2 WHERE operation_key = $1`, recent.Key, t0.Add(3*day)); err != nil {
		t.Fatal(err)
	}
	n, err := s.ExpireTombstones(ctx, t0.Add(2*day), 10)
	if err != nil || n != 1 {
		t.Fatalf("expired %d (err %v), want 1", n, err)
	}
	if _, err := s.Load(ctx, old.Key); !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrPruned) {
		t.Fatalf("the expired key: %v, want plain ErrNotFound", err)
	}
	if _, err := s.Load(ctx, recent.Key); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("the younger tombstone: %v, want kept", err)
	}
	// The expired key is free again: a new intent creates a new operation.
	if op := create(t, s, old.Key); op.Status != events.StatusPending || op.Seq != 1 {
		t.Fatalf("a new intent after expiry: %+v", op)
	}
}

func TestSettledTools(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	completed(t, s, "tools/a")
	create(t, s, "tools/pending")
	tools, err := s.SettledTools(ctx)
	if err != nil || len(tools) != 1 || tools[0] != "payments.charge" {
		t.Fatalf("SettledTools = %v, %v", tools, err)
	}
}

// workflowRun writes a workflow run's head row directly, awaiting key ("" for
// none): these tests are about what the prune reads of a run, and the
// workflow package's tests prune runs the engine drove.
func workflowRun(t *testing.T, s *store.Store, id string, status events.WorkflowStatus, awaiting string) {
	t.Helper()
	var await any
	if awaiting != "" {
		await = awaiting
	}
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO workflows
		(workflow_id, workflow, input_hash, status, seq, awaiting, record, created_at, updated_at)
		VALUES ($1, 'order', 'h', $2, 2, $3, '{}', $4, $4)`, id, string(status), await, t0); err != nil {
		t.Fatal(err)
	}
}

// moveOn points run id at another operation, as a transition does.
func moveOn(t *testing.T, s *store.Store, id, awaiting string) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), `UPDATE workflows SET awaiting = $2 WHERE workflow_id = $1`,
		id, awaiting); err != nil {
		t.Fatal(err)
	}
}

// TestPruneKeepsTheStepARunAwaits: a step's operation that its run still
// awaits is not pruned, whatever its age; the run's other steps, a step of
// a run that awaits something else and an operation of no run are. Once the
// run has moved on, the next pass prunes it.
func TestPruneKeepsTheStepARunAwaits(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	awaited := completed(t, s, "wf:run-1/reserve")
	completed(t, s, "wf:run-1/charge~undo")
	completed(t, s, "wf:run-2/reserve")
	completed(t, s, "plain/1")
	relayed(t, s)
	workflowRun(t, s, "run-1", events.WorkflowRunning, awaited.Key)
	workflowRun(t, s, "run-2", events.WorkflowRunning, "wf:run-2/charge")

	if n, err := s.PruneSettled(ctx, awaited.Tool, farFuture, farFuture, 10); err != nil || n != 3 {
		t.Fatalf("pruned %d (err %v), want all but the awaited step", n, err)
	}
	if op, err := s.Load(ctx, awaited.Key); err != nil || op.Seq != awaited.Seq {
		t.Fatalf("the step its run awaits: %+v, %v; want it kept whole", op, err)
	}
	moveOn(t, s, "run-1", "wf:run-1/charge")
	if n, err := s.PruneSettled(ctx, awaited.Tool, farFuture, farFuture, 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v) once the run moved on, want 1", n, err)
	}
	if _, err := s.Load(ctx, awaited.Key); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("the step after its run moved on: %v, want pruned", err)
	}
}

// TestPrunePassGoesPastPagesItCannotPrune: pages whose every candidate
// stays (locked by a writer, awaited by its run) still move the cursor on,
// so a pass in small pages reaches the prunable operations behind them,
// and ends. The operations all settled in the same microsecond: the cursor
// tells them apart by key.
func TestPrunePassGoesPastPagesItCannotPrune(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	// In key order: two locked, five awaited, three prunable.
	locked := []string{"a-locked/0", "a-locked/1"}
	var keys []string
	for _, k := range locked {
		keys = append(keys, completed(t, s, k).Key)
	}
	for i := range 5 {
		id := fmt.Sprintf("held-%d", i)
		op := completed(t, s, "wf:"+id+"/reserve")
		workflowRun(t, s, id, events.WorkflowRunning, op.Key)
		keys = append(keys, op.Key)
	}
	for i := range 3 {
		keys = append(keys, completed(t, s, fmt.Sprintf("x-free/%d", i)).Key)
	}
	relayed(t, s)
	if n := count(t, s, `SELECT count(DISTINCT updated_at) FROM operations`); n != 1 {
		t.Fatalf("the operations settled at %d times, want one", n)
	}

	// A writer holds the first two, as an append in flight does.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM operations WHERE operation_key = ANY($1) FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}

	var cur store.PruneCursor
	var pruned []int
	for page := 0; ; page++ {
		if page > len(keys) {
			t.Fatalf("the pass did not end after %d pages of 2 (pruned %v)", page, pruned)
		}
		p, err := s.PruneSettledPage(ctx, "payments.charge", cur, farFuture, farFuture, 2)
		if err != nil {
			t.Fatal(err)
		}
		pruned = append(pruned, p.Pruned)
		if want := keys[min(2*page+1, len(keys)-1)]; p.Full && p.Next.Key != want {
			t.Fatalf("page %d ends at %q, want %q", page, p.Next.Key, want)
		}
		if !p.Full {
			break
		}
		cur = p.Next
	}
	// [locked locked] [held held] [held held] [held free] [free free] []
	if fmt.Sprint(pruned) != "[0 0 0 1 2 0]" {
		t.Fatalf("pruned per page %v, want [0 0 0 1 2 0]", pruned)
	}
	for i, k := range keys {
		_, err := s.Load(ctx, k)
		if gone := errors.Is(err, store.ErrPruned); gone != (i >= 7) {
			t.Fatalf("%s: %v", k, err)
		}
	}

	// Released, and the runs moved on: a pass takes them all.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		moveOn(t, s, fmt.Sprintf("held-%d", i), "elsewhere")
	}
	if n, err := s.PruneSettled(ctx, "payments.charge", farFuture, farFuture, 2); err != nil || n != 7 {
		t.Fatalf("pruned %d (err %v) once nothing held them, want 7", n, err)
	}
}

// TestPruneDropsACandidateChangedSinceTheRead: the page is read without
// locks, so an operation appended to after the read and before the prune
// is checked again when locked, and drops out: one whose new events moved
// its updated_at past the window, and one whose new events wait in the
// outbox.
func TestPruneDropsACandidateChangedSinceTheRead(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	late := completed(t, s, "changed/late")
	unrelayed := completed(t, s, "changed/unrelayed")
	completed(t, s, "changed/untouched")
	relayed(t, s)
	window := t0.Add(time.Hour)
	keys, err := s.PruneCandidates(ctx, "payments.charge", store.PruneCursor{}, window, 10)
	if err != nil || len(keys) != 3 {
		t.Fatalf("candidates %v (err %v), want 3", keys, err)
	}

	// A late outcome of a lost lease, reported after the window.
	e, err := events.New(events.AttemptSucceeded, late.Key, late.Seq+1, late.Tool, late.EffectClass, 1,
		events.AttemptSucceededData{StatusCode: 200, Late: true}, window.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, store.Append{Base: late, Events: []events.Envelope{e}}); err != nil {
		t.Fatal(err)
	}
	relayed(t, s)
	// Another, inside the window but not yet relayed.
	next(t, s, unrelayed, events.AttemptSucceeded, 1, events.AttemptSucceededData{StatusCode: 200, Late: true})

	if n, err := s.PruneKeys(ctx, keys, window, farFuture); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want only the untouched one", n, err)
	}
	for _, op := range []events.Operation{late, unrelayed} {
		if got, err := s.Load(ctx, op.Key); err != nil || got.Seq != op.Seq+1 {
			t.Fatalf("%s: %+v, %v; want it kept with its new event", op.Key, got, err)
		}
	}
}

// TestPruneHoldsARunADecisionMayMoveOn: an escalated run awaits nothing,
// but a decision may move it on to an operation recorded before (adopted),
// settled and due for pruning. The prune locks that run too, so a decision
// in progress holds the prune back until it commits, and then the prune
// sees the run awaiting the operation and keeps it.
func TestPruneHoldsARunADecisionMayMoveOn(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	retry := completed(t, s, "wf:esc-1/charge~r1")
	relayed(t, s)
	workflowRun(t, s, "esc-1", events.WorkflowEscalated, "")

	// The decision locks its run first, as Decide's load does.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM workflows WHERE workflow_id = 'esc-1' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := s.PruneSettled(ctx, retry.Tool, farFuture, farFuture, 10)
		done <- result{n, err}
	}()
	// Until the prune waits for the run's lock, or has finished without.
	var early *result
	for deadline := time.Now().Add(30 * time.Second); early == nil; {
		select {
		case r := <-done:
			early = &r
			continue
		default:
		}
		if count(t, s, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the prune neither waited for the decision's lock nor finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := tx.Exec(ctx, `UPDATE workflows SET status = 'running', awaiting = $1 WHERE workflow_id = 'esc-1'`,
		retry.Key); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := early
	if r == nil {
		got := <-done
		r = &got
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := s.Load(ctx, retry.Key); err != nil {
		t.Fatalf("the operation the decision moved the run on to: %v (the prune took %d without waiting: %v); want it kept",
			err, r.n, early != nil)
	}
	moveOn(t, s, "esc-1", "wf:esc-1/confirm")
	if n, err := s.PruneSettled(ctx, retry.Tool, farFuture, farFuture, 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v) once the run moved on, want 1", n, err)
	}
}
