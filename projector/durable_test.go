package projector

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
)

func settledWith(t *testing.T, d kafka.Durable) error {
	t.Helper()
	select {
	case err := <-d:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("a batch never settled")
	}
	return nil
}

// The watch settles a batch once the WAL is flushed past it, and when its
// connection breaks it settles every waiting batch as maybe lost, drops the
// cache and starts a new generation: what it cannot vouch for is read
// again.
func TestDurabilityWatch(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	var doubts atomic.Int32
	w := newDurabilityWatch(watchConnConfig(pool), 5*time.Millisecond, func(bool) { doubts.Add(1) }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := w.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.PgConn().PID()
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, conn) }()
	defer func() { cancel(); <-done }()

	gen := w.begin()
	if _, err := pool.Exec(ctx, `SET synchronous_commit = off; CREATE TEMP TABLE t (x int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := settledWith(t, w.after(gen)); err != nil {
		t.Fatalf("a flushed batch settled with %v", err)
	}

	// The watch's connection dies (as in a crash) while a batch waits.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := settledWith(t, w.after(gen)); !errors.Is(err, errMaybeLost) {
		t.Fatalf("a batch from before the loss settled with %v, want errMaybeLost", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for w.begin() == gen {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := doubts.Load(); got != 2 {
		t.Fatalf("the cache was dropped %d times, want twice (at the loss and at the new connection)", got)
	}
	if err := settledWith(t, w.after(gen)); !errors.Is(err, errMaybeLost) {
		t.Fatalf("a batch begun in the old generation settled with %v after the reconnect, want errMaybeLost", err)
	}
	if err := settledWith(t, w.after(w.begin())); err != nil {
		t.Fatalf("a batch of the new generation settled with %v", err)
	}
}
