package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

func setup(t *testing.T) *store.Store {
	t.Helper()
	pool := testenv.NewPool(t, storedb.New(t))
	return store.New(pool)
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func intent(t *testing.T, key string, args string) events.Envelope {
	t.Helper()
	e, err := events.New(events.IntentRecorded, key, 1, "payments.charge", events.Irreversible, 0,
		events.IntentData{Args: json.RawMessage(args), Principal: "billing-agent"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func started(t *testing.T, op events.Operation, worker string) events.Envelope {
	t.Helper()
	e, err := events.New(events.AttemptStarted, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt+1,
		events.AttemptStartedData{DownstreamKey: op.Key, Worker: worker, LeaseUntil: t0.Add(time.Minute)}, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func create(t *testing.T, s *store.Store, key string) events.Operation {
	t.Helper()
	op, err := s.Append(context.Background(), store.Append{Events: []events.Envelope{intent(t, key, `{"amount":1}`)}, TopicPrefix: "effectline."})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	ctx := context.Background()
	var wg sync.WaitGroup
	applied := make([][]int, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); applied[i], errs[i] = store.Migrate(ctx, pool) }()
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		total += len(applied[i])
	}
	ms, _ := store.Migrations()
	if total != len(ms) {
		t.Fatalf("concurrent migrations applied %d versions in all, want each of %d once", total, len(ms))
	}
}

func TestAppendCreatesAndLoads(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	op := create(t, s, "order-1/charge")
	if op.Status != events.StatusPending || op.Seq != 1 {
		t.Fatalf("new operation = %+v", op)
	}
	got, err := s.Load(ctx, "order-1/charge")
	if err != nil {
		t.Fatal(err)
	}
	if got.PayloadHash != op.PayloadHash || got.Status != op.Status {
		t.Fatalf("loaded %+v, appended %+v", got, op)
	}
	if _, err := s.Load(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load of a missing key: %v, want ErrNotFound", err)
	}
	// Creating the same key again conflicts and writes nothing.
	_, err = s.Append(ctx, store.Append{Events: []events.Envelope{intent(t, "order-1/charge", `{"amount":2}`)}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.ExpectedSeq != 0 {
		t.Fatalf("second create: %v, want a ConflictError at seq 0", err)
	}
	evs, err := s.Events(ctx, "order-1/charge", 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("events = %d, %v; want 1", len(evs), err)
	}
	replayed, err := s.Replay(ctx, "order-1/charge")
	if err != nil {
		t.Fatal(err)
	}
	if replayed.PayloadHash != got.PayloadHash || replayed.Seq != got.Seq {
		t.Fatalf("replay %+v differs from head %+v", replayed, got)
	}
}

// TestConcurrentAppendOneWinner: 16 writers on 16 connections append seq n+1
// to one operation; exactly one wins, the others get the typed conflict, and
// nothing else is written.
func TestConcurrentAppendOneWinner(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	op := create(t, s, "race")
	wins := race(t, s, func(i int) store.Append {
		return store.Append{Base: op, Events: []events.Envelope{started(t, op, fmt.Sprintf("worker-%d", i))}, TopicPrefix: "effectline."}
	})
	if wins != 1 {
		t.Fatalf("%d writers won, want exactly 1", wins)
	}
	var events_, outbox int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE operation_key = 'race'`).Scan(&events_); err != nil {
		t.Fatal(err)
	}
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE operation_key = 'race'`).Scan(&outbox); err != nil {
		t.Fatal(err)
	}
	// intent: intents + outcomes; attempt.started: outcomes.
	if events_ != 2 || outbox != 3 {
		t.Fatalf("events=%d outbox=%d, want 2 and 3", events_, outbox)
	}
}

// TestConcurrentCreatesOneWinner: writers racing to journal the intent of
// one new operation, each on its own connection; the head's primary key
// lets exactly one create it, and the others get a conflict, not the
// journal's unique violation.
func TestConcurrentCreatesOneWinner(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	wins := race(t, s, func(int) store.Append {
		return store.Append{Events: []events.Envelope{intent(t, "race/create", `{"amount":1}`)}}
	})
	var journaled int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE operation_key = 'race/create'`).Scan(&journaled); err != nil {
		t.Fatal(err)
	}
	if wins != 1 || journaled != 1 {
		t.Fatalf("%d writers won and %d intents were journaled, want exactly 1 and 1", wins, journaled)
	}
}

// race runs 16 writers' appends at once, each on its own connection, and
// returns how many won; a loser must get a conflict, nothing else.
func race(t *testing.T, s *store.Store, appendOf func(writer int) store.Append) int {
	t.Helper()
	const writers = 16
	start := make(chan struct{})
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		a := appendOf(i)
		wg.Go(func() {
			<-start
			_, errs[i] = s.Append(context.Background(), a)
		})
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case store.IsConflict(err):
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	return wins
}

func TestAppendBatchIsolatesConflicts(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	a, b := create(t, s, "a"), create(t, s, "b")
	res := s.AppendBatch(ctx, []store.Append{
		{Base: a, Events: []events.Envelope{started(t, a, "w1")}},
		{Base: a, Events: []events.Envelope{started(t, a, "w2")}}, // same base: loses
		{Base: b, Events: []events.Envelope{started(t, b, "w1")}},
		{Events: []events.Envelope{intent(t, "c", `{"x":1}`)}},
	})
	if res[0].Err != nil || res[2].Err != nil || res[3].Err != nil {
		t.Fatalf("batch results: %+v", res)
	}
	if !store.IsConflict(res[1].Err) {
		t.Fatalf("second append from the same base: %v, want a conflict", res[1].Err)
	}
	got, _ := s.Load(ctx, "a")
	if got.LeaseOwner != "w1" || got.Status != events.StatusInProgress {
		t.Fatalf("a = %+v", got)
	}
}

// A step decided from an intent message alone builds on the message's
// arguments, so it may commit only where that message is the journaled
// intent; otherwise it conflicts, and one odd id never fails the batch.
func TestAppendAfterIntentRequiresThatIntent(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	a, b, c := create(t, s, "a"), create(t, s, "b"), create(t, s, "c")
	ia, err := s.Events(ctx, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := s.Events(ctx, "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	res := s.AppendBatch(ctx, []store.Append{
		{Base: a, Events: []events.Envelope{started(t, a, "w1")}, IntentEventID: ia[0].EventID},
		{Base: b, Events: []events.Envelope{started(t, b, "w1")}, IntentEventID: ia[0].EventID}, // a's intent, not b's
		{Base: c, Events: []events.Envelope{started(t, c, "w1")}, IntentEventID: "not-a-uuid"},
		{Base: c, Events: []events.Envelope{started(t, c, "w2")}, IntentEventID: strings.ToUpper(ic[0].EventID)},
	})
	if res[0].Err != nil {
		t.Fatalf("append after the journaled intent: %v", res[0].Err)
	}
	for i := 1; i < len(res); i++ {
		if !store.IsConflict(res[i].Err) {
			t.Fatalf("append %d after another intent: %v, want a conflict", i, res[i].Err)
		}
	}
	for _, key := range []string{"b", "c"} {
		if got, _ := s.Load(ctx, key); got.Seq != 1 {
			t.Fatalf("%s moved to seq %d on a conflicting append", key, got.Seq)
		}
	}
}

// Unhurried appends (the executor's claims) commit like any other but do
// not wake the relay; a batch with one hurried append does.
func TestUnhurriedAppendsDoNotWakeTheRelay(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var wakes int
	s.OnAppend(func() { wakes++ })
	a, b := create(t, s, "a"), create(t, s, "b")
	wakes = 0
	res := s.AppendBatch(ctx, []store.Append{{Base: a, Events: []events.Envelope{started(t, a, "w1")}, Unhurried: true}})
	if res[0].Err != nil || wakes != 0 {
		t.Fatalf("unhurried append: %v, %d wake-ups, want committed and none", res[0].Err, wakes)
	}
	if got, _ := s.Load(ctx, "a"); got.Seq != 2 {
		t.Fatalf("unhurried append not committed: seq %d", got.Seq)
	}
	res = s.AppendBatch(ctx, []store.Append{
		{Base: b, Events: []events.Envelope{started(t, b, "w1")}, Unhurried: true},
		{Events: []events.Envelope{intent(t, "c", `{"x":1}`)}},
	})
	if res[0].Err != nil || res[1].Err != nil || wakes != 1 {
		t.Fatalf("mixed batch: %+v, %d wake-ups, want both committed and one", res, wakes)
	}
}

func TestAppendRejectsIllegalTransitions(t *testing.T) {
	t.Parallel()
	s := setup(t)
	op := create(t, s, "k")
	ev := started(t, op, "w")
	ev.Seq = 5
	_, err := s.Append(context.Background(), store.Append{Base: op, Events: []events.Envelope{ev}})
	if !errors.Is(err, events.ErrIllegalTransition) {
		t.Fatalf("append with a seq gap: %v, want ErrIllegalTransition", err)
	}
}

func TestCommitterGroupsConcurrentAppends(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	reader := sdkmetric.NewManualReader()
	c := s.NewCommitter(store.CommitterConfig{MaxBatch: 64, Flushers: 2,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	const n = 200
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.Append(ctx, store.Append{Events: []events.Envelope{intent(t, fmt.Sprintf("k%d", i), `{"i":1}`)}})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	cancel()
	<-done
	if _, err := c.Append(context.Background(), store.Append{Events: []events.Envelope{intent(t, "late", `{}`)}}); !errors.Is(err, store.ErrCommitterStopped) {
		t.Fatalf("append after stop: %v, want ErrCommitterStopped", err)
	}
	var count int
	_ = s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM operations`).Scan(&count)
	if count != n {
		t.Fatalf("%d operations, want %d", count, n)
	}

	// The metric tells an operator how well commits are shared.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var commits uint64
	var appends int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == store.MetricCommitAppends {
				for _, dp := range m.Data.(metricdata.Histogram[int64]).DataPoints {
					commits, appends = commits+dp.Count, appends+dp.Sum
				}
			}
		}
	}
	if appends != n || int64(commits) != s.SyncCommits() {
		t.Fatalf("%s: %d appends in %d commits, want %d in %d", store.MetricCommitAppends, appends, commits, n, s.SyncCommits())
	}
}

func TestDueAndLeaseQueries(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	op := create(t, s, "due")
	keys, err := s.DueOperations(ctx, t0, 10)
	if err != nil || len(keys) != 0 {
		t.Fatalf("due before the pickup grace: %v %v", keys, err)
	}
	keys, _ = s.DueOperations(ctx, t0.Add(events.IntentPickupGrace), 10)
	if len(keys) != 1 {
		t.Fatalf("due after the pickup grace: %v", keys)
	}
	op, err = s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w")}})
	if err != nil {
		t.Fatal(err)
	}
	if keys, _ := s.ExpiredLeases(ctx, t0.Add(30*time.Second), 10); len(keys) != 0 {
		t.Fatalf("lease expired early: %v", keys)
	}
	ok, err := s.ExtendLease(ctx, "due", op.Seq, t0.Add(5*time.Minute))
	if err != nil || !ok {
		t.Fatalf("extend lease: %v %v", ok, err)
	}
	if keys, _ := s.ExpiredLeases(ctx, t0.Add(2*time.Minute), 10); len(keys) != 0 {
		t.Fatalf("extended lease counted as expired: %v", keys)
	}
	if keys, _ := s.ExpiredLeases(ctx, t0.Add(6*time.Minute), 10); len(keys) != 1 {
		t.Fatalf("expired lease not found: %v", keys)
	}
	if ok, _ := s.ExtendLease(ctx, "due", op.Seq-1, t0.Add(time.Hour)); ok {
		t.Fatal("a stale seq extended the lease")
	}
}

func TestAppendTxFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AppendTx(ctx, tx, store.Append{Events: []events.Envelope{intent(t, "rolled-back", `{}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx, "rolled-back"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rolled back intent is visible: %v", err)
	}
}

func TestJSONBSafe(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`{"a":"x\u0000y"}`:  `{"a":"x\ufffdy"}`,
		`{"a":"x\\u0000y"}`: `{"a":"x\\u0000y"}`, // an escaped backslash: literal text
		`{"a":"plain"}`:     `{"a":"plain"}`,
		`{"a":"\u0000"}`:    `{"a":"\ufffd"}`,
	}
	for in, want := range cases {
		if got := string(store.JSONBSafe([]byte(in))); got != want {
			t.Errorf("JSONBSafe(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestResultWithNULIsJournaled: a tool response with \u0000 in a string is
// an effect that happened; the journal must take it.
func TestResultWithNULIsJournaled(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	op := create(t, s, "nul")
	op, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w")}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.New(events.AttemptSucceeded, "nul", op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
		events.AttemptSucceededData{Result: json.RawMessage(`{"note":"a\u0000b"}`)}, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{ev}}); err != nil {
		t.Fatalf("appending a result with NUL: %v", err)
	}
	evs, _ := s.Events(ctx, "nul", 2)
	d, _ := evs[0].DecodeData()
	if got := string(d.(*events.AttemptSucceededData).Result); got != `{"note":"a\u0000b"}` {
		t.Fatalf("the journal changed the result: %s", got)
	}
}

// TestCommitterPacesASteadyStream: while appends keep arriving, the
// committer holds a batch for up to its window, so two appends that arrive
// 50ms apart share a commit; with pacing off each commits alone.
func TestCommitterPacesASteadyStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		window      time.Duration
		wantCommits int64
	}{
		{window: 2 * time.Second, wantCommits: 1},
		{window: -1, wantCommits: 2},
	} {
		t.Run(fmt.Sprintf("window %v", tc.window), func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			ctx, cancel := context.WithCancel(context.Background())
			c := s.NewCommitter(store.CommitterConfig{Window: tc.window})
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done }()

			appendKey := func(key string) error {
				_, err := c.Append(ctx, store.Append{Events: []events.Envelope{intent(t, key, `{}`)}})
				return err
			}
			if err := appendKey("first"); err != nil {
				t.Fatal(err)
			}
			before := s.SyncCommits()
			errs := make(chan error, 2)
			go func() { errs <- appendKey("second") }()
			time.Sleep(50 * time.Millisecond)
			go func() { errs <- appendKey("third") }()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got := s.SyncCommits() - before; got != tc.wantCommits {
				t.Fatalf("%d commits for two appends 50ms apart, want %d", got, tc.wantCommits)
			}
		})
	}
}

// TestAppendsNameTheOutboxSlotThemselves: an append's outbox rows name
// their slot with a subquery of the append's own plan, and never call the
// column's default, outbox_current_slot(), a SQL function PostgreSQL plans
// again in every statement (flat out 1,478 → 1,712 operations/s without
// it; docs/benchmarks.md, session 16). PostgreSQL counts the function's
// calls in the transaction that made them.
func TestAppendsNameTheOutboxSlotThemselves(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL track_functions = 'all'`); err != nil {
		t.Fatal(err)
	}
	var slotCalls int64
	if err := tx.QueryRow(ctx, `SELECT outbox_current_slot()`).Scan(new(int16)); err != nil {
		t.Fatal(err)
	}
	op, err := store.AppendTx(ctx, tx, store.Append{Events: []events.Envelope{intent(t, "slot/1", `{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AppendTx(ctx, tx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
	    WHERE funcname = 'outbox_current_slot'`).Scan(&slotCalls); err != nil {
		t.Fatal(err)
	}
	// The one call is the test's own, which shows the counting works.
	if slotCalls != 1 {
		t.Fatalf("outbox_current_slot() was called %d times in a transaction that called it once and appended twice", slotCalls)
	}
	var rows int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE operation_key = 'slot/1' AND slot = outbox_current_slot()`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 3 {
		t.Fatalf("%d of the appends' outbox rows are in the current slot, want 3", rows)
	}
}
