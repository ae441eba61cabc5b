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
