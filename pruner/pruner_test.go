package pruner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
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

// TestPassGoesPastPagesItCannotPrune: the oldest operations due are steps
// their runs still await, more than a page of them; the pass goes on past
// those pages, which prune nothing, to the operations behind them.
func TestPassGoesPastPagesItCannotPrune(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var held []string
	for i := range 7 {
		key := settle(t, s, "emails.send", fmt.Sprintf("wf:held-%02d", i), 1, t0)[0]
		if _, err := s.Pool().Exec(ctx, `INSERT INTO workflows
			(workflow_id, workflow, input_hash, status, seq, awaiting, record, created_at, updated_at)
			VALUES ($1, 'order', 'h', 'running', 2, $2, '{}', $3, $3)`, fmt.Sprintf("held-%02d", i), key, t0); err != nil {
			t.Fatal(err)
		}
		held = append(held, key)
	}
	free := settle(t, s, "emails.send", "x-free", 4, t0)
	p, err := pruner.New(s, pruner.Config{Default: time.Hour, Batch: 3, Pace: 1, Now: func() time.Time { return t0.Add(2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.RunOnce(ctx); err != nil || n.Pruned != len(free) {
		t.Fatalf("RunOnce = %+v, %v; want the %d operations no run awaits", n, err, len(free))
	}
	for _, key := range held {
		if _, err := s.Load(ctx, key); err != nil {
			t.Fatalf("%s, awaited: %v; want it kept", key, err)
		}
	}
	for _, key := range free {
		if _, err := s.Load(ctx, key); !errors.Is(err, store.ErrPruned) {
			t.Fatalf("%s: %v; want it pruned", key, err)
		}
	}
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

// runs records n runs of workflow name in status, settled (last changed) at
// settledAt, each with two journaled events marked published or not. The
// rows are written directly: these tests are about what the pruner takes,
// and api's and projector's tests prune runs the engine drove.
func runs(t *testing.T, s *store.Store, name, prefix string, n int, status events.WorkflowStatus, settledAt time.Time, published bool) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	if _, err := s.Pool().Exec(ctx, `
INSERT INTO workflows (workflow_id, workflow, input_hash, status, seq, awaiting, record, created_at, updated_at)
SELECT id, $2::text, 'h', $3::text, 2, NULL, jsonb_build_object('workflow_id', id, 'workflow', $2::text, 'status', $3::text, 'principal', 'agent', 'seq', 2),
       $4::timestamptz - interval '1 minute', $4
  FROM unnest($1::text[]) AS id`, ids, name, string(status), settledAt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `
INSERT INTO workflow_events (workflow_id, seq, event_id, type, envelope, occurred_at, published)
SELECT id, seq, id || '/' || seq, 'workflow.started', '{}'::bytea, $2::timestamptz, $3::boolean
  FROM unnest($1::text[]) AS id, generate_series(1, 2) AS seq`, ids, settledAt, published); err != nil {
		t.Fatal(err)
	}
	return ids
}

func runTombstones(t *testing.T, s *store.Store) int {
	t.Helper()
	n, err := workflow.NewJournal(s.Pool()).CountTombstones(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// TestTwoPrunersRaceOverRuns: two passes at once, in small batches, prune
// every due run exactly once between them, with its events.
func TestTwoPrunersRaceOverRuns(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const n = 300
	runs(t, s, "order", "race", n, events.WorkflowCompleted, t0, true)
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
	if got := counts[0].RunsPruned + counts[1].RunsPruned; got != n {
		t.Fatalf("the pruners report %d + %d runs pruned, want %d in all", counts[0].RunsPruned, counts[1].RunsPruned, n)
	}
	if got := runTombstones(t, s); got != n {
		t.Fatalf("%d run tombstones, want %d", got, n)
	}
	var left int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM workflow_events`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d events of pruned runs left (err %v)", left, err)
	}
	t.Logf("pruned %d and %d", counts[0].RunsPruned, counts[1].RunsPruned)
}

// TestRunRetention: a settled run is pruned after the longest dedup window
// of its workflow's tools (the default for a workflow no longer in the
// tools file); a run that is running, unwinding or escalated never is,
// however old, nor one whose events wait to be published; run tombstones
// expire with the tombstone retention.
func TestRunRetention(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	for _, st := range []events.WorkflowStatus{events.WorkflowCompleted, events.WorkflowUnwound, events.WorkflowAbandoned} {
		runs(t, s, "long", "long-"+string(st), 1, st, t0, true)
		runs(t, s, "gone", "gone-"+string(st), 1, st, t0, true)
	}
	for _, st := range []events.WorkflowStatus{events.WorkflowRunning, events.WorkflowUnwinding, events.WorkflowEscalated} {
		runs(t, s, "gone", "live-"+string(st), 1, st, t0, true)
	}
	runs(t, s, "gone", "unpublished", 1, events.WorkflowCompleted, t0, false)
	now := t0.Add(2 * time.Hour)
	cfg := pruner.Config{
		Windows:       map[string]time.Duration{"a": time.Hour, "b": 3 * time.Hour},
		WorkflowTools: map[string][]string{"long": {"a", "b"}},
		Default:       90 * time.Minute,
		Now:           func() time.Time { return now },
	}
	p, err := pruner.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.RunOnce(ctx); err != nil || n.RunsPruned != 3 {
		t.Fatalf("RunOnce = %+v, %v; want the 3 settled runs of gone", n, err)
	}
	now = t0.Add(1000 * time.Hour)
	if n, err := p.RunOnce(ctx); err != nil || n.RunsPruned != 3 {
		t.Fatalf("much later: %+v, %v; want the 3 settled runs of long", n, err)
	}
	var live []string
	rows, err := s.Pool().Query(ctx, `SELECT workflow_id FROM workflows WHERE pruned_at IS NULL ORDER BY workflow_id`)
	if err != nil {
		t.Fatal(err)
	}
	if live, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want := []string{"live-escalated-00000", "live-running-00000", "live-unwinding-00000", "unpublished-00000"}
	if fmt.Sprint(live) != fmt.Sprint(want) {
		t.Fatalf("runs left live: %v, want %v", live, want)
	}

	retained, err := pruner.New(s, pruner.Config{Default: time.Hour, TombstoneRetention: 100 * time.Hour,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// The tombstones of gone were made at t0+2h, those of long at now.
	if n, err := retained.RunOnce(ctx); err != nil || n.RunsExpired != 3 {
		t.Fatalf("with a retention: %+v, %v; want 3 run tombstones expired", n, err)
	}
	if got := runTombstones(t, s); got != 3 {
		t.Fatalf("%d run tombstones left, want the 3 of long", got)
	}
}

func TestWorkflowWindow(t *testing.T) {
	t.Parallel()
	c := pruner.Config{
		Windows:       map[string]time.Duration{"a": time.Hour, "b": 3 * time.Hour},
		WorkflowTools: map[string][]string{"ab": {"a", "b"}, "a": {"a"}, "ac": {"a", "c"}, "none": nil},
		Default:       2 * time.Hour,
	}
	for name, want := range map[string]time.Duration{"ab": 3 * time.Hour, "a": time.Hour, "ac": 2 * time.Hour,
		"none": 2 * time.Hour, "gone": 2 * time.Hour} {
		if got := c.WorkflowWindow(name); got != want {
			t.Errorf("WorkflowWindow(%s) = %s, want %s", name, got, want)
		}
	}
}
