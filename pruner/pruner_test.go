package pruner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/store"
)

func setup(t *testing.T) *store.Store {
	t.Helper()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	if _, err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return store.New(pool)
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// settle journals n operations of tool through to completed, the last
// event at settledAt, in batches, and drains the outbox as the relay would.
func settle(t *testing.T, s *store.Store, tool, prefix string, n int, settledAt time.Time) []string {
	t.Helper()
	ctx := context.Background()
	keys := make([]string, n)
	for lo := 0; lo < n; lo += 100 {
		hi := min(lo+100, n)
		ops := make([]events.Operation, hi-lo)
		as := make([]store.Append, hi-lo)
		do := func() {
			for j, r := range s.AppendBatch(ctx, as) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				ops[j] = r.Op
			}
		}
		for j := range as {
			keys[lo+j] = fmt.Sprintf("%s/%05d", prefix, lo+j)
			e, err := events.New(events.IntentRecorded, keys[lo+j], 1, tool, events.Idempotent, 0,
				events.IntentData{Args: json.RawMessage(`{"n":1}`), Principal: "agent"}, settledAt.Add(-2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			as[j] = store.Append{Events: []events.Envelope{e}}
		}
		do()
		for j, op := range ops {
			e, err := events.New(events.AttemptStarted, op.Key, 2, tool, events.Idempotent, 1,
				events.AttemptStartedData{DownstreamKey: op.Key, Worker: "w", LeaseUntil: settledAt}, settledAt.Add(-time.Second))
			if err != nil {
				t.Fatal(err)
			}
			as[j] = store.Append{Base: op, Events: []events.Envelope{e}}
		}
		do()
		for j, op := range ops {
			e, err := events.New(events.AttemptSucceeded, op.Key, 3, tool, events.Idempotent, 1,
				events.AttemptSucceededData{StatusCode: 200}, settledAt)
			if err != nil {
				t.Fatal(err)
			}
			as[j] = store.Append{Base: op, Events: []events.Envelope{e}}
		}
		do()
	}
	if _, err := s.Pool().Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	return keys
}

func tombstones(t *testing.T, s *store.Store) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM operations WHERE pruned_at IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTwoPrunersRace: two passes at once, in small batches, prune every
// due operation exactly once between them and neither fails.
func TestTwoPrunersRace(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const n = 600
	settle(t, s, "emails.send", "race", n, t0)
	cfg := pruner.Config{Default: time.Hour, Batch: 7, Pace: 1, Now: func() time.Time { return t0.Add(2 * time.Hour) }}
	var wg sync.WaitGroup
	counts := make([]pruner.Counts, 2)
	errs := make([]error, 2)
	for i := range 2 {
		p, err := pruner.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); counts[i], errs[i] = p.RunOnce(context.Background()) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pruner %d: %v", i, err)
		}
	}
	if got := counts[0].Pruned + counts[1].Pruned; got != n {
		t.Fatalf("the pruners report %d + %d pruned, want %d in all", counts[0].Pruned, counts[1].Pruned, n)
	}
	if got := tombstones(t, s); got != n {
		t.Fatalf("%d tombstones, want %d", got, n)
	}
	t.Logf("pruned %d and %d", counts[0].Pruned, counts[1].Pruned)
}

// TestPerToolWindows: each tool's dedup_window applies to its operations;
// a tool without one (here: one no longer in the tools file) takes the
// default.
func TestPerToolWindows(t *testing.T) {
	t.Parallel()
	s := setup(t)
	settle(t, s, "short", "short", 3, t0)
	settle(t, s, "long", "long", 3, t0)
	settle(t, s, "gone", "gone", 3, t0)
	now := t0.Add(2 * time.Hour)
	p, err := pruner.New(s, pruner.Config{
		Windows: map[string]time.Duration{"short": time.Hour, "long": 24 * time.Hour},
		Default: 90 * time.Minute,
		Now:     func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.RunOnce(context.Background())
	if err != nil || n.Pruned != 6 {
		t.Fatalf("RunOnce = %+v, %v; want the 6 operations of short and gone", n, err)
	}
	for _, key := range []string{"short/00000", "gone/00002"} {
		if _, err := s.Load(context.Background(), key); !errors.Is(err, store.ErrPruned) {
			t.Fatalf("%s: %v, want pruned", key, err)
		}
	}
	if op, err := s.Load(context.Background(), "long/00000"); err != nil || op.Status != events.StatusCompleted {
		t.Fatalf("long/00000 inside its window: %+v, %v", op, err)
	}
}

// TestTombstoneRetention: tombstones older than the retention go, younger
// ones stay; without a retention they stay forever.
func TestTombstoneRetention(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	settle(t, s, "t", "old", 5, t0)
	now := t0.Add(2 * time.Hour)
	clock := func() time.Time { return now }
	forever, err := pruner.New(s, pruner.Config{Default: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := forever.RunOnce(ctx); err != nil || n.Pruned != 5 {
		t.Fatalf("first pass: %+v, %v", n, err)
	}
	settle(t, s, "t", "young", 2, now)
	now = now.Add(3 * time.Hour) // the young ones are pruned at now
	if n, err := forever.RunOnce(ctx); err != nil || n.Pruned != 2 || n.Expired != 0 {
		t.Fatalf("without a retention: %+v, %v; want 2 pruned, none expired", n, err)
	}
	now = now.Add(10 * 24 * time.Hour)
	if n, err := forever.RunOnce(ctx); err != nil || n.Expired != 0 || tombstones(t, s) != 7 {
		t.Fatalf("without a retention, much later: %+v, %v", n, err)
	}
	// With a retention of 10 days and 1 hour: the old tombstones (made 3
	// hours before the young ones) are past it, the young ones not.
	retained, err := pruner.New(s, pruner.Config{Default: time.Hour, TombstoneRetention: 10*24*time.Hour + time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := retained.RunOnce(ctx); err != nil || n.Expired != 5 {
		t.Fatalf("with a retention: %+v, %v; want 5 expired", n, err)
	}
	if _, err := s.Load(ctx, "old/00000"); err == nil || errors.Is(err, store.ErrPruned) {
		t.Fatalf("an expired key: %v, want not found", err)
	}
	if _, err := s.Load(ctx, "young/00001"); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("a young tombstone: %v, want kept", err)
	}
}

// TestRunPrunesUnderOneLeader: two background pruners on one database;
// the work gets done and only one of them holds the lock.
func TestRunPrunesUnderOneLeader(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const n = 50
	settle(t, s, "t", "bg", n, t0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		p, err := pruner.New(s, pruner.Config{Default: time.Hour, Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Run(ctx) }()
	}
	deadline := time.Now().Add(60 * time.Second)
	for tombstones(t, s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pruned after 60s", tombstones(t, s), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var holders int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND ((classid::bigint << 32) | objid::bigint) = $1`, pruner.DefaultLeaderLockKey).Scan(&holders); err != nil {
		t.Fatal(err)
	}
	if holders != 1 {
		t.Fatalf("%d sessions hold the pruner lock, want 1", holders)
	}
	cancel()
	wg.Wait()
}
