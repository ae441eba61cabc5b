package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
)

// assertCached checks the seq of the record the projector has cached for
// key; seq 0 means none.
// The flush caches its records just after its statement returns, so a row
// seen in the table may be cached a moment later: poll.
func assertCached(t *testing.T, run *running, key string, want int64) {
	t.Helper()
	var seq int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var ok bool
		if seq, ok = projector.CachedSeq(run.projector, key); !ok {
			seq = 0
		}
		if seq == want || time.Now().After(deadline) {
			break
		}
	}
	if seq != want {
		t.Fatalf("cached seq of %s = %d, want %d (0: not cached)", key, seq, want)
	}
}

// handled returns how many events the projector applied or skipped.
func handled(t testing.TB, run *running) int64 {
	t.Helper()
	return run.count(t, projector.OutcomeApplied) + run.count(t, projector.OutcomeSkipped)
}

// A cached record behind the table (another writer, here Rebuild, moved the
// row on) is folded onto, and the write of the older row changes nothing:
// the row never goes back, the events count as skipped, and the projector
// reads the newer row for the next event.
func TestCacheBehindTheTableDoesNotMoveTheRowBack(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	key := "stale"
	evs := scenario(t, 0, key, epoch) // 5 events
	head := h.journal(events.Operation{}, evs[:4]...)
	run := h.start(projector.DefaultGroup)

	h.publish(h.stored(key, 1)...)
	h.waitSeqs(map[string]int64{key: 1})
	assertCached(t, run, key, 1)

	if _, err := projector.Rebuild(ctx, h.store, nil); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	rebuilt, writtenAt := h.snapshot(), h.projectedAt()
	if got := h.seqs([]string{key})[key]; got != 4 {
		t.Fatalf("rebuilt row at seq %d, want 4", got)
	}
	assertCached(t, run, key, 1) // stale now

	// Seq 2 is folded onto the cached seq 1; its row (seq 2) is older than
	// the table's (seq 4), so the upsert leaves the table alone.
	h.publish(h.stored(key, 2)...)
	waitUntil(t, "seq 2 to be handled", func() bool { return handled(t, run) == 2 })
	if got := run.count(t, projector.OutcomeSkipped); got != 1 {
		t.Errorf("skipped = %d after seq 2, want 1: its row was older than the table's", got)
	}
	assertSameTable(t, "after folding onto a stale record", h.snapshot(), rebuilt)
	if got := h.projectedAt(); !mapsEqual(got, writtenAt) {
		t.Errorf("the row was rewritten: projected_at %v, was %v", got, writtenAt)
	}
	assertCached(t, run, key, 0) // dropped: the table is ahead

	h.publish(h.stored(key, 3, 4)...)
	waitUntil(t, "seqs 3 and 4 to be handled", func() bool { return handled(t, run) == 4 })
	if got := run.count(t, projector.OutcomeSkipped); got != 3 {
		t.Errorf("skipped = %d after seq 4, want 3", got)
	}
	assertCached(t, run, key, 4) // read from the table
	assertSameTable(t, "after skipping", h.snapshot(), rebuilt)

	h.journal(head, evs[4])
	h.publish(h.stored(key, 5)...)
	h.waitSeqs(map[string]int64{key: 5})
	h.assertMatchesReplay(key)
	assertCached(t, run, key, 5)
	if got := run.countOnce(t, projector.OutcomeApplied, 2); got != 2 {
		t.Errorf("applied = %d, want 2 (seqs 1 and 5)", got)
	}
	if got := run.count(t, projector.OutcomeGapFilled); got != 0 {
		t.Errorf("gap filled = %d, want 0", got)
	}
}

// A row behind the cached record (as after an asynchronous commit lost in a
// database crash) is repaired by the next event, which is folded onto the
// cached record rather than onto the row.
func TestRowBehindTheCacheIsRepairedByTheNextEvent(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	key := "behind"
	evs := scenario(t, 0, key, epoch)
	h.journal(events.Operation{}, evs[:3]...)
	run := h.start(projector.DefaultGroup)

	h.publish(h.stored(key, 1)...)
	h.waitSeqs(map[string]int64{key: 1})
	if _, err := h.pool.Exec(ctx, `CREATE TABLE saved_row AS SELECT * FROM operation_state WHERE operation_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	h.publish(h.stored(key, 2)...)
	h.waitSeqs(map[string]int64{key: 2})
	assertCached(t, run, key, 2)

	// Put the row back to seq 1, every column of it.
	if _, err := h.pool.Exec(ctx, `UPDATE operation_state s SET (
		    tool, effect_class, payload_hash, principal, status, phase, attempt, lease_until, result,
		    downstream_id, undo_ref, last_error_class, compensations, evidence, escalation, last_seq,
		    record, body, created_at, updated_at, projected_at) = (
		    r.tool, r.effect_class, r.payload_hash, r.principal, r.status, r.phase, r.attempt, r.lease_until, r.result,
		    r.downstream_id, r.undo_ref, r.last_error_class, r.compensations, r.evidence, r.escalation, r.last_seq,
		    r.record, r.body, r.created_at, r.updated_at, r.projected_at)
		  FROM saved_row r WHERE s.operation_key = r.operation_key`); err != nil {
		t.Fatal(err)
	}
	if got := h.seqs([]string{key})[key]; got != 1 {
		t.Fatalf("rolled back row at seq %d, want 1", got)
	}

	h.publish(h.stored(key, 3)...)
	h.waitSeqs(map[string]int64{key: 3})
	h.assertMatchesReplay(key)
	// Folded onto the row at seq 1, seq 3 would have needed a gap fill.
	if got := run.count(t, projector.OutcomeGapFilled); got != 0 {
		t.Errorf("gap filled = %d, want 0: seq 3 was folded onto the cached seq 2", got)
	}
	if got := run.countOnce(t, projector.OutcomeApplied, 3); got != 3 {
		t.Errorf("applied = %d, want 3", got)
	}
}

// With a cache far smaller than the operations in flight, records are
// evicted all the time; the operations that miss read their rows, and every
// row is still the fold of its events at every step.
func TestCacheEvictionKeepsRowsCorrect(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const capacity = 3
	run := h.start(projector.DefaultGroup, func(c *projector.Config) { c.CacheSize = capacity })

	ops := opsOf(t, "evict", 10)
	heads := map[string]events.Operation{}
	want := map[string]int64{}
	total := 0
	for step := 0; ; step++ {
		progressed := false
		for key, evs := range ops {
			if step < len(evs) {
				progressed = true
				heads[key] = h.journal(heads[key], evs[step])
				h.publish(h.stored(key, int64(step+1))...)
				want[key] = int64(step + 1)
				total++
			}
		}
		if !progressed {
			break
		}
		h.waitSeqs(want)
		for key := range want {
			h.assertMatchesReplay(key)
		}
		if n := projector.CacheLen(run.projector); n > capacity {
			t.Errorf("step %d: %d records cached, cap %d", step, n, capacity)
		}
	}
	if got := run.countOnce(t, projector.OutcomeApplied, int64(total)); got != int64(total) {
		t.Errorf("applied = %d, want %d", got, total)
	}
	// A miss reads the current row, so nothing is ever a gap or a repeat.
	if got := run.count(t, projector.OutcomeGapFilled) + run.count(t, projector.OutcomeSkipped); got != 0 {
		t.Errorf("gap fills + skips = %d, want 0", got)
	}
}

// An operation evicted from the cache is read from the table on its next
// event: here the table has moved on since (Rebuild), and the event applies
// onto the row it read, where the evicted record would have needed a gap
// fill.
func TestMissAfterEvictionReadsTheRow(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	evs := scenario(t, 0, "evicted", epoch)
	head := h.journal(events.Operation{}, evs[:3]...)
	other := scenario(t, 0, "other", epoch)
	h.journal(events.Operation{}, other[0])
	// A cap of 1 empties the cache whenever a second operation is added.
	run := h.start(projector.DefaultGroup, func(c *projector.Config) { c.CacheSize = 1 })

	h.publish(h.stored("evicted", 1)...)
	h.waitSeqs(map[string]int64{"evicted": 1})
	assertCached(t, run, "evicted", 1)
	h.publish(h.stored("other", 1)...)
	h.waitSeqs(map[string]int64{"other": 1})
	assertCached(t, run, "evicted", 0)

	if _, err := projector.Rebuild(ctx, h.store, nil); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	h.journal(head, evs[3])
	h.publish(h.stored("evicted", 4)...)
	h.waitSeqs(map[string]int64{"evicted": 4})
	h.assertMatchesReplay("evicted")
	if got := run.count(t, projector.OutcomeGapFilled); got != 0 {
		t.Errorf("gap filled = %d, want 0: seq 4 was folded onto the row at seq 3", got)
	}
	assertCached(t, run, "evicted", 4)
}

// A flush that fails (here: it times out waiting on a table lock) may or
// may not have committed, so it drops its operations from the cache; its
// event is delivered again and applies once the table is free.
func TestFailedFlushDropsItsKeysFromTheCache(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	key := "failed"
	evs := scenario(t, 0, key, epoch)
	h.journal(events.Operation{}, evs[:2]...)
	run := h.start(projector.DefaultGroup, func(c *projector.Config) { c.FlushTimeout = 200 * time.Millisecond })

	h.publish(h.stored(key, 1)...)
	h.waitSeqs(map[string]int64{key: 1})
	assertCached(t, run, key, 1)

	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Rebuild's lock: reads go on, writes wait.
	if _, err := tx.Exec(ctx, `LOCK TABLE operation_state IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	h.publish(h.stored(key, 2)...)
	waitUntil(t, "the blocked flush to fail and drop its key", func() bool {
		_, ok := projector.CachedSeq(run.projector, key)
		return !ok
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitSeqs(map[string]int64{key: 2})
	h.assertMatchesReplay(key)
	assertCached(t, run, key, 2)
}

// The projector's own pool commits asynchronously, and only it: the store's
// pool keeps the server's setting. With SynchronousCommit the projector
// writes on the store's pool.
func TestProjectionPoolCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	ctx := t.Context()
	show := func(what string, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var v string
		if err := q.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil {
			t.Fatalf("%s: SHOW synchronous_commit: %v", what, err)
		}
		return v
	}

	pool, closePool, err := projector.OpenWritePool(ctx, h.store, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closePool()
	if pool == h.pool {
		t.Fatal("asynchronous commit: the projector writes on the store's pool")
	}
	if got := pool.Config().MaxConns; got != 2 {
		t.Errorf("projection pool MaxConns = %d, want 2 (one per flusher)", got)
	}
	// Every connection of the pool, not only the first one.
	conns := make([]*pgxpool.Conn, 0, 2)
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if got := show("projection pool", c); got != "off" {
			t.Errorf("projection pool: synchronous_commit = %q, want off", got)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	if got := show("store pool", h.pool); got != "on" {
		t.Errorf("store pool: synchronous_commit = %q, want on", got)
	}

	syncPool, closeSync, err := projector.OpenWritePool(ctx, h.store, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSync()
	if syncPool != h.pool {
		t.Error("synchronous commit: the projector should write on the store's pool")
	}
}
