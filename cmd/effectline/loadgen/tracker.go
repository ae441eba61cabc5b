package loadgen

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
)

// tracker follows the n operations of one bench run (bench -n) from the
// agent's commit to their terminal row in the read model, and holds only
// what is in flight, so a run of millions of operations needs no more
// memory than one of thousands at the same rate:
//
//   - the commit times are kept per agent transaction (a batch of keys),
//     and a batch's record is dropped once every one of its operations
//     has settled;
//   - the bench's tool tells the tracker when it is called, and only the
//     operations called and not yet seen settled are asked about, by key
//     (projector.Reader.Settled), so the progress check costs what is in
//     flight, not what the read model holds;
//   - latencies go into fixed-size histograms, and which operations have
//     settled is one bit each (like the tool's duplicate check).
//
// Flat out, the agent may commit intents faster than the pipeline takes
// them; then the commit times of the backlog are held (24 bytes an
// operation) for as long as the backlog lasts, as the outbox holds its rows.
type tracker struct {
	key   func(int) string
	n     int
	batch int

	mu      sync.Mutex
	batches map[int]*batchTimes // by index / batch
	called  map[int]struct{}    // tool called, not yet seen settled
	done    []uint64            // bit i: operation i settled
	// lat is commit → the terminal row projected (projected_at); wlat is
	// commit → the outcome journaled (the row's updated_at, the outcome
	// event's time, which the head row in operations also carries).
	lat, wlat histogram
	completed int       // settled as completed
	failed    int       // settled otherwise (failed, compensated)
	last      time.Time // the latest projected_at seen
}

// batchTimes are the commit times of one agent transaction's operations.
type batchTimes struct {
	at   []time.Time // zero until committed
	left int         // not yet settled
}

func newTracker(n, batch int, key func(int) string) *tracker {
	return &tracker{key: key, n: n, batch: max(batch, 1), batches: map[int]*batchTimes{},
		called: map[int]struct{}{}, done: make([]uint64, (n+63)/64)}
}

// committed records that operations lo..hi-1 committed at at.
func (t *tracker) committed(lo, hi int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := lo; i < hi; i++ {
		b := t.batchOf(i)
		b.at[i%t.batch] = at
	}
}

// batchOf returns operation i's batch record, creating it; t.mu held.
func (t *tracker) batchOf(i int) *batchTimes {
	id := i / t.batch
	b := t.batches[id]
	if b == nil {
		size := min(t.batch, t.n-id*t.batch)
		b = &batchTimes{at: make([]time.Time, size), left: size}
		t.batches[id] = b
	}
	return b
}

// toolCalled is the bench tool's report of a call with downstream key k.
// Keys that are not this run's are ignored: the warm-up's, or a retry
// under a compensation's key (~cN) of one already called.
func (t *tracker) toolCalled(k string) {
	i, ok := t.index(k)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done[i/64]&(1<<(i%64)) == 0 {
		t.called[i] = struct{}{}
	}
}

func (t *tracker) index(k string) (int, bool) {
	if cut := strings.Index(k, "~"); cut >= 0 {
		k = k[:cut]
	}
	cut := strings.LastIndexByte(k, '-')
	if cut < 0 {
		return 0, false
	}
	i, err := strconv.Atoi(k[cut+1:])
	if err != nil || i < 0 || i >= t.n || t.key(i) != k {
		return 0, false
	}
	return i, true
}

// settledReader is projector.Reader.Settled.
type settledReader func(ctx context.Context, keys []string) (map[string]projector.SettledRow, error)

// pollChunk bounds the keys of one query.
const pollChunk = 5000

// poll asks the read model about the operations whose tool was called and
// records those it holds settled. An operation whose commit time is not
// recorded yet (its tool answered before the agent's commit returned) is
// asked about again next time.
func (t *tracker) poll(ctx context.Context, read settledReader) error {
	t.mu.Lock()
	keys := make([]string, 0, min(len(t.called), pollChunk))
	for i := range t.called {
		if len(keys) == pollChunk {
			break
		}
		if b := t.batches[i/t.batch]; b != nil && !b.at[i%t.batch].IsZero() {
			keys = append(keys, t.key(i))
		}
	}
	t.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	rows, err := read(ctx, keys)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, r := range rows {
		i, ok := t.index(k)
		if !ok {
			continue
		}
		t.settle(i, r)
	}
	return nil
}

// settle records operation i settled as r; t.mu held.
func (t *tracker) settle(i int, r projector.SettledRow) {
	if t.done[i/64]&(1<<(i%64)) != 0 {
		return
	}
	t.done[i/64] |= 1 << (i % 64)
	delete(t.called, i)
	b := t.batchOf(i)
	at := b.at[i%t.batch]
	if b.left--; b.left == 0 {
		delete(t.batches, i/t.batch)
	}
	if r.Status != events.StatusCompleted {
		t.failed++
		return
	}
	t.completed++
	t.lat.add(r.ProjectedAt.Sub(at))
	t.wlat.add(r.UpdatedAt.Sub(at))
	if r.ProjectedAt.After(t.last) {
		t.last = r.ProjectedAt
	}
}

// settled is how many operations have settled, completed or not.
func (t *tracker) settled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.completed + t.failed
}

// held is what the tracker holds per operation in flight: the batches
// not yet settled and the operations called and not yet seen settled.
func (t *tracker) held() (batches, called int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.batches), len(t.called)
}
