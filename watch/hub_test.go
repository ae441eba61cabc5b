package watch_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/watch"
)

const key = "order-1/charge"

// journal is a fake event store: the events of one operation, their head
// record, and how often each query ran.
type journal struct {
	mu        sync.Mutex
	evs       []events.Envelope
	head      events.Operation
	loads     atomic.Int64
	loadManys atomic.Int64
}

func (j *journal) append(t *testing.T, typ events.Type, attempt int, data any) []byte {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	e, err := events.New(typ, key, int64(len(j.evs)+1), "payments.charge", events.Irreversible, attempt, data, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if j.head, err = events.Apply(j.head, e); err != nil {
		t.Fatal(err)
	}
	j.evs = append(j.evs, e)
	raw, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func (j *journal) Load(context.Context, string) (events.Operation, error) {
	j.loads.Add(1)
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.head, nil
}

func (j *journal) LoadMany(_ context.Context, keys []string) (map[string]events.Operation, error) {
	j.loadManys.Add(1)
	j.mu.Lock()
	defer j.mu.Unlock()
	return map[string]events.Operation{key: j.head}, nil
}

func settled(op events.Operation) bool { return events.OutcomeOf(op).State.Settled() }

func run(t *testing.T, cfg watch.Config) (*watch.Hub, context.CancelFunc) {
	t.Helper()
	h, err := watch.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h, cancel
}

func intentAndStart(t *testing.T, j *journal) {
	j.append(t, events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(`{"amount":1}`), Principal: "p"})
	j.append(t, events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)})
}

// Delivered events are folded into the waiter's record: no query at all
// after the one head read.
func TestDeliveredEventsWakeWithoutQueries(t *testing.T) {
	j := &journal{}
	h, _ := run(t, watch.Config{Loader: j, SweepInterval: time.Hour})
	intentAndStart(t, j)
	w := h.Watch(key)
	defer w.Close()
	head, _ := j.Load(context.Background(), key)
	got := make(chan events.Operation, 1)
	go func() { got <- w.Until(context.Background(), head, settled) }()
	h.Deliver(key, j.append(t, events.AttemptSucceeded, 1, events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"ch_1"}`)}))
	op := <-got
	if op.Status != events.StatusCompleted || string(op.Result) != `{"id":"ch_1"}` {
		t.Fatalf("woken with %s %s", op.Status, op.Result)
	}
	if n := j.loads.Load(); n != 1 {
		t.Errorf("%d loads, want only the head read", n)
	}
}

// A gap in the feed (an event never delivered) reloads the head once.
func TestAGapReloadsTheHead(t *testing.T) {
	j := &journal{}
	h, _ := run(t, watch.Config{Loader: j, SweepInterval: time.Hour})
	j.append(t, events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(`{"amount":1}`), Principal: "p"})
	w := h.Watch(key)
	defer w.Close()
	head, _ := j.Load(context.Background(), key)
	got := make(chan events.Operation, 1)
	go func() { got <- w.Until(context.Background(), head, settled) }()
	j.append(t, events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)})
	h.Deliver(key, j.append(t, events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422"}))
	if op := <-got; op.Status != events.StatusFailed {
		t.Fatalf("woken with %s", op.Status)
	}
	if n := j.loads.Load(); n != 2 {
		t.Errorf("%d loads, want the head read and one reload", n)
	}
}

// With no feed at all, the sweep wakes every waiter with one query.
func TestTheSweepWakesEveryWaiterWithOneQuery(t *testing.T) {
	j := &journal{}
	h, _ := run(t, watch.Config{Loader: j, SweepInterval: 20 * time.Millisecond})
	intentAndStart(t, j)
	head, _ := j.Load(context.Background(), key)
	const n = 200
	var wg sync.WaitGroup
	var woke atomic.Int64
	for range n {
		w := h.Watch(key)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			if op := w.Until(context.Background(), head, settled); op.Status == events.StatusNeedsReconciliation {
				woke.Add(1)
			}
		}()
	}
	before := j.loadManys.Load()
	j.append(t, events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile})
	wg.Wait()
	if woke.Load() != n {
		t.Fatalf("%d of %d waiters saw the unknown outcome", woke.Load(), n)
	}
	// Each sweep is one query for all 200; a handful ran meanwhile.
	if q := j.loadManys.Load() - before; q > 50 {
		t.Errorf("%d sweep queries for %d waiters", q, n)
	}
	if j.loads.Load() != 1 {
		t.Errorf("%d single loads: a waiter queried for itself", j.loads.Load())
	}
	if h.Waiting() != 0 {
		t.Errorf("%d watches left", h.Waiting())
	}
}

// Stopping the hub releases every waiter with the record it has, and a
// watch registered afterwards is released at once.
func TestStoppingReleasesEveryWaiter(t *testing.T) {
	j := &journal{}
	h, stop := run(t, watch.Config{Loader: j, SweepInterval: time.Hour})
	intentAndStart(t, j)
	head, _ := j.Load(context.Background(), key)
	const n = 50
	got := make(chan events.Operation, n)
	for range n {
		w := h.Watch(key)
		go func() { defer w.Close(); got <- w.Until(context.Background(), head, settled) }()
	}
	stop()
	for range n {
		if op := <-got; op.Seq != head.Seq {
			t.Fatalf("released with seq %d, want %d", op.Seq, head.Seq)
		}
	}
	w := h.Watch(key)
	if op := w.Until(context.Background(), head, settled); op.Seq != head.Seq {
		t.Fatal("a late watch was not released")
	}
}

// Two feeds (the store's commits in this process, the Kafka tail) deliver
// the same events, in either order and late: each is folded once, nothing
// is reloaded, and the record is the journal's.
func TestRepeatsFromTwoFeedsFoldOnce(t *testing.T) {
	j := &journal{}
	h, _ := run(t, watch.Config{Loader: j, SweepInterval: time.Hour})
	j.append(t, events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(`{"amount":1}`), Principal: "p"})
	w := h.Watch(key)
	defer w.Close()
	head, _ := j.Load(context.Background(), key)
	started := j.append(t, events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)})
	succeeded := j.append(t, events.AttemptSucceeded, 1, events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"ch_1"}`)})
	h.Deliver(key, started)   // the commit
	h.Deliver(key, started)   // Kafka
	h.Deliver(key, succeeded) // the commit
	h.Deliver(key, started)   // Kafka again, behind
	h.Deliver(key, succeeded) // Kafka
	op, applied, continuous, err := w.Advance(context.Background(), head)
	if err != nil || !continuous {
		t.Fatalf("Advance: %v, continuous %v", err, continuous)
	}
	if len(applied) != 2 || applied[0].Seq != 2 || applied[1].Seq != 3 {
		t.Fatalf("applied %d events, want seq 2 and 3 once each", len(applied))
	}
	if op.Seq != 3 || op.Status != events.StatusCompleted || op.Attempt != 1 || string(op.Result) != `{"id":"ch_1"}` {
		t.Fatalf("record after the repeats: seq %d %s attempt %d %s", op.Seq, op.Status, op.Attempt, op.Result)
	}
	if op.Seq != j.head.Seq || op.Status != j.head.Status {
		t.Fatalf("record %d %s, the journal's %d %s", op.Seq, op.Status, j.head.Seq, j.head.Status)
	}
	// Kafka's copies arriving after the waiter folded them change nothing.
	h.Deliver(key, started)
	h.Deliver(key, succeeded)
	again, applied, continuous, err := w.Advance(context.Background(), op)
	if err != nil || !continuous || len(applied) != 0 || again.Seq != op.Seq {
		t.Fatalf("late repeats: applied %d, seq %d, continuous %v, err %v", len(applied), again.Seq, continuous, err)
	}
	if n := j.loads.Load(); n != 1 {
		t.Errorf("%d loads, want only the head read: a repeat reloaded", n)
	}
}

// BenchmarkDeliverUnwatched is what the store's commit hook costs the
// committer per event nobody waits for: a map lookup under the hub's lock,
// no decoding, no allocation. A thousand other keys are watched.
func BenchmarkDeliverUnwatched(b *testing.B) {
	h, err := watch.New(watch.Config{Loader: &journal{}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		defer h.Watch("watched-" + strconv.Itoa(i)).Close()
	}
	env := []byte(`{"event_id":"x","type":"attempt.succeeded","operation_key":"unwatched","seq":3}`)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		h.Deliver("unwatched", env)
	}
}
