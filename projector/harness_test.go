package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
)

// waitTimeout bounds every poll in these tests. Joining a consumer group is
// the slow part (a few seconds against kfake); a projection that has not
// converged long after that is a failure, not a slow machine.
const waitTimeout = 60 * time.Second

// harness is a fresh database with the schema and a fresh broker with the
// topics, one per test.
type harness struct {
	t      testing.TB
	pool   *pgxpool.Pool
	store  *store.Store
	broker *testenv.Broker
	kafka  kafka.Config
	prod   *kafka.Producer
	log    *slog.Logger
}

func setup(t testing.TB) *harness {
	t.Helper()
	return setupPartitions(t, 4)
}

// setupPartitions is setup with topics of the given partition count.
func setupPartitions(t testing.TB, partitions int32) *harness {
	t.Helper()
	return setupOn(t, storedb.New(t), partitions)
}

// setupOn is setupPartitions on the database at dbURL.
func setupOn(t testing.TB, dbURL string, partitions int32) *harness {
	t.Helper()
	h := setupDBOn(t, dbURL)
	h.broker = testenv.NewBroker(t)
	h.kafka = kafka.Config{Brokers: h.broker.Addrs, Partitions: partitions, ConnectTimeout: 20 * time.Second}
	if err := kafka.EnsureTopics(t.Context(), h.kafka); err != nil {
		t.Fatalf("provisioning topics: %v", err)
	}
	prod, err := kafka.NewProducer(h.kafka)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	h.prod = prod
	t.Cleanup(h.closeProducer)
	return h
}

// closeProducer closes the test's producer, once.
func (h *harness) closeProducer() {
	if h.prod != nil {
		_ = h.prod.Close()
		h.prod = nil
	}
}

// setupDB is setup without Kafka, for the read side.
func setupDB(t testing.TB) *harness {
	t.Helper()
	return setupDBOn(t, storedb.New(t))
}

func setupDBOn(t testing.TB, dbURL string) *harness {
	t.Helper()
	pool := testenv.NewPool(t, dbURL)
	if _, err := store.Migrate(t.Context(), pool); err != nil {
		t.Fatalf("migrating: %v", err)
	}
	return &harness{t: t, pool: pool, store: store.New(pool), log: testLogger(t)}
}

// testLogger writes warnings and errors to the test's log, and nothing once
// the test has finished (Kafka client goroutines may still log then).
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

var _ io.Writer = (*testWriter)(nil)

// running is a projector started by a test.
type running struct {
	projector *projector.Projector
	metrics   *sdkmetric.ManualReader
	stop      func()
}

// start runs a projector in consumer group group until stop or the end of
// the test, and fails the test if Run does not return nil on stop.
func (h *harness) start(group string, tweak ...func(*projector.Config)) *running {
	h.t.Helper()
	reader := sdkmetric.NewManualReader()
	cfg := projector.Config{
		Kafka: h.kafka,
		Store: h.store,
		Group: group,
		Base:  service.Base{Logger: h.log, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	p, err := projector.New(cfg)
	if err != nil {
		h.t.Fatalf("projector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("projector.Run: %v", err)
				}
			case <-time.After(waitTimeout):
				h.t.Errorf("projector.Run did not return %s after its context ended", waitTimeout)
			}
		})
	}
	h.t.Cleanup(stop)
	return &running{projector: p, metrics: reader, stop: stop}
}

// metric returns the data the projector recorded for metric name, nil
// if none.
func (r *running) metric(t testing.TB, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collecting metrics: %v", err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	return nil
}

// count returns the projector's event counter for one outcome.
func (r *running) count(t testing.TB, outcome string) int64 {
	t.Helper()
	sum, _ := r.metric(t, projector.MetricEvents).(metricdata.Sum[int64])
	for _, dp := range sum.DataPoints {
		if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == outcome {
			return dp.Value
		}
	}
	return 0
}

// countOnce returns outcome's count once it reached want, or what it is
// when waitTimeout ran out. The batcher counts a batch's outcomes after
// its rows committed, so a test that has just seen the rows (waitSeqs) can
// read the counter a moment too early; a count past want returns at once.
func (r *running) countOnce(t testing.TB, outcome string, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := r.count(t, outcome)
		if got >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rejected returns how many messages the consumer rejected as malformed.
func (r *running) rejected(t testing.TB) int64 {
	t.Helper()
	sum, _ := r.metric(t, kafka.MetricRejectedMessages).(metricdata.Sum[int64])
	var n int64
	for _, dp := range sum.DataPoints {
		n += dp.Value
	}
	return n
}

// rewinds returns how many times the projector read its partitions again.
func (r *running) rewinds(t testing.TB) int64 {
	t.Helper()
	sum, _ := r.metric(t, projector.MetricRewinds).(metricdata.Sum[int64])
	var n int64
	for _, dp := range sum.DataPoints {
		n += dp.Value
	}
	return n
}

// lagSamples returns how many lag observations the projector recorded.
func (r *running) lagSamples(t testing.TB) uint64 {
	t.Helper()
	h, _ := r.metric(t, projector.MetricLag).(metricdata.Histogram[float64])
	var n uint64
	for _, dp := range h.DataPoints {
		n += dp.Count
	}
	return n
}

// batches returns how many projection transactions ran and how many events
// they held in all.
func (r *running) batches(t testing.TB) (count uint64, events int64) {
	t.Helper()
	h, _ := r.metric(t, projector.MetricBatch).(metricdata.Histogram[int64])
	for _, dp := range h.DataPoints {
		count += dp.Count
		events += dp.Sum
	}
	return count, events
}

type flow struct {
	t     testing.TB
	key   string
	tool  string
	class events.EffectClass
	at    time.Time
	evs   []events.Envelope
}

func newFlow(t testing.TB, key, tool string, class events.EffectClass, at time.Time) *flow {
	return &flow{t: t, key: key, tool: tool, class: class, at: at}
}

func (f *flow) add(typ events.Type, attempt int, data any) *flow {
	f.t.Helper()
	if len(f.evs) > 0 {
		f.at = f.at.Add(1500 * time.Millisecond)
	}
	e, err := events.New(typ, f.key, int64(len(f.evs)+1), f.tool, f.class, attempt, data, f.at)
	if err != nil {
		f.t.Fatalf("building %s: %v", typ, err)
	}
	f.evs = append(f.evs, e)
	return f
}

func (f *flow) later(d time.Duration) *time.Time {
	t := f.at.Add(d)
	return &t
}

func (f *flow) intent() *flow {
	return f.add(events.IntentRecorded, 0, events.IntentData{
		Args:      json.RawMessage(fmt.Sprintf(`{"amount": 100, "ref": %q}`, f.key)),
		Principal: "billing-agent",
	})
}

func (f *flow) started(attempt int) *flow {
	return f.add(events.AttemptStarted, attempt, events.AttemptStartedData{
		DownstreamKey: f.key, Worker: "worker-1", LeaseUntil: f.at.Add(30 * time.Second),
	})
}

func (f *flow) succeeded(attempt int) *flow {
	return f.add(events.AttemptSucceeded, attempt, events.AttemptSucceededData{
		StatusCode:   201,
		Result:       json.RawMessage(`{"id": "ch_` + f.key + `", "status": "ok", "nested": {"b": 1, "a": [1.5, "x<y"]}}`),
		DownstreamID: "ch_" + f.key,
		UndoRef:      "undo/" + f.key,
	})
}

// scenario returns the events of one of five realistic operations, chosen
// by kind: every status and both phases occur among them.
func scenario(t testing.TB, kind int, key string, at time.Time) []events.Envelope {
	t.Helper()
	switch kind % 5 {
	case 0: // idempotent: a 503, then success on the second attempt.
		f := newFlow(t, key, "tickets.upsert", events.Idempotent, at).intent().started(1)
		f.add(events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Retryable, ErrorClass: "http_503", StatusCode: 503, RetryAt: f.later(2 * time.Second)})
		return f.started(2).succeeded(2).evs
	case 1: // compensable: unknown, undone, retried under a new key.
		f := newFlow(t, key, "inventory.reserve", events.Compensable, at).intent().started(1)
		f.add(events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout", Next: events.NextCompensate})
		f.add(events.CompensationStarted, 1, events.CompensationStartedData{DownstreamKey: key, Worker: "worker-2", LeaseUntil: f.at.Add(time.Minute)})
		f.add(events.CompensationSucceeded, 1, events.CompensationSucceededData{StatusCode: 200, RetryAt: f.later(time.Second)})
		return f.started(2).succeeded(2).evs
	case 2: // irreversible: unknown, nothing found, escalated, a human records success.
		f := newFlow(t, key, "payments.charge", events.Irreversible, at).intent().started(1)
		f.add(events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "connection_reset", Next: events.NextReconcile})
		f.add(events.ReconciliationResolved, 0, events.ReconciliationResolvedData{Found: false, Source: "reconcile"})
		f.add(events.OperationEscalated, 0, events.EscalationData{Reason: "absent_irreversible", Request: json.RawMessage(`{"amount": 100}`), ProposedAction: events.ActionRetry})
		f.add(events.DecisionRecorded, 0, events.DecisionData{Action: events.ActionRecordSuccess, Approver: "alice", Note: "seen in the PSP dashboard"})
		return f.evs
	case 3: // final failure.
		f := newFlow(t, key, "emails.send", events.Irreversible, at).intent().started(1)
		f.add(events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422", StatusCode: 422})
		return f.evs
	default: // escalated and waiting for a decision.
		f := newFlow(t, key, "payments.charge", events.Irreversible, at).intent().started(1)
		f.add(events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "http_504", StatusCode: 504, Next: events.NextReconcile})
		f.add(events.OperationEscalated, 0, events.EscalationData{Reason: "cannot_reconcile", Request: json.RawMessage(`{"amount": 100}`), ProposedAction: events.ActionAbandon})
		return f.evs
	}
}

// journal appends evs to the event store one step (transaction) each, as
// the executor does, onto base; it returns the new head.
func (h *harness) journal(base events.Operation, evs ...events.Envelope) events.Operation {
	h.t.Helper()
	for _, e := range evs {
		op, err := h.store.Append(h.t.Context(), store.Append{Base: base, Events: []events.Envelope{e}})
		if err != nil {
			h.t.Fatalf("appending %s seq %d: %v", e.OperationKey, e.Seq, err)
		}
		base = op
	}
	return base
}

// stored returns the journaled events of key with the given seqs (all when
// none are given), in the order asked.
func (h *harness) stored(key string, seqs ...int64) []store.StoredEvent {
	h.t.Helper()
	all, err := h.store.Events(h.t.Context(), key, 0)
	if err != nil {
		h.t.Fatalf("loading events of %s: %v", key, err)
	}
	if len(seqs) == 0 {
		return all
	}
	out := make([]store.StoredEvent, 0, len(seqs))
	for _, s := range seqs {
		if s < 1 || int(s) > len(all) {
			h.t.Fatalf("%s has no seq %d", key, s)
		}
		out = append(out, all[s-1])
	}
	return out
}

// publish sends journaled events to the outcomes topic in the order given,
// as the relay would (exact journaled bytes, traceparent header).
func (h *harness) publish(evs ...store.StoredEvent) {
	h.t.Helper()
	recs := make([]kafka.Record, len(evs))
	for i, e := range evs {
		recs[i] = kafka.EventRecord(traceparent.ContextWith(context.Background(), e.Traceparent),
			h.kafka.Topic(events.TopicOutcomes), e.Envelope, e.Raw)
	}
	if err := h.prod.Send(context.Background(), recs); err != nil {
		h.t.Fatalf("publishing %d events: %v", len(recs), err)
	}
}

// produceRaw publishes arbitrary bytes under key, for malformed messages.
// It goes through the relay's producer, so the message lands in the same
// partition as the key's events (testenv.Broker.Produce partitions with
// franz-go's murmur2, sarama's hash partitioner with FNV-1a).
func (h *harness) produceRaw(key string, value []byte) {
	h.t.Helper()
	rec := kafka.Record{Topic: h.kafka.Topic(events.TopicOutcomes), Key: []byte(key), Value: value}
	if err := h.prod.Send(context.Background(), []kafka.Record{rec}); err != nil {
		h.t.Fatalf("publishing a raw message: %v", err)
	}
}

// waitSeqs polls until every key's row is at the given last_seq.
func (h *harness) waitSeqs(want map[string]int64) {
	h.t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	deadline := time.Now().Add(waitTimeout)
	var got map[string]int64
	for {
		got = h.seqs(keys)
		if mapsEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("projection did not converge in %s:\n got %v\nwant %v", waitTimeout, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) seqs(keys []string) map[string]int64 {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), `SELECT operation_key, last_seq FROM operation_state WHERE operation_key = ANY($1)`, keys)
	if err != nil {
		h.t.Fatalf("reading seqs: %v", err)
	}
	got := map[string]int64{}
	var (
		k string
		s int64
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &s}, func() error { got[k] = s; return nil })
	if err != nil {
		h.t.Fatalf("reading seqs: %v", err)
	}
	return got
}

// waitUntil polls cond until it holds.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// snapshot returns every row of operation_state as canonical JSON text
// (jsonb prints keys in one order), without projected_at, which records
// when a row was written rather than what it holds.
func (h *harness) snapshot() map[string]string {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), `SELECT operation_key, (to_jsonb(s) - 'projected_at')::text FROM operation_state s`)
	if err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	out := map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	return out
}

// projectedAt returns when each row was last written.
func (h *harness) projectedAt() map[string]time.Time {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), `SELECT operation_key, projected_at FROM operation_state`)
	if err != nil {
		h.t.Fatalf("projected_at: %v", err)
	}
	out := map[string]time.Time{}
	var (
		k  string
		at time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&k, &at}, func() error { out[k] = at; return nil }); err != nil {
		h.t.Fatalf("projected_at: %v", err)
	}
	return out
}

func assertSameTable(t testing.TB, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d rows, want %d", what, len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: row %s missing", what, k)
		case g != w:
			t.Errorf("%s: row %s differs:\n got %s\nwant %s", what, k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected row %s", what, k)
		}
	}
}

// assertMatchesReplay checks that the row of key is the fold of the
// operation's journaled events: the fold the projector loads from the row
// (its columns and its record) equals Store.Replay as a JSON value, bar the
// times the columns keep at microseconds, and the typed columns Reader
// returns agree with it.
func (h *harness) assertMatchesReplay(key string) {
	h.t.Helper()
	ctx := h.t.Context()
	want, err := h.store.Replay(ctx, key)
	if err != nil {
		h.t.Fatalf("replaying %s: %v", key, err)
	}
	// The read model holds no args (they reach it redacted, see rowsOf).
	want.Args = nil
	loaded, err := projector.LoadFolds(ctx, h.pool, []string{key})
	if err != nil {
		h.t.Fatalf("loading the fold of %s: %v", key, err)
	}
	got, ok := loaded[key]
	if !ok {
		h.t.Fatalf("no row of %s", key)
	}
	assertSameFold(h.t, got, want)
	st, err := projector.NewReader(h.pool).Get(ctx, key)
	if err != nil {
		h.t.Fatalf("Get(%s): %v", key, err)
	}
	assertStateOf(h.t, st, want)
}

// assertSameFold checks that got, loaded from operation_state, is want as
// JSON values: the result compared as a value (jsonb reorders its keys),
// created_at, updated_at and lease_until at the microseconds of their
// columns (a row written before the record was cut down has them at
// nanoseconds).
func assertSameFold(t testing.TB, got, want events.Operation) {
	t.Helper()
	micro := func(p *time.Time) *time.Time {
		if p == nil {
			return nil
		}
		m := p.UTC().Truncate(time.Microsecond)
		return &m
	}
	value := func(op events.Operation) any {
		op.CreatedAt, op.UpdatedAt, op.LeaseUntil = op.CreatedAt.Truncate(time.Microsecond), op.UpdatedAt.Truncate(time.Microsecond), micro(op.LeaseUntil)
		b, err := json.Marshal(op)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if g, w := value(got), value(want); !reflect.DeepEqual(g, w) {
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		t.Errorf("row %s is not the fold of its events:\n got %s\nwant %s", want.Key, gb, wb)
	}
}

// assertStateOf checks the typed columns of a row against a record.
func assertStateOf(t testing.TB, st events.Operation, op events.Operation) {
	t.Helper()
	type view struct {
		Key, Tool, Class, Hash, Principal, Status, Phase string
		Attempt, Compensations, Evidence                 int
		Downstream, Undo, ErrClass                       string
		Seq                                              int64
		Created, Updated                                 time.Time
		Lease                                            string
		Escalated                                        bool
	}
	lease := func(p *time.Time) string {
		if p == nil {
			return "none"
		}
		return p.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
	}
	got := view{st.Key, st.Tool, string(st.EffectClass), st.PayloadHash, st.Principal, string(st.Status), string(st.Phase),
		st.Attempt, st.Compensations, st.Evidence, st.DownstreamID, st.UndoRef, st.LastErrorClass, st.Seq,
		st.CreatedAt, st.UpdatedAt, lease(st.LeaseUntil), st.Escalation != nil}
	want := view{op.Key, op.Tool, string(op.EffectClass), op.PayloadHash, op.Principal, string(op.Status), string(op.Phase),
		op.Attempt, op.Compensations, op.Evidence, op.DownstreamID, op.UndoRef, op.LastErrorClass, op.Seq,
		op.CreatedAt.Truncate(time.Microsecond), op.UpdatedAt.Truncate(time.Microsecond), lease(op.LeaseUntil), op.Escalation != nil}
	if got != want {
		t.Errorf("state of %s:\n got %+v\nwant %+v", op.Key, got, want)
	}
	if len(op.Result) > 0 {
		var a, b any
		if err := json.Unmarshal(st.Result, &a); err != nil {
			t.Fatalf("result of %s: %v", op.Key, err)
		}
		_ = json.Unmarshal(op.Result, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("result of %s: got %s want %s", op.Key, st.Result, op.Result)
		}
	} else if st.Result != nil {
		t.Errorf("result of %s: got %s, want none", op.Key, st.Result)
	}
}
