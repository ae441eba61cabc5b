package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// The helpers here carry an outbox prefix so they never collide with the
// helpers of the store's other test files.

func outboxSetup(t *testing.T) *store.Store {
	t.Helper()
	pool := testenv.NewPool(t, storedb.New(t))
	return store.New(pool)
}

var outboxT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func outboxIntent(t *testing.T, key string) store.Append {
	t.Helper()
	e, err := events.New(events.IntentRecorded, key, 1, "inventory.reserve", events.Compensable, 0,
		events.IntentData{Args: json.RawMessage(`{"sku":"A-1","qty":2}`), Principal: "order-agent"}, outboxT0)
	if err != nil {
		t.Fatal(err)
	}
	return store.Append{Events: []events.Envelope{e}, TopicPrefix: "effectline.",
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
}

// outboxStarted appends attempt.started to op.
func outboxStarted(t *testing.T, s *store.Store, op events.Operation) events.Operation {
	t.Helper()
	e, err := events.New(events.AttemptStarted, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt+1,
		events.AttemptStartedData{DownstreamKey: op.Key, Worker: "w1", LeaseUntil: outboxT0.Add(time.Minute)}, outboxT0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	next, err := s.Append(t.Context(), store.Append{Base: op, Events: []events.Envelope{e}, TopicPrefix: "effectline."})
	if err != nil {
		t.Fatal(err)
	}
	return next
}

func outboxCreate(t *testing.T, s *store.Store, key string) events.Operation {
	t.Helper()
	op, err := s.Append(t.Context(), outboxIntent(t, key))
	if err != nil {
		t.Fatal(err)
	}
	return op
}

type outboxSeen struct {
	topic, key string
	seq        int64
}

func outboxDrain(t *testing.T, s *store.Store, limit int) (got []outboxSeen, published, skipped int) {
	t.Helper()
	published, skipped, err := s.RelayBatch(t.Context(), limit, func(evs []store.OutboxEvent) error {
		for _, e := range evs {
			got = append(got, outboxSeen{e.Topic, e.Envelope.OperationKey, e.Envelope.Seq})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, published, skipped
}

func TestOutboxRelayBatchPublishesInOrderAndDeletes(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()

	outboxStarted(t, s, outboxCreate(t, s, "order-1/reserve"))
	outboxCreate(t, s, "order-2/reserve")

	n, oldest, err := s.OutboxBacklog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// intent → intents + outcomes; attempt.started → outcomes.
	if n != 5 || oldest.IsZero() || time.Since(oldest) > time.Minute {
		t.Fatalf("backlog = %d, oldest %v; want 5 and just now", n, oldest)
	}

	var batch []store.OutboxEvent
	published, skipped, err := s.RelayBatch(ctx, 100, func(evs []store.OutboxEvent) error {
		batch = evs
		return nil
	})
	if err != nil || published != 5 || skipped != 0 {
		t.Fatalf("RelayBatch = %d, %d, %v; want 5, 0, nil", published, skipped, err)
	}
	var got []outboxSeen
	for _, e := range batch {
		got = append(got, outboxSeen{e.Topic, e.Envelope.OperationKey, e.Envelope.Seq})
		if len(e.Raw) == 0 || e.ID == 0 {
			t.Errorf("outbox row %d (%s seq %d): missing id or raw bytes", e.ID, e.Envelope.OperationKey, e.Envelope.Seq)
		}
		// Only the intents were appended with a trace context.
		if (e.Envelope.Seq == 1) != (e.Traceparent != "") {
			t.Errorf("outbox row %d (seq %d): traceparent %q", e.ID, e.Envelope.Seq, e.Traceparent)
		}
		if dec, err := events.Decode(e.Raw); err != nil || dec.EventID != e.Envelope.EventID {
			t.Errorf("outbox row %d: raw bytes are not the envelope: %v", e.ID, err)
		}
	}
	want := []outboxSeen{
		{"effectline.intents", "order-1/reserve", 1},
		{"effectline.intents", "order-2/reserve", 1},
		{"effectline.outcomes", "order-1/reserve", 1},
		{"effectline.outcomes", "order-1/reserve", 2},
		{"effectline.outcomes", "order-2/reserve", 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("published\n%v\nwant\n%v", got, want)
	}

	if got, p, sk := outboxDrain(t, s, 100); len(got) != 0 || p != 0 || sk != 0 {
		t.Fatalf("second batch published %v (%d, %d); want nothing", got, p, sk)
	}
	n, oldest, err = s.OutboxBacklog(ctx)
	if err != nil || n != 0 || !oldest.IsZero() {
		t.Fatalf("backlog after relay = %d, %v, %v; want 0, zero time, nil", n, oldest, err)
	}
}

// TestOutboxRelayPlansItsStatementsOnce: planning the claim and the delete
// for every batch cost PostgreSQL more than running them (store's
// relayPlanningSQL); a relay's connection plans each once and reuses the
// plan.
func TestOutboxRelayPlansItsStatementsOnce(t *testing.T) {
	t.Parallel()
	url := storedb.New(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool := testenv.NewPool(t, url+sep+"pool_max_conns=1") // one session: its prepared statements are the relay's
	s := store.New(pool)
	const batches = 3
	for i := range batches {
		outboxCreate(t, s, fmt.Sprintf("order-%d/reserve", i))
		if got, published, _ := outboxDrain(t, s, 100); published != 2 {
			t.Fatalf("batch %d published %v; want the intent on two topics", i, got)
		}
	}
	rows, err := pool.Query(t.Context(), `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
		WHERE (statement LIKE '%claim AS MATERIALIZED%' OR statement LIKE 'DELETE FROM outbox%')
		  AND statement NOT LIKE '%pg_prepared_statements%'`)
	if err != nil {
		t.Fatal(err)
	}
	type plans struct {
		statement       string
		generic, custom int64
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (p plans, err error) {
		err = r.Scan(&p.statement, &p.generic, &p.custom)
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("found %d of the relay's two statements prepared on its connection: %v", len(got), got)
	}
	for _, p := range got {
		if p.custom != 0 || p.generic != batches {
			t.Errorf("%.40q… ran %d times on a generic plan and %d on a plan of its own; want %d and 0", p.statement, p.generic, p.custom, batches)
		}
	}
}

func TestOutboxRelayBatchLimitsAndLeavesTheRest(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	for _, k := range []string{"k1", "k2", "k3"} {
		outboxCreate(t, s, k) // 2 rows each
	}
	got, p, sk := outboxDrain(t, s, 4)
	if p != 4 || sk != 0 || len(got) != 4 {
		t.Fatalf("first batch: %d published, %d skipped; want 4, 0", p, sk)
	}
	got, p, _ = outboxDrain(t, s, 4)
	if p != 2 || len(got) != 2 {
		t.Fatalf("second batch: %d published; want the 2 left", p)
	}
}

func TestOutboxPublishErrorKeepsRows(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()
	outboxCreate(t, s, "k1")

	boom := errors.New("broker down")
	_, _, err := s.RelayBatch(ctx, 10, func([]store.OutboxEvent) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("RelayBatch error = %v; want it to wrap the publish error", err)
	}
	if n, _, _ := s.OutboxBacklog(ctx); n != 2 {
		t.Fatalf("backlog after a failed publish = %d; want both rows kept", n)
	}
	got, _, _ := outboxDrain(t, s, 10)
	if len(got) != 2 {
		t.Fatalf("republished %v; want both rows", got)
	}
}

// TestOutboxGuardHoldsBackRowsBehindALockedRow plays the race the guard
// exists for: another relay holds seq 1 of an operation's outcomes while
// this one could claim seq 2.
func TestOutboxGuardHoldsBackRowsBehindALockedRow(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()
	outboxStarted(t, s, outboxCreate(t, s, "k1")) // intents/1, outcomes/1, outcomes/2

	other, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.WithoutCancel(ctx))
	var lockedID int64
	if err := other.QueryRow(ctx, `SELECT id FROM outbox WHERE operation_key = 'k1' AND topic = 'effectline.outcomes' AND seq = 1
		FOR UPDATE`).Scan(&lockedID); err != nil {
		t.Fatal(err)
	}

	got, p, sk := outboxDrain(t, s, 10)
	want := []outboxSeen{{"effectline.intents", "k1", 1}}
	if !slices.Equal(got, want) || p != 1 || sk != 1 {
		t.Fatalf("with outcomes/1 locked elsewhere: published %v (%d), skipped %d; want %v and 1 skipped", got, p, sk, want)
	}

	// The other relay gives up its lock without publishing: the held-back
	// row goes out after the row it waited for.
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got, _, _ = outboxDrain(t, s, 10)
	want = []outboxSeen{{"effectline.outcomes", "k1", 1}, {"effectline.outcomes", "k1", 2}}
	if !slices.Equal(got, want) {
		t.Fatalf("after the lock ended: published %v; want %v", got, want)
	}
}

// TestOutboxGuardPublishesAfterOtherRelayCommitted checks the other half:
// once the relay holding seq 1 published and deleted it, seq 2 goes.
func TestOutboxGuardPublishesAfterOtherRelayCommitted(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()
	outboxStarted(t, s, outboxCreate(t, s, "k1"))

	// Relay A claims only the first two rows (intents/1, outcomes/1) and,
	// while it is publishing, relay B runs a batch: B must hold back
	// outcomes/2, since outcomes/1 is A's and not yet marked.
	var bGot []outboxSeen
	var bSkipped int
	_, _, err := s.RelayBatch(ctx, 2, func(evs []store.OutboxEvent) error {
		bGot, _, bSkipped = outboxDrain(t, s, 10)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bGot) != 0 || bSkipped != 1 {
		t.Fatalf("relay B during A's publish: published %v, skipped %d; want nothing published, 1 skipped", bGot, bSkipped)
	}
	got, _, _ := outboxDrain(t, s, 10)
	if want := []outboxSeen{{"effectline.outcomes", "k1", 2}}; !slices.Equal(got, want) {
		t.Fatalf("after A committed: published %v; want %v", got, want)
	}
}

func TestOutboxAppendBatchTxFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()
	outboxCreate(t, s, "exists")

	run := func(commit bool) []store.AppendResult {
		var res []store.AppendResult
		err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			var err error
			res, err = store.AppendBatchTx(ctx, tx, []store.Append{outboxIntent(t, "new"), outboxIntent(t, "exists")})
			if err != nil {
				return err
			}
			if !commit {
				return errors.New("rolled back on purpose")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
		return res
	}

	res := run(false)
	if res[0].Err != nil || !store.IsConflict(res[1].Err) {
		t.Fatalf("results = %+v; want the new one appended and the existing one a conflict", res)
	}
	if _, err := s.Load(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after rollback Load(new) = %v; want ErrNotFound", err)
	}
	if n, _, _ := s.OutboxBacklog(ctx); n != 2 {
		t.Fatalf("after rollback the outbox holds %d rows; want the 2 of the existing operation", n)
	}

	run(true)
	ops, err := s.LoadMany(ctx, []string{"new", "exists"})
	if err != nil || len(ops) != 2 {
		t.Fatalf("after commit LoadMany = %v, %v; want both", ops, err)
	}
	if n, _, _ := s.OutboxBacklog(ctx); n != 4 {
		t.Fatalf("after commit the outbox holds %d rows; want 4", n)
	}
}
