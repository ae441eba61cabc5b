package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// harness is a migrated database and a broker with effectline's topics.
type harness struct {
	url    string
	pool   *pgxpool.Pool
	store  *store.Store
	broker *testenv.Broker
	kcfg   kafka.Config
}

func setup(t testing.TB, brokerOpts ...testenv.BrokerOption) *harness {
	t.Helper()
	dbURL := storedb.New(t)
	pool := testenv.NewPool(t, dbURL)
	broker := testenv.NewBroker(t, brokerOpts...)
	h := &harness{url: dbURL, pool: pool, store: store.New(pool), broker: broker}
	h.kcfg = kafka.Config{Brokers: broker.Addrs, Partitions: 3, ConnectTimeout: 10 * time.Second}
	if err := kafka.EnsureTopics(context.Background(), h.kcfg); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) producer(t testing.TB) *kafka.Producer {
	t.Helper()
	p, err := kafka.NewProducer(h.kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// poolNamed opens another pool on the test database whose connections carry
// application_name, so a test can find (and terminate) their backends.
func (h *harness) poolNamed(t testing.TB, name string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return testenv.NewPool(t, u.String())
}

// testLogger writes to the test's output and counts messages.
type testLogger struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	logs *slog.Logger
}

func newTestLogger(t testing.TB) *testLogger {
	l := &testLogger{}
	w := &lockedWriter{mu: &l.mu, w: &l.buf}
	l.logs = slog.New(slog.NewTextHandler(multiWriter{w, t.Output()}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return l
}

func (l *testLogger) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Count(l.buf.Bytes(), []byte(fmt.Sprintf("msg=%q", msg)))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

type multiWriter []interface{ Write([]byte) (int, error) }

func (m multiWriter) Write(p []byte) (int, error) {
	for _, w := range m {
		_, _ = w.Write(p)
	}
	return len(p), nil
}

// runRelay runs r until the returned stop is called (or the test ends) and
// fails the test if Run does not return promptly after its ctx is done.
func runRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Relay.Run returned %v; want nil after its context ended", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Relay.Run did not return within 15s of its context ending")
		}
	})
	t.Cleanup(stop)
	return stop
}

// eventual polls cond every 20ms until it holds or timeout passes.
func eventual(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consume reads topic from the start of every partition until done says the
// records read so far are enough, or timeout passes. Records are in offset
// order per partition, and one key is always in one partition.
func consume(t testing.TB, addrs []string, topic string, timeout time.Duration, done func([]*kgo.Record) bool) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for !done(out) && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

type keySeq struct {
	key string
	seq int64
}

func decodeRecord(t testing.TB, r *kgo.Record) events.Envelope {
	t.Helper()
	e, err := events.Decode(r.Value)
	if err != nil {
		t.Fatalf("record %s/%d@%d: %v", r.Topic, r.Partition, r.Offset, err)
	}
	if e.OperationKey != string(r.Key) {
		t.Fatalf("record %s/%d@%d: key %q, envelope of %q", r.Topic, r.Partition, r.Offset, r.Key, e.OperationKey)
	}
	return e
}

// distinct counts the distinct (key, seq) pairs in recs.
func distinct(t testing.TB, recs []*kgo.Record) int {
	seen := map[keySeq]bool{}
	for _, r := range recs {
		e := decodeRecord(t, r)
		seen[keySeq{e.OperationKey, e.Seq}] = true
	}
	return len(seen)
}

// checkStreams plays a consumer that deduplicates by (key, seq) the way the
// projector does: a record whose seq it has already passed is a duplicate
// and dropped. What remains must be, per key, exactly 1, 2, … want[key]:
// in order, without gaps, complete. It returns how many duplicates it
// dropped.
func checkStreams(t testing.TB, recs []*kgo.Record, want map[string]int64) (dups int) {
	t.Helper()
	applied := map[string]int64{}
	var errs []string
	for _, r := range recs {
		e := decodeRecord(t, r)
		last := applied[e.OperationKey]
		switch {
		case e.Seq <= last:
			dups++
		case e.Seq == last+1:
			applied[e.OperationKey] = e.Seq
		default:
			errs = append(errs, fmt.Sprintf("%s: seq %d after %d (partition %d offset %d)", e.OperationKey, e.Seq, last, r.Partition, r.Offset))
		}
	}
	for key, w := range want {
		if applied[key] != w {
			errs = append(errs, fmt.Sprintf("%s: applied up to seq %d, want %d", key, applied[key], w))
		}
	}
	for key := range applied {
		if _, ok := want[key]; !ok {
			errs = append(errs, fmt.Sprintf("%s: unexpected operation", key))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		if len(errs) > 20 {
			errs = append(errs[:20], fmt.Sprintf("… and %d more", len(errs)-20))
		}
		t.Fatalf("%d problems in %d records:\n%s", len(errs), len(recs), joinLines(errs))
	}
	return dups
}

func joinLines(ss []string) string {
	var b bytes.Buffer
	for _, s := range ss {
		b.WriteString("  " + s + "\n")
	}
	return b.String()
}

// workload drives operations through five events each: intent.recorded,
// attempt.started, attempt.unknown (retry), attempt.started, and
// attempt.succeeded; the intent goes to two topics, so an operation is six
// outbox rows.
const eventsPerOp = 5

var workT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func nextEvent(t testing.TB, op events.Operation) events.Envelope {
	t.Helper()
	at := workT0.Add(time.Duration(op.Seq) * time.Second)
	var (
		typ  events.Type
		data any
	)
	attempt := op.Attempt
	switch op.Seq {
	case 1, 3:
		typ, attempt = events.AttemptStarted, op.Attempt+1
		data = events.AttemptStartedData{DownstreamKey: op.Key, Worker: "w", LeaseUntil: at.Add(time.Minute)}
	case 2:
		retry := at.Add(time.Second)
		typ = events.AttemptUnknown
		data = events.AttemptUnknownData{ErrorClass: "timeout", Next: events.NextRetry, RetryAt: &retry}
	case 4:
		typ = events.AttemptSucceeded
		data = events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"ok":true}`)}
	default:
		t.Fatalf("no event after seq %d", op.Seq)
	}
	e, err := events.New(typ, op.Key, op.Seq+1, op.Tool, op.EffectClass, attempt, data, at)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func testIntent(key string) outbox.Intent {
	return outbox.Intent{OperationKey: key, Tool: "inventory.reserve", EffectClass: events.Idempotent,
		Args: json.RawMessage(`{"sku":"A-1","qty":2}`), Principal: "order-agent"}
}

// appendWorkload writes the five events of each operation of keys, batch
// operations at a time: their intents with outbox.AppendMany in one
// transaction, then each later step with store.AppendBatch (one
// transaction per step). An operation's events are thus written in quick
// succession, so several of its rows wait in the outbox together. Errors
// fail the test (t.Errorf: it may run in any goroutine).
func appendWorkload(t testing.TB, s *store.Store, keys []string, batch int) {
	ctx := context.Background()
	for i := 0; i < len(keys); i += batch {
		chunk := keys[i:min(i+batch, len(keys))]
		ins := make([]outbox.Intent, len(chunk))
		for j, k := range chunk {
			ins[j] = testIntent(k)
		}
		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Errorf("begin: %v", err)
			return
		}
		res, err := outbox.AppendMany(ctx, tx, ins)
		if err != nil {
			_ = tx.Rollback(ctx)
			t.Errorf("AppendMany: %v", err)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("commit: %v", err)
			return
		}
		ops := make([]events.Operation, len(chunk))
		for j, r := range res {
			ops[j] = r.Operation
		}
		for step := 1; step < eventsPerOp; step++ {
			as := make([]store.Append, len(ops))
			for j, op := range ops {
				as[j] = store.Append{Base: op, Events: []events.Envelope{nextEvent(t, op)}, TopicPrefix: "effectline."}
			}
			for j, r := range s.AppendBatch(ctx, as) {
				if r.Err != nil {
					t.Errorf("append to %s: %v", chunk[j], r.Err)
					return
				}
				ops[j] = r.Op
			}
		}
	}
}

// countingPublisher counts Send calls and lets a test interfere after each.
type countingPublisher struct {
	next  outbox.Publisher
	mu    sync.Mutex
	sends int
	// after runs after each Send with its 1-based number and result; what
	// it returns is what the relay sees.
	after func(n int, err error) error
}

func (p *countingPublisher) Send(ctx context.Context, recs []kafka.Record) error {
	err := p.next.Send(ctx, recs)
	p.mu.Lock()
	p.sends++
	n := p.sends
	p.mu.Unlock()
	if p.after != nil {
		return p.after(n, err)
	}
	return err
}

func (p *countingPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sends
}

func opKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return keys
}

func wantAll(keys []string, last int64) map[string]int64 {
	m := make(map[string]int64, len(keys))
	for _, k := range keys {
		m[k] = last
	}
	return m
}

// appendIntentEvents returns the intent.recorded event of testIntent(key).
func appendIntentEvents(t testing.TB, key string) []events.Envelope {
	t.Helper()
	in := testIntent(key)
	e, err := events.New(events.IntentRecorded, key, 1, in.Tool, in.EffectClass, 0,
		events.IntentData{Args: in.Args, Principal: in.Principal}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return []events.Envelope{e}
}
