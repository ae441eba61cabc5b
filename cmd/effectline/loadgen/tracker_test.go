package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
)

// fakeReadModel answers tracker.poll like projector.Reader.Settled over
// the operations it was told settled, and counts the keys it was asked
// about.
type fakeReadModel struct {
	rows  map[string]projector.SettledRow
	asked int
}

func (m *fakeReadModel) settled(_ context.Context, keys []string) (map[string]projector.SettledRow, error) {
	m.asked += len(keys)
	out := map[string]projector.SettledRow{}
	for _, k := range keys {
		if r, ok := m.rows[k]; ok {
			out[k] = r
			delete(m.rows, k)
		}
	}
	return out, nil
}

// TestTrackerHoldsOnlyWhatIsInFlight runs 200,000 operations through the
// tracker 500 at a time, as a steady bench does: what it holds after each
// round is bounded by what is in flight, not by how many completed, and
// each poll asks the read model only about the operations in flight.
func TestTrackerHoldsOnlyWhatIsInFlight(t *testing.T) {
	const n, batch, round = 200_000, 20, 500
	tr := newTracker(n, batch, benchKey)
	rm := &fakeReadModel{rows: map[string]projector.SettledRow{}}
	start := time.Now()
	maxBatches, maxCalled, maxAsked := 0, 0, 0
	for lo := 0; lo < n; lo += round {
		at := start.Add(time.Duration(lo) * time.Millisecond)
		for b := lo; b < lo+round; b += batch {
			tr.committed(b, b+batch, at)
		}
		// The tool is called for every operation of the round; the read
		// model has caught up with all but the last 100 of them.
		for i := lo; i < lo+round; i++ {
			tr.toolCalled(benchKey(i))
			if i < lo+round-100 {
				rm.rows[benchKey(i)] = projector.SettledRow{Status: events.StatusCompleted,
					UpdatedAt: at.Add(2 * time.Millisecond), ProjectedAt: at.Add(5 * time.Millisecond)}
			}
		}
		rm.asked = 0
		if err := tr.poll(context.Background(), rm.settled); err != nil {
			t.Fatal(err)
		}
		// The 100 left behind settle by the next round.
		for i := lo + round - 100; i < lo+round; i++ {
			rm.rows[benchKey(i)] = projector.SettledRow{Status: events.StatusCompleted,
				UpdatedAt: at.Add(2 * time.Millisecond), ProjectedAt: at.Add(5 * time.Millisecond)}
		}
		b, c := tr.held()
		maxBatches, maxCalled, maxAsked = max(maxBatches, b), max(maxCalled, c), max(maxAsked, rm.asked)
	}
	if err := tr.poll(context.Background(), rm.settled); err != nil {
		t.Fatal(err)
	}
	if got := tr.settled(); got != n {
		t.Fatalf("settled %d of %d", got, n)
	}
	if b, c := tr.held(); b != 0 || c != 0 {
		t.Fatalf("after every operation settled the tracker still holds %d batches and %d called keys", b, c)
	}
	// In flight at any time: one round (500 operations: 25 batches) plus
	// the 100 the read model had not caught up with.
	if maxBatches > 2*round/batch || maxCalled > 100 || maxAsked > round+100 {
		t.Fatalf("the tracker held up to %d batches and %d called keys, and a poll asked about %d keys: it grows with the run",
			maxBatches, maxCalled, maxAsked)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.completed != n || tr.lat.n != n || tr.wlat.n != n {
		t.Fatalf("completed %d, latencies %d and %d, want %d", tr.completed, tr.lat.n, tr.wlat.n, n)
	}
	if p := tr.lat.quantile(0.5); p < 4900*time.Microsecond || p > 5100*time.Microsecond {
		t.Fatalf("p50 to the read model = %s, want 5ms", p)
	}
}

// TestTrackerIgnoresOtherKeysAndRepeats checks that a call of a key that
// is not the run's, a repeated call and an operation whose commit time is
// not recorded yet change nothing they should not.
func TestTrackerIgnoresOtherKeysAndRepeats(t *testing.T) {
	tr := newTracker(10, 4, benchKey)
	rm := &fakeReadModel{rows: map[string]projector.SettledRow{}}
	now := time.Now()
	row := projector.SettledRow{Status: events.StatusCompleted, UpdatedAt: now, ProjectedAt: now}
	for _, k := range []string{warmupKey(1), benchKey(10), "other", "", benchKey(3) + "~c1"} {
		tr.toolCalled(k)
	}
	if _, c := tr.held(); c != 1 {
		t.Fatalf("%d keys called, want 1 (op 3 under its compensation's key)", c)
	}
	rm.rows[benchKey(3)] = row
	if err := tr.poll(context.Background(), rm.settled); err != nil {
		t.Fatal(err)
	}
	if rm.asked != 0 || tr.settled() != 0 {
		t.Fatalf("asked about %d keys before their commit time was known", rm.asked)
	}
	tr.committed(0, 4, now.Add(-time.Millisecond))
	if err := tr.poll(context.Background(), rm.settled); err != nil {
		t.Fatal(err)
	}
	tr.toolCalled(benchKey(3)) // a second call after it settled
	rm.rows[benchKey(3)] = row
	if err := tr.poll(context.Background(), rm.settled); err != nil {
		t.Fatal(err)
	}
	if tr.settled() != 1 {
		t.Fatalf("settled %d, want 1", tr.settled())
	}
	tr.committed(8, 10, now)
	tr.toolCalled(benchKey(9))
	rm.rows[benchKey(9)] = projector.SettledRow{Status: events.StatusFailed, UpdatedAt: now, ProjectedAt: now}
	if err := tr.poll(context.Background(), rm.settled); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.completed != 1 || tr.failed != 1 || len(tr.batches) != 2 {
		t.Fatalf("completed %d failed %d batches %d, want 1, 1 and 2 (ops 0-3 and 8-9 not all settled)", tr.completed, tr.failed, len(tr.batches))
	}
}
