package projector_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
)

var epoch = time.Date(2026, 3, 1, 9, 0, 0, 123456789, time.UTC)

// opsOf builds n operations cycling through every scenario.
func opsOf(t testing.TB, prefix string, n int) map[string][]events.Envelope {
	ops := map[string][]events.Envelope{}
	for i := range n {
		key := fmt.Sprintf("%s-%02d", prefix, i)
		ops[key] = scenario(t, i, key, epoch.Add(time.Duration(i)*time.Second))
	}
	return ops
}

// journalAndPublish journals every operation's events and publishes them in
// order, and returns the seq each row must reach.
func (h *harness) journalAndPublish(ops map[string][]events.Envelope) map[string]int64 {
	h.t.Helper()
	want := map[string]int64{}
	for key, evs := range ops {
		h.journal(events.Operation{}, evs...)
		h.publish(h.stored(key)...)
		want[key] = int64(len(evs))
	}
	return want
}

// The live projection follows each operation through every state it passes,
// and at each step the row is the fold of what was journaled so far.
func TestProjectorFollowsOperationsThroughTheirStates(t *testing.T) {
	t.Parallel()
	h := setup(t)
	run := h.start(projector.DefaultGroup)

	ops := opsOf(t, "live", 10)
	heads := map[string]events.Operation{}
	want := map[string]int64{}
	total := 0
	for step := 0; ; step++ {
		progressed := false
		for key, evs := range ops {
			if step >= len(evs) {
				continue
			}
			progressed = true
			heads[key] = h.journal(heads[key], evs[step])
			h.publish(h.stored(key, int64(step+1))...)
			want[key] = int64(step + 1)
			total++
		}
		if !progressed {
			break
		}
		h.waitSeqs(want)
		for key := range want {
			h.assertMatchesReplay(key)
		}
	}
	if got := run.countOnce(t, projector.OutcomeApplied, int64(total)); got != int64(total) {
		t.Errorf("applied = %d, want %d (every event once)", got, total)
	}
	if got := run.count(t, projector.OutcomeGapFilled) + run.count(t, projector.OutcomeSkipped); got != 0 {
		t.Errorf("gap fills + skips = %d in an in-order stream, want 0", got)
	}
	if got := run.lagSamples(t); got != uint64(total) {
		t.Errorf("lag samples = %d, want %d", got, total)
	}
}

// Replaying the whole topic from offset 0 in a new consumer group rebuilds
// the same table from nothing, and replaying it again over the full table
// changes nothing, not even projected_at.
func TestReplayFromOffsetZeroChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ops := opsOf(t, "replay", 10)
	want := h.journalAndPublish(ops)
	total := int64(0)
	for _, s := range want {
		total += s
	}

	live := h.start("live")
	h.waitSeqs(want)
	live.stop()
	liveRows := h.snapshot()

	if _, err := h.pool.Exec(t.Context(), `DELETE FROM operation_state`); err != nil {
		t.Fatal(err)
	}
	first := h.start("replay-1")
	h.waitSeqs(want)
	first.stop()
	assertSameTable(t, "first replay into an empty table", h.snapshot(), liveRows)
	writtenAt := h.projectedAt()

	second := h.start("replay-2")
	waitUntil(t, "the second replay to skip every event", func() bool {
		return second.count(t, projector.OutcomeSkipped) == total
	})
	second.stop()
	if got := second.count(t, projector.OutcomeApplied); got != 0 {
		t.Errorf("second replay applied %d events, want 0", got)
	}
	assertSameTable(t, "second replay over the full table", h.snapshot(), liveRows)
	if got := h.projectedAt(); !mapsEqual(got, writtenAt) {
		t.Errorf("second replay rewrote rows: projected_at %v, was %v", got, writtenAt)
	}
}

// Events delivered out of order and more than once converge on the fold.
func TestOutOfOrderAndDuplicateDeliveryConverges(t *testing.T) {
	t.Parallel()
	h := setup(t)
	key := "reordered"
	evs := scenario(t, 1, key, epoch) // 7 events: compensated, then retried
	h.journal(events.Operation{}, evs...)
	run := h.start(projector.DefaultGroup)

	// One key, so one partition: the projector sees exactly this order.
	order := []int64{1, 3, 2, 2, 4, 6, 5, 5, 7, 7}
	h.publish(h.stored(key, order...)...)
	h.waitSeqs(map[string]int64{key: 7})
	h.assertMatchesReplay(key)

	// How the ten messages split into applied and skipped depends on how
	// they were batched (a batch is folded in seq order); every one is
	// handled, and the row converges (asserted above).
	waitUntil(t, "every message to be handled", func() bool {
		// A message that fills a gap counts as applied too.
		return run.count(t, projector.OutcomeApplied)+run.count(t, projector.OutcomeSkipped) == int64(len(order))
	})
	// How many count as skipped is not fixed either: two flushers may fold
	// the same operation at once (nothing locks its row), and the upsert's
	// last_seq guard keeps the later one from going backwards.
}

// An operation whose only delivered event is its last gets its whole
// history from the event store.
func TestGapIsFilledFromTheEventStore(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ops := opsOf(t, "gap", 5)
	want := map[string]int64{}
	filled := int64(0)
	for key, evs := range ops {
		h.journal(events.Operation{}, evs...)
		last := int64(len(evs))
		h.publish(h.stored(key, last)...)
		want[key] = last
		filled += last - 1
	}
	run := h.start(projector.DefaultGroup)
	h.waitSeqs(want)
	for key := range want {
		h.assertMatchesReplay(key)
	}
	if got := run.count(t, projector.OutcomeGapFilled); got != filled {
		t.Errorf("gap filled = %d, want %d", got, filled)
	}
	if got := run.countOnce(t, projector.OutcomeApplied, int64(len(want))); got != int64(len(want)) {
		t.Errorf("applied = %d, want %d", got, len(want))
	}
}

// A message that is not an event, and an event that cannot apply, in the
// middle of a partition are dropped, and the events behind them are
// projected.
func TestMalformedMessagesDoNotBlockThePartition(t *testing.T) {
	t.Parallel()
	h := setup(t)
	key := "poisoned"
	evs := scenario(t, 0, key, epoch) // 5 events
	h.journal(events.Operation{}, evs...)
	run := h.start(projector.DefaultGroup)

	h.publish(h.stored(key, 1, 2)...)
	h.produceRaw(key, []byte("not json at all"))
	h.produceRaw(key, []byte(`{"event_id":"x","type":"attempt.started"}`))
	// A valid envelope with the next seq that the fold refuses: attempt 7
	// never started.
	forged, err := events.New(events.AttemptSucceeded, key, 3, evs[0].Tool, evs[0].EffectClass, 7,
		events.AttemptSucceededData{Result: json.RawMessage(`{}`)}, epoch.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	h.produceRaw(key, mustEncode(t, forged))
	// (A result with \u0000, which jsonb cannot hold, is no longer a poison
	// message: derived records go through store.JSONBSafe.)
	h.publish(h.stored(key, 3, 4, 5)...)

	h.waitSeqs(map[string]int64{key: 5})
	h.assertMatchesReplay(key)
	if got := run.rejected(t); got != 2 {
		t.Errorf("malformed = %d, want 2", got)
	}
	// The forged seq 3 is rejected when it is folded before the real one,
	// and skipped as a repeat when it is folded after it (a batch is folded
	// in seq order); either way the row matches the journal.
	if got := run.count(t, projector.OutcomeRejected); got > 1 {
		t.Errorf("rejected = %d, want at most 1 (the forged event)", got)
	}
}

func mustEncode(t testing.TB, e events.Envelope) []byte {
	t.Helper()
	b, err := events.Encode(e)
	if err != nil {
		t.Fatalf("encoding: %v", err)
	}
	return b
}

// Rebuild from the event store gives the live projection's table back, row
// for row, whatever the table held before; and the live projector goes on
// on top of it.
func TestRebuildEqualsTheLiveProjection(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	ops := opsOf(t, "rebuild", 10)
	want := h.journalAndPublish(ops)
	run := h.start(projector.DefaultGroup)
	h.waitSeqs(want)
	liveRows := h.snapshot()

	// Damage the table: a wrong row and a row of no operation.
	if _, err := h.pool.Exec(ctx, `UPDATE operation_state SET status = 'failed', record = '{}', body = NULL WHERE operation_key = 'rebuild-00'`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `INSERT INTO operation_state SELECT 'ghost', tool, effect_class, payload_hash, principal, status, phase, attempt,
		lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence, escalation, last_seq, record,
		created_at, updated_at, projected_at, body FROM operation_state WHERE operation_key = 'rebuild-01'`); err != nil {
		t.Fatal(err)
	}

	rebuilt, err := projector.Rebuild(ctx, h.store, nil)
	if err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	if n := rebuilt.Operations; n != len(ops) {
		t.Errorf("Rebuild wrote %d operations, want %d", n, len(ops))
	}
	assertSameTable(t, "rebuilt table", h.snapshot(), liveRows)

	// The running projector continues on the rebuilt table.
	key := "rebuild-04" // escalated, waiting for a decision
	head, err := h.store.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	next, err := events.New(events.DecisionRecorded, key, head.Seq+1, head.Tool, head.EffectClass, 0,
		events.DecisionData{Action: events.ActionAbandon, Approver: "bob"}, head.UpdatedAt.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	h.journal(head, next)
	h.publish(h.stored(key, head.Seq+1)...)
	h.waitSeqs(map[string]int64{key: head.Seq + 1})
	h.assertMatchesReplay(key)
	_ = run
}

// Rebuild pages through the journal; operations whose events straddle page
// boundaries fold the same as in one page.
func TestRebuildAcrossPages(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	ctx := t.Context()
	ops := opsOf(t, "paged", 23)
	for _, evs := range ops {
		h.journal(events.Operation{}, evs...)
	}
	rebuilt, err := projector.Rebuild(ctx, h.store, nil)
	if n := rebuilt.Operations; err != nil || n != len(ops) {
		t.Fatalf("Rebuild = %d, %v; want %d", n, err, len(ops))
	}
	onePage := h.snapshot()
	for _, sizes := range [][2]int{{1, 1}, {3, 2}, {7, 5}, {1000, 1}} {
		rebuilt, err := projector.RebuildPaged(ctx, h.store, nil, sizes[0], sizes[1])
		if n := rebuilt.Operations; err != nil || n != len(ops) {
			t.Fatalf("rebuild with pages %v = %d, %v; want %d", sizes, n, err, len(ops))
		}
		assertSameTable(t, fmt.Sprintf("pages %v", sizes), h.snapshot(), onePage)
	}
	for key := range ops {
		h.assertMatchesReplay(key)
	}

	empty := setupDB(t)
	if r, err := projector.Rebuild(ctx, empty.store, nil); err != nil || r.Operations != 0 {
		t.Errorf("Rebuild of an empty store = %d, %v; want 0, nil", r.Operations, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := projector.New(projector.Config{}); err == nil {
		t.Error("New without a store: want an error")
	}
	h := setupDB(t)
	if _, err := projector.New(projector.Config{Store: h.store}); err == nil {
		t.Error("New without brokers: want an error")
	}
	c := projector.Config{}.WithDefaults()
	if c.Group != projector.DefaultGroup || c.MaxBatch <= 0 || c.Flushers <= 0 || c.FlushTimeout <= 0 ||
		c.Logger == nil || c.TracerProvider == nil || c.MeterProvider == nil {
		t.Errorf("WithDefaults left fields unset: %+v", c)
	}
}

// Run returns when its context ends and leaves no goroutine of its own, or
// of the consumer it started, behind. Not parallel: it inspects every
// goroutine of the test binary.
func TestRunStopsWithoutLeaks(t *testing.T) {
	h := setup(t)
	evs := scenario(t, 3, "leak", epoch)
	h.journal(events.Operation{}, evs...)
	h.publish(h.stored("leak")...)
	h.closeProducer() // its goroutines are not the projector's
	run := h.start(projector.DefaultGroup)
	h.waitSeqs(map[string]int64{"leak": int64(len(evs))})
	run.stop()

	var leaked []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		leaked = goroutinesIn("effectline/projector.", "ThreeDotsLabs/watermill", "IBM/sarama")
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Run returned:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goroutinesIn returns the stacks of goroutines running code whose name
// contains one of the fragments. Parallel tests of the package waiting for
// this one to finish are not the projector's.
func goroutinesIn(fragments ...string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "testing.(*T).Parallel") {
			continue
		}
		for _, f := range fragments {
			if strings.Contains(g, f) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// Rebuild may run while the projector writes: the projector waits on the
// rebuild's table lock, then continues on the rebuilt rows, and the table
// ends as the fold of every operation.
func TestRebuildWhileProjecting(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.start(projector.DefaultGroup)
	ops := opsOf(t, "concurrent", 10)

	done := make(chan struct{})
	rebuilds := 0
	go func() {
		defer close(done)
		for {
			select {
			case <-t.Context().Done():
				return
			default:
			}
			if _, err := projector.Rebuild(t.Context(), h.store, nil); err != nil {
				if t.Context().Err() == nil {
					t.Errorf("Rebuild: %v", err)
				}
				return
			}
			rebuilds++
			if rebuilds >= 20 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	heads := map[string]events.Operation{}
	want := map[string]int64{}
	for step := 0; step < 7; step++ {
		for key, evs := range ops {
			if step < len(evs) {
				heads[key] = h.journal(heads[key], evs[step])
				h.publish(h.stored(key, int64(step+1))...)
				want[key] = int64(step + 1)
			}
		}
	}
	<-done
	h.waitSeqs(want)
	for key := range want {
		h.assertMatchesReplay(key)
	}
	if rebuilds == 0 {
		t.Error("no rebuild ran")
	}
}
