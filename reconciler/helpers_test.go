package reconciler_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
)

// Tool names of the test registry, one per effect class, all served by one
// fake downstream under its own path.
const (
	charge  = "payments.charge"   // irreversible, reconcilable, signed
	reserve = "inventory.reserve" // compensable
	status  = "tickets.set"       // idempotent
	email   = "email.send"        // irreversible, no reconcile request
)

// toolsYAML is a tools file (contract §6) pointed at a fake tool. The charge's
// schema marks "pin" sensitive; "card_number" is sensitive by name.
const toolsYAML = `
tools:
  - name: payments.charge
    effect: irreversible
    invoke:    {method: POST, url: "BASE/effects/charges", timeout: 1s}
    reconcile: {method: GET,  url: "BASE/effects/charges?idempotency_key={{.Key}}", timeout: 1s}
    retry: {max_attempts: 3, base_delay: 10ms, max_delay: 50ms, deadline: 1m}
    signing_secret_env: CHARGE_SECRET
    args_schema:
      type: object
      required: [amount]
      properties:
        amount: {type: integer}
        currency: {type: string}
        card_number: {type: string}
        pin: {type: string, x-sensitive: true}
  - name: inventory.reserve
    effect: compensable
    invoke:     {method: POST, url: "BASE/effects/reservations", timeout: 1s}
    compensate: {method: POST, url: "BASE/effects/reservations/release", timeout: 1s}
    reconcile:  {method: GET,  url: "BASE/effects/reservations?idempotency_key={{.Key}}", timeout: 1s}
    retry: {max_attempts: 3, base_delay: 10ms, max_delay: 50ms, deadline: 1m}
    signing_secret_env: RESERVE_SECRET
  - name: tickets.set
    effect: idempotent
    invoke:    {method: POST, url: "BASE/effects/tickets", timeout: 1s}
    reconcile: {method: GET,  url: "BASE/effects/tickets?idempotency_key={{.Key}}", timeout: 1s}
    retry: {max_attempts: 3, base_delay: 10ms, max_delay: 50ms, deadline: 1m}
  - name: email.send
    effect: irreversible
    invoke: {method: POST, url: "BASE/effects/emails", timeout: 1s}
`

// env is what one test needs: a migrated database, a fake downstream, the
// real HTTP tools pointed at it, and the secrets they sign with.
type env struct {
	st      *store.Store
	fake    *testenv.FakeTool
	tools   *tool.Registry
	secrets map[string]string
}

func setup(t *testing.T, opts ...testenv.FakeOption) *env {
	t.Helper()
	pool := testenv.NewPool(t, storedb.New(t))
	fake := testenv.NewFakeTool(t, opts...)
	secrets := map[string]string{charge: newSecret(t), reserve: newSecret(t)}
	vars := map[string]string{"CHARGE_SECRET": secrets[charge], "RESERVE_SECRET": secrets[reserve]}
	reg, err := httptool.Parse([]byte(strings.ReplaceAll(toolsYAML, "BASE", fake.URL)), func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	return &env{st: store.New(pool), fake: fake, tools: reg, secrets: secrets}
}

func newSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// newKafka starts an embedded broker with effectline's topics.
func newKafka(t *testing.T) kafka.Config {
	t.Helper()
	b := testenv.NewBroker(t)
	cfg := kafka.Config{Brokers: b.Addrs, Partitions: 2, ClientID: "reconciler-test"}
	if err := kafka.EnsureTopics(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testLogger writes to the test log when the test runs verbose. Run returns
// before the test's cleanups finish, so nothing logs after the test.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(&testWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// ---- building operation states as the executor would ----

func appendEvents(t *testing.T, st *store.Store, base events.Operation, specs ...spec) events.Operation {
	t.Helper()
	now := time.Now().UTC()
	evs := make([]events.Envelope, len(specs))
	for i, s := range specs {
		ev, err := events.New(s.typ, base.Key, base.Seq+int64(i)+1, base.Tool, base.EffectClass, s.attempt, s.data, now)
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	op, err := st.Append(t.Context(), store.Append{Base: base, Events: evs, TopicPrefix: events.DefaultTopicPrefix})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

type spec struct {
	typ     events.Type
	attempt int
	data    any
}

// newIntent journals an intent, as the outbox would.
func (e *env) newIntent(t *testing.T, key, toolName, args string) events.Operation {
	t.Helper()
	tl, ok := e.tools.Get(toolName)
	class := events.Irreversible
	if ok {
		class = tl.Spec().Effect
	}
	ev, err := events.New(events.IntentRecorded, key, 1, toolName, class, 0,
		events.IntentData{Args: json.RawMessage(args), Principal: "billing-agent"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	op, err := e.st.Append(t.Context(), store.Append{Events: []events.Envelope{ev}, TopicPrefix: events.DefaultTopicPrefix,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// started claims the next attempt, leased until leaseUntil.
func started(t *testing.T, st *store.Store, op events.Operation, leaseUntil time.Time) events.Operation {
	t.Helper()
	return appendEvents(t, st, op, spec{events.AttemptStarted, op.Attempt + 1, &events.AttemptStartedData{
		DownstreamKey: events.DownstreamKeyFor(op.Key, op.Compensations), Worker: "worker-1", LeaseUntil: leaseUntil,
	}})
}

// unknownOutcome journals the outcome of a call that may have happened.
func unknownOutcome(t *testing.T, st *store.Store, op events.Operation, next events.Next, class string) events.Operation {
	t.Helper()
	d := &events.AttemptUnknownData{ErrorClass: class, Next: next}
	if next == events.NextRetry {
		at := time.Now().UTC()
		d.RetryAt = &at
	}
	return appendEvents(t, st, op, spec{events.AttemptUnknown, op.Attempt, d})
}

// invoke calls the real tool for the current attempt of op, as the
// executor's worker would.
func (e *env) invoke(t *testing.T, op events.Operation) tool.Result {
	t.Helper()
	tl, _ := e.tools.Get(op.Tool)
	return tl.Invoke(t.Context(), tool.Call{
		OperationKey: op.Key, DownstreamKey: op.DownstreamKey, Principal: op.Principal, Attempt: op.Attempt, Args: op.Args,
	})
}

// publish sends every journaled event of key to the outcomes topic, the way
// the relay does (same mapping, same headers).
func (e *env) publish(t *testing.T, kcfg kafka.Config, key string) {
	t.Helper()
	evs, err := e.st.Events(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var recs []kafka.Record
	for _, ev := range evs {
		for _, suffix := range events.TopicsFor(ev.Type) {
			recs = append(recs, kafka.EventRecord(traceparent.ContextWith(context.Background(), ev.Traceparent), kcfg.Topic(suffix), ev.Envelope, ev.Raw))
		}
	}
	if err := p.Send(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
}

// runReconciler runs a reconciler until the test ends and checks that Run
// returned cleanly. stop ends it early.
func runReconciler(t *testing.T, e *env, cfg reconciler.Config) (r *reconciler.Reconciler, stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	r, err := reconciler.New(e.st, e.tools, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return 30s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// waitFor polls the operation until cond holds or the deadline passes.
func waitFor(t *testing.T, st *store.Store, key string, what string, cond func(events.Operation) bool) events.Operation {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	var op events.Operation
	for time.Now().Before(deadline) {
		var err error
		op, err = st.Load(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if cond(op) {
			return op
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: operation %s never got there; it is %s/%s at seq %d", what, key, op.Status, op.Phase, op.Seq)
	return op
}

func statusIs(s events.Status) func(events.Operation) bool {
	return func(op events.Operation) bool { return op.Status == s }
}

// journal returns the event types of key in order, and the events.
func journal(t *testing.T, st *store.Store, key string) ([]events.Type, []store.StoredEvent) {
	t.Helper()
	evs, err := st.Events(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	types := make([]events.Type, len(evs))
	for i, e := range evs {
		types[i] = e.Type
	}
	return types, evs
}

func countType(types []events.Type, typ events.Type) int {
	n := 0
	for _, t := range types {
		if t == typ {
			n++
		}
	}
	return n
}

func lastOf[T any](t *testing.T, evs []store.StoredEvent, typ events.Type) *T {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type != typ {
			continue
		}
		d, err := evs[i].DecodeData()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := d.(*T)
		if !ok {
			t.Fatalf("%s data is %T", typ, d)
		}
		return v
	}
	t.Fatalf("no %s event", typ)
	return nil
}

// checkReplay asserts the head record equals a fold of the journal.
func checkReplay(t *testing.T, st *store.Store, key string) {
	t.Helper()
	head, err := st.Load(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := st.Replay(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	// The head record is stored as jsonb, which reorders object keys inside
	// raw JSON fields (the result): compare the JSON values, not the bytes.
	a, _ := json.Marshal(head)
	b, _ := json.Marshal(replayed)
	var va, vb any
	_ = json.Unmarshal(a, &va)
	_ = json.Unmarshal(b, &vb)
	if !reflect.DeepEqual(va, vb) {
		t.Fatalf("head record differs from the replay:\n head   %s\n replay %s", a, b)
	}
}

// ---- webhooks ----

// signed returns Standard Webhooks headers for body, signed at ts.
func signed(t *testing.T, secret, id string, ts time.Time, body []byte) http.Header {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return h
}

func callbackBody(typ, key, downstreamID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"type": typ, "idempotency_key": key, "downstream_id": downstreamID,
		"result": map[string]string{"id": downstreamID, "status": "done"},
	})
	return b
}

var webhookSeq struct {
	sync.Mutex
	n int
}

func newWebhookID() string {
	webhookSeq.Lock()
	defer webhookSeq.Unlock()
	webhookSeq.n++
	return fmt.Sprintf("msg_test_%d_%d", time.Now().UnixNano(), webhookSeq.n)
}

func isErr(err, target error) bool { return errors.Is(err, target) }

// ---- telemetry ----

// observed records the spans and metrics a component produces.
type observed struct {
	spans   *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	metrics *sdkmetric.ManualReader
	mp      *sdkmetric.MeterProvider
}

func newObserved(t *testing.T) *observed {
	o := &observed{spans: tracetest.NewSpanRecorder(), metrics: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.metrics))
	t.Cleanup(func() {
		_ = o.tp.Shutdown(context.Background())
		_ = o.mp.Shutdown(context.Background())
	})
	return o
}

// span returns the first ended span named name.
func (o *observed) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no %q span", name)
	return nil
}

// counter sums the counter name's points whose attributes include attrs.
func (o *observed) counter(t *testing.T, name string, attrs map[string]string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := o.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is %T", name, m.Data)
			}
		points:
			for _, dp := range sum.DataPoints {
				for k, v := range attrs {
					if got, ok := dp.Attributes.Value(attribute.Key(k)); !ok || got.AsString() != v {
						continue points
					}
				}
				n += dp.Value
			}
		}
	}
	return n
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}
