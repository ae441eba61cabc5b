package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// The helpers here carry a rotate prefix so they never collide with the
// helpers of the store's other test files.

// rotateNow is a rotation period every call has outlived.
var rotateNow = store.RotateOptions{Every: time.Microsecond}

func rotateSetup(t *testing.T, maxConns int) *store.Store {
	t.Helper()
	url := storedb.New(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	s := store.New(testenv.NewPool(t, fmt.Sprintf("%s%spool_max_conns=%d", url, sep, maxConns)))
	// The database is a copy of a template migrated perhaps hours ago: the
	// current slot's period starts now, as on a database just migrated.
	if _, err := s.Pool().Exec(t.Context(), `UPDATE outbox_slot SET rotated_at = now()`); err != nil {
		t.Fatal(err)
	}
	return s
}

func rotate(t *testing.T, s *store.Store, opts store.RotateOptions) store.OutboxRotation {
	t.Helper()
	res, err := s.RotateOutbox(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// rotateSlots returns the slot of each outbox row of key, by topic and seq.
func rotateSlots(t *testing.T, s *store.Store, key string) map[string]int {
	t.Helper()
	rows, err := s.Pool().Query(t.Context(), `SELECT topic, seq, slot FROM outbox WHERE operation_key = $1`, key)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var topic string
		var seq int64
		var slot int
		if err := rows.Scan(&topic, &seq, &slot); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%s/%d", topic, seq)] = slot
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func rotatePartitionSize(t *testing.T, s *store.Store, slot int) int64 {
	t.Helper()
	var n int64
	if err := s.Pool().QueryRow(t.Context(), fmt.Sprintf(`SELECT pg_total_relation_size('outbox_%d')`, slot)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOutboxRotationTruncatesDrainedPartitions walks one partition through
// its life: filled while current, rotated away from, drained by the relay,
// truncated (its space given back) and made current again.
func TestOutboxRotationTruncatesDrainedPartitions(t *testing.T) {
	t.Parallel()
	s := rotateSetup(t, 4)
	ctx := t.Context()

	// 1,000 operations, 2,000 rows, in slot 0.
	for i := range 10 {
		var as []store.Append
		for j := range 100 {
			as = append(as, outboxIntent(t, fmt.Sprintf("fill-%d-%d", i, j)))
		}
		for _, r := range s.AppendBatch(ctx, as) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	// Not due yet: nothing moves.
	if res := rotate(t, s, store.RotateOptions{Every: time.Hour}); res.Rotated || res.Slot != 0 || res.Truncated != 0 {
		t.Fatalf("rotation before its period = %+v; want nothing done, slot 0", res)
	}
	if res := rotate(t, s, rotateNow); !res.Rotated || res.Slot != 1 {
		t.Fatalf("first rotation = %+v; want slot 1", res)
	}
	// Slot 0 still holds its rows: not truncated, and no rotation into
	// slot 2 and then 0 until it is.
	if res := rotate(t, s, rotateNow); res.Truncated != 0 || res.Undrained != 1 || !res.Rotated || res.Slot != 2 {
		t.Fatalf("rotation with slot 0 undrained = %+v; want slot 0 undrained, slot 2 current", res)
	}
	if res := rotate(t, s, rotateNow); res.Truncated != 0 || res.Rotated || res.Slot != 2 {
		t.Fatalf("rotation into undrained slot 0 = %+v; want none", res)
	}

	full := rotatePartitionSize(t, s, 0)
	total := 0
	for {
		_, p, _ := outboxDrain(t, s, 500)
		if p == 0 {
			break
		}
		total += p
	}
	if total != 2000 {
		t.Fatalf("relay published %d rows; want 2000", total)
	}
	if drained := rotatePartitionSize(t, s, 0); drained < full {
		t.Fatalf("slot 0 shrank from %d to %d bytes without a truncate; the test shows nothing", full, drained)
	}
	res := rotate(t, s, rotateNow)
	if res.Truncated != 1 || !res.Rotated || res.Slot != 0 {
		t.Fatalf("rotation after the drain = %+v; want slot 0 truncated and current", res)
	}
	after := rotatePartitionSize(t, s, 0)
	if after >= full || after > 64<<10 {
		t.Fatalf("slot 0 is %d bytes after its truncate, %d before; want it back to an empty table's size", after, full)
	}
	t.Logf("slot 0: %d bytes with 2,000 rows, %d after drain and truncate", full, after)
	// A truncated partition is not truncated again until it is written.
	if res := rotate(t, s, store.RotateOptions{Every: time.Hour}); res.Truncated != 0 {
		t.Fatalf("second pass = %+v; want no truncate of the fresh partitions", res)
	}
	outboxCreate(t, s, "after")
	if got := rotateSlots(t, s, "after"); got["effectline.intents/1"] != 0 {
		t.Fatalf("an append after the rotation went to slots %v; want slot 0", got)
	}
}

// TestOutboxTruncateNeverTakesAnUncommittedInsert: a writer read the slot
// before a rotation and has not committed when the truncate comes for its
// partition. The truncate must give up (or wait and then find the row), and
// the row must be published.
func TestOutboxTruncateNeverTakesAnUncommittedInsert(t *testing.T) {
	t.Parallel()
	s := rotateSetup(t, 6)
	ctx := t.Context()

	// The partition must have been written for the truncate to look at it:
	// a published operation leaves its dead rows in slot 0.
	outboxCreate(t, s, "earlier")
	outboxDrain(t, s, 10)

	writer, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.WithoutCancel(ctx))
	if _, err := store.AppendTx(ctx, writer, outboxIntent(t, "late")); err != nil {
		t.Fatal(err)
	}
	if res := rotate(t, s, rotateNow); !res.Rotated || res.Slot != 1 {
		t.Fatalf("rotation with a writer in slot 0 = %+v; want slot 1 current (a rotation waits for nobody)", res)
	}

	// The truncate gives up: the writer's lock outlasts the lock timeout.
	res := rotate(t, s, store.RotateOptions{Every: time.Hour, LockTimeout: 50 * time.Millisecond})
	if res.Truncated != 0 || res.Busy != 1 {
		t.Fatalf("truncate against an uncommitted insert = %+v; want it busy", res)
	}

	// The truncate waits, and the writer commits meanwhile: the check under
	// the lock sees the row.
	committed := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		committed <- writer.Commit(ctx)
	}()
	res = rotate(t, s, store.RotateOptions{Every: time.Hour, LockTimeout: 10 * time.Second})
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if res.Truncated != 0 || res.Undrained != 1 {
		t.Fatalf("truncate that waited for the writer's commit = %+v; want it to find the row", res)
	}
	if got := rotateSlots(t, s, "late"); len(got) != 2 || got["effectline.intents/1"] != 0 {
		t.Fatalf("the writer's rows are in %v; want both in slot 0", got)
	}

	got, _, _ := outboxDrain(t, s, 10)
	want := []outboxSeen{{"effectline.intents", "late", 1}, {"effectline.outcomes", "late", 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("published %v; want %v", got, want)
	}
	if res := rotate(t, s, store.RotateOptions{Every: time.Hour}); res.Truncated != 1 {
		t.Fatalf("truncate after the drain = %+v; want slot 0 truncated", res)
	}
}

// TestOutboxTruncateOfAnAbandonedWriter: the writer in the partition rolls
// back instead; the truncate that waited for it then empties the partition.
func TestOutboxTruncateOfAnAbandonedWriter(t *testing.T) {
	t.Parallel()
	s := rotateSetup(t, 6)
	ctx := t.Context()
	writer, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.WithoutCancel(ctx))
	if _, err := store.AppendTx(ctx, writer, outboxIntent(t, "abandoned")); err != nil {
		t.Fatal(err)
	}
	rotate(t, s, rotateNow)
	rolledBack := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		rolledBack <- writer.Rollback(ctx)
	}()
	res := rotate(t, s, store.RotateOptions{Every: time.Hour, LockTimeout: 10 * time.Second})
	if err := <-rolledBack; err != nil {
		t.Fatal(err)
	}
	if res.Truncated != 1 {
		t.Fatalf("truncate after the writer rolled back = %+v; want slot 0 truncated", res)
	}
	if got, _, _ := outboxDrain(t, s, 10); len(got) != 0 {
		t.Fatalf("published %v from a rolled-back transaction", got)
	}
}

// TestOutboxOrderGuardAcrossARotation: seq 1 of an operation waits in the
// old partition, seq 2 in the new one. While another relay holds seq 1,
// seq 2 must not go out.
func TestOutboxOrderGuardAcrossARotation(t *testing.T) {
	t.Parallel()
	s := rotateSetup(t, 6)
	ctx := t.Context()
	op := outboxCreate(t, s, "k1")
	rotate(t, s, rotateNow)
	outboxStarted(t, s, op)
	slots := rotateSlots(t, s, "k1")
	if slots["effectline.outcomes/1"] != 0 || slots["effectline.outcomes/2"] != 1 {
		t.Fatalf("rows are in slots %v; want outcomes/1 in 0 and outcomes/2 in 1", slots)
	}

	other, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.WithoutCancel(ctx))
	if _, err := other.Exec(ctx, `SELECT 1 FROM outbox WHERE operation_key = 'k1' AND topic = 'effectline.outcomes' AND seq = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	got, p, sk := outboxDrain(t, s, 10)
	if want := []outboxSeen{{"effectline.intents", "k1", 1}}; !slices.Equal(got, want) || p != 1 || sk != 1 {
		t.Fatalf("with outcomes/1 (slot 0) locked elsewhere: published %v, skipped %d; want %v and outcomes/2 (slot 1) held back", got, sk, want)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got, _, _ = outboxDrain(t, s, 10)
	if want := []outboxSeen{{"effectline.outcomes", "k1", 1}, {"effectline.outcomes", "k1", 2}}; !slices.Equal(got, want) {
		t.Fatalf("after the lock ended: published %v; want %v", got, want)
	}
}

// TestOutboxRotationRacesWritersAndRelays runs writers (some holding their
// transaction open across rotations, some rolling back), two relays and
// two rotators that rotate and truncate as often as they can, and checks
// that every event the journal holds was published to each of its topics,
// that nothing else was, and that each (key, topic) first went out in seq
// order.
func TestOutboxRotationRacesWritersAndRelays(t *testing.T) {
	t.Parallel()
	s := rotateSetup(t, 16)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	type pub struct {
		topic, key string
		seq        int64
	}
	var (
		mu        sync.Mutex
		published []pub
	)
	relay := func() (int, error) {
		p, _, err := s.RelayBatch(ctx, 50, func(evs []store.OutboxEvent) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				published = append(published, pub{e.Topic, e.Envelope.OperationKey, e.Envelope.Seq})
			}
			return nil
		})
		return p, err
	}

	const writers, opsPerWriter = 6, 60
	var rotations, truncates, busy atomic.Int64
	var wg, bg sync.WaitGroup
	var failed atomic.Pointer[error]
	fail := func(err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			failed.CompareAndSwap(nil, &err)
		}
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range opsPerWriter {
				key := fmt.Sprintf("w%d-%d", w, i)
				err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
					op, err := store.AppendTx(ctx, tx, outboxIntent(t, key))
					if err != nil {
						return err
					}
					// Held open across rotations and truncate attempts.
					time.Sleep(time.Duration(rnd.IntN(30)) * time.Millisecond)
					if rnd.IntN(8) == 0 {
						return errRotateRolledBack
					}
					e, err := events.New(events.AttemptStarted, key, 2, op.Tool, op.EffectClass, 1,
						events.AttemptStartedData{DownstreamKey: key, Worker: "w", LeaseUntil: outboxT0.Add(time.Minute)}, outboxT0)
					if err != nil {
						return err
					}
					_, err = store.AppendTx(ctx, tx, store.Append{Base: op, Events: []events.Envelope{e}, TopicPrefix: "effectline."})
					return err
				})
				if !errors.Is(err, errRotateRolledBack) {
					fail(err)
				}
				if err == nil && rnd.IntN(2) == 0 {
					// A later step in a transaction of its own, often in
					// the next partition: seq 3 behind seq 2.
					fail(rotateSucceeded(ctx, s, key))
				}
			}
		}()
	}
	for range 2 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			for ctx.Err() == nil {
				if _, err := relay(); err != nil {
					fail(err)
					return
				}
			}
		}()
		bg.Add(1)
		go func() {
			defer bg.Done()
			for ctx.Err() == nil {
				res, err := s.RotateOutbox(ctx, store.RotateOptions{Every: 20 * time.Millisecond, LockTimeout: 20 * time.Millisecond})
				if err != nil {
					fail(err)
					return
				}
				truncates.Add(int64(res.Truncated))
				busy.Add(int64(res.Busy))
				if res.Rotated {
					rotations.Add(1)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	// Let the relays and rotators finish the backlog together, then stop.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _, err := s.OutboxBacklog(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) || failed.Load() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	bg.Wait()
	if p := failed.Load(); p != nil {
		t.Fatal(*p)
	}
	if n, _, err := s.OutboxBacklog(t.Context()); err != nil || n != 0 {
		t.Fatalf("outbox backlog after the relays stopped = %d, %v; want 0", n, err)
	}
	t.Logf("%d rotations, %d truncates, %d truncates busy, %d publications", rotations.Load(), truncates.Load(), busy.Load(), len(published))
	if rotations.Load() < 5 || truncates.Load() < 3 {
		t.Fatalf("%d rotations and %d truncates: the race was not run", rotations.Load(), truncates.Load())
	}

	// What the journal holds is what committed (read as the rebuild reads
	// it: the type is in the envelope, compact rows leave the column empty).
	tx, err := s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(t.Context()) }()
	want := map[pub]bool{}
	for e, err := range store.JournalTx(t.Context(), tx, 1000) {
		if err != nil {
			t.Fatal(err)
		}
		for _, topic := range events.TopicsFor(e.Type) {
			want[pub{"effectline." + topic, e.OperationKey, e.Seq}] = true
		}
	}
	if len(want) < writers*opsPerWriter {
		t.Fatalf("only %d outbox rows committed; the writers did not run", len(want))
	}
	seen := map[pub]bool{}
	next := map[[2]string]int64{}
	for _, p := range published {
		if !want[p] {
			t.Errorf("published %v, which no committed event holds", p)
		}
		if seen[p] {
			continue // at least once: a repeat is allowed
		}
		seen[p] = true
		pair := [2]string{p.topic, p.key}
		if exp := next[pair] + 1; p.seq != exp {
			t.Errorf("%s %s: seq %d went out first when seq %d was next", p.topic, p.key, p.seq, exp)
		}
		next[pair] = p.seq
	}
	lost := 0
	for p := range want {
		if !seen[p] {
			lost++
			if lost <= 10 {
				t.Errorf("lost: %v committed and never published", p)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d committed outbox rows never published", lost, len(want))
	}
}

var errRotateRolledBack = errors.New("rolled back on purpose")

// rotateSucceeded appends seq 3 (attempt.succeeded) to key in a
// transaction of its own.
func rotateSucceeded(ctx context.Context, s *store.Store, key string) error {
	op, err := s.Load(ctx, key)
	if err != nil {
		return err
	}
	e, err := events.New(events.AttemptSucceeded, key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
		events.AttemptSucceededData{}, outboxT0)
	if err != nil {
		return err
	}
	_, err = s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{e}, TopicPrefix: "effectline."})
	return err
}

// TestMigrationCarriesTheOutboxBacklogOver upgrades a database at version
// 8 whose outbox holds a backlog, and checks that the rows come through
// the move into partitions with their ids and are all published, in order,
// with the rows written after the upgrade.
func TestMigrationCarriesTheOutboxBacklogOver(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	ctx := t.Context()
	// Version 8 by hand, as Migrate would have left it before 0009. The
	// backlog is written by this binary's store, whose appends also need
	// the head columns of 0013 (which touches operations alone), so 0013
	// goes in early, and name the outbox row's slot: the version 8 outbox
	// gets a slot column and an outbox_slot table for the writes, both
	// gone again before the upgrade.
	migrateOnly(t, pool, func(v int) bool { return v <= 8 || v == 13 })
	exec := func(sqls ...string) {
		for _, sql := range sqls {
			if _, err := pool.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	exec(`ALTER TABLE outbox ADD COLUMN slot smallint`, `CREATE TABLE outbox_slot AS SELECT 0::smallint AS slot`)
	s := store.New(pool)
	op := outboxCreate(t, s, "backlog-1")
	outboxStarted(t, s, op)
	outboxCreate(t, s, "backlog-2")
	exec(`ALTER TABLE outbox DROP COLUMN slot`, `DROP TABLE outbox_slot`)
	var ids []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM outbox`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 5 {
		t.Fatalf("version 8 outbox holds %d rows; want 5", len(ids))
	}

	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[0] != 9 {
		t.Fatalf("Migrate applied %v; want 9 first", applied)
	}
	var after []int64
	var slots []int
	if err := pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id), array_agg(slot ORDER BY id) FROM outbox`).Scan(&after, &slots); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after, ids) || slices.ContainsFunc(slots, func(s int) bool { return s != 0 }) {
		t.Fatalf("after the upgrade the outbox holds ids %v in slots %v; want %v, all in slot 0", after, slots, ids)
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE relname = 'outbox'`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("outbox relkind = %q, %v; want a partitioned table", kind, err)
	}

	// A new row takes an id above the carried ones, and the carried seq 3
	// goes out after seq 1 and 2 though it lands in the new partition.
	if _, err := s.RotateOutbox(ctx, rotateNow); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Load(ctx, "backlog-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := rotateSucceeded(ctx, s, cur.Key); err != nil {
		t.Fatal(err)
	}
	var newID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE operation_key = 'backlog-1' AND seq = 3`).Scan(&newID); err != nil {
		t.Fatal(err)
	}
	if newID <= ids[len(ids)-1] {
		t.Fatalf("a row written after the upgrade has id %d, not above the carried %v", newID, ids)
	}
	got, _, _ := outboxDrain(t, s, 100)
	want := []outboxSeen{
		{"effectline.intents", "backlog-1", 1},
		{"effectline.intents", "backlog-2", 1},
		{"effectline.outcomes", "backlog-1", 1},
		{"effectline.outcomes", "backlog-1", 2},
		{"effectline.outcomes", "backlog-1", 3},
		{"effectline.outcomes", "backlog-2", 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("published after the upgrade\n%v\nwant\n%v", got, want)
	}
}

// migrateOnly applies, to a database without any, the migrations whose
// versions apply picks, and records them as Migrate does: a database as
// an older binary left it.
func migrateOnly(t *testing.T, pool *pgxpool.Pool, apply func(version int) bool) {
	t.Helper()
	ctx := t.Context()
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effectline_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if apply(m.Version) {
			if err := rotateApply(ctx, pool, m); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func rotateApply(ctx context.Context, pool *pgxpool.Pool, m store.Migration) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("applying %s: %w", m.Name, err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effectline_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		return err
	})
}
