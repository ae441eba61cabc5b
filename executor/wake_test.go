package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/watch"
)

// A waiter on an operation the executor of its own process settles is woken
// by the store's commits: no Kafka feed, a sweep a minute apart, and yet the
// settled record arrives within the operation's own time, every event
// folded in order (the claim too, which does not wake the relay), without
// one reload.
func TestWaiterWokenByTheStoresCommits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	hub, err := watch.New(watch.Config{Loader: e.store, SweepInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.store.OnCommit(hub.Deliver)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = hub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.start()

	const key = "wake-1"
	w := hub.Watch(key)
	defer w.Close()
	// Registered before the intent exists: the waiter's record is the empty
	// one, and every event of the operation reaches it.
	began := time.Now()
	e.produce(key, "cache.set", events.Idempotent, `{"k":"v"}`)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	op := w.Until(wctx, events.Operation{}, func(op events.Operation) bool { return events.OutcomeOf(op).State.Settled() })
	took := time.Since(began)
	if op.Status != events.StatusCompleted {
		t.Fatalf("after %v the waiter holds %s at seq %d, want completed: not woken by the commits", took, op.Status, op.Seq)
	}
	// The sweep would have woken it after up to a minute.
	if took > 10*time.Second {
		t.Fatalf("woken after %v", took)
	}
	journaled := e.waitStatus(key, events.StatusCompleted)
	if op.Seq != journaled.Seq || op.Attempt != journaled.Attempt {
		t.Fatalf("waiter's record at seq %d attempt %d, the journal's at %d attempt %d", op.Seq, op.Attempt, journaled.Seq, journaled.Attempt)
	}
	if reloads, sweeps := hub.Queries(); reloads != 0 || sweeps != 0 {
		t.Errorf("%d reloads and %d sweeps: the commits left a gap", reloads, sweeps)
	}
}
