package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
)

// env is one test's world: a fresh database, an embedded broker, a fake
// downstream and the tools registry pointing at it.
type env struct {
	t      *testing.T
	store  *store.Store
	broker *testenv.Broker
	fake   *testenv.FakeTool
	tools  *tool.Registry
	kafka  kafka.Config
	// skew moves the executors' clock forward, so tests need not wait out
	// backoffs and grace periods.
	skew *atomic.Int64
}

const toolsYAML = `
tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "{{.URL}}/effects/cache", timeout: 500ms}
    reconcile: {method: GET, url: "{{.URL}}/effects?idempotency_key={{"{{.Key}}"}}"}
    retry: {max_attempts: 4, base_delay: 10ms, max_delay: 1h, deadline: 2h}
  - name: inventory.reserve
    effect: compensable
    invoke: {method: POST, url: "{{.URL}}/effects/reservations", timeout: 500ms}
    compensate: {method: POST, url: "{{.URL}}/effects/release"}
    reconcile: {method: GET, url: "{{.URL}}/effects?idempotency_key={{"{{.Key}}"}}"}
    retry: {max_attempts: 4, base_delay: 10ms, max_delay: 100ms, deadline: 20s}
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "{{.URL}}/effects/charges", timeout: 500ms}
    reconcile: {method: GET, url: "{{.URL}}/effects?idempotency_key={{"{{.Key}}"}}"}
    retry: {max_attempts: 4, base_delay: 10ms, max_delay: 2s, deadline: 20s}
    args_schema:
      type: object
      required: [amount]
      properties:
        amount: {type: integer, minimum: 1}
    allowed_principals: [billing-agent]
  - name: payouts.send
    effect: irreversible
    requires_approval: true
    invoke: {method: POST, url: "{{.URL}}/effects/payouts", timeout: 500ms}
`

func setup(t *testing.T, opts ...testenv.FakeOption) *env {
	t.Helper()
	pool := testenv.NewPool(t, storedb.New(t))
	ctx := context.Background()
	broker := testenv.NewBroker(t)
	kc := kafka.Config{Brokers: broker.Addrs, Partitions: 3}
	if err := kafka.EnsureTopics(ctx, kc); err != nil {
		t.Fatal(err)
	}
	fake := testenv.NewFakeTool(t, opts...)
	yaml := strings.ReplaceAll(toolsYAML, "{{.URL}}", fake.URL)
	yaml = strings.ReplaceAll(yaml, `{{"{{.Key}}"}}`, "{{.Key}}")
	reg, err := httptool.Parse([]byte(yaml), os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, store: store.New(pool), broker: broker, fake: fake, tools: reg, kafka: kc, skew: new(atomic.Int64)}
}

// start runs an executor until the test ends.
func (e *env) start(mod ...func(*executor.Config)) {
	e.t.Helper()
	cfg := executor.Config{
		Kafka: e.kafka, Lease: 5 * time.Second, PollInterval: 50 * time.Millisecond,
		ShutdownGrace: time.Second, Base: service.Base{Logger: testLogger(e.t), Now: func() time.Time { return time.Now().Add(time.Duration(e.skew.Load())) }},
	}
	for _, m := range mod {
		m(&cfg)
	}
	x, err := executor.New(e.store, e.tools, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("executor: %v", err)
		}
	})
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(ioDiscard{}, nil))
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

// produce publishes an intent straight to the intents topic, as a non-Go
// producer would.
func (e *env) produce(key, toolName string, class events.EffectClass, args string) {
	e.t.Helper()
	ev, err := events.New(events.IntentRecorded, key, 1, toolName, class, 0,
		events.IntentData{Args: json.RawMessage(args), Principal: "billing-agent"}, time.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	raw, err := events.Encode(ev)
	if err != nil {
		e.t.Fatal(err)
	}
	msg := kafka.ProducerMessage(kafka.EventRecord(context.Background(), e.kafka.Topic(events.TopicIntents), ev, raw))
	headers := map[string]string{}
	for _, h := range msg.Headers {
		headers[string(h.Key)] = string(h.Value)
	}
	e.broker.Produce(e.t, msg.Topic, []byte(key), raw, headers)
}

// waitFor polls the operation until cond holds.
func (e *env) waitFor(key string, what string, cond func(events.Operation) bool) events.Operation {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var op events.Operation
	var err error
	for time.Now().Before(deadline) {
		op, err = e.store.Load(context.Background(), key)
		if err == nil && cond(op) {
			return op
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("%s: operation %s never became %s; last: %+v (err %v)", e.t.Name(), key, what, op, err)
	return op
}

func (e *env) waitStatus(key string, s events.Status) events.Operation {
	e.t.Helper()
	return e.waitFor(key, string(s), func(op events.Operation) bool { return op.Status == s })
}

func (e *env) history(key string) []events.Type {
	e.t.Helper()
	evs, err := e.store.Events(context.Background(), key, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	ts := make([]events.Type, len(evs))
	for i, ev := range evs {
		ts[i] = ev.Type
	}
	return ts
}

func invokeKeys(f *testenv.FakeTool) []string {
	var keys []string
	for _, r := range f.RequestLog() {
		if r.Route == testenv.RouteInvoke {
			keys = append(keys, r.IdempotencyKey)
		}
	}
	return keys
}

var classes = []struct {
	tool  string
	class events.EffectClass
	args  string
}{
	{"cache.set", events.Idempotent, `{"k":"v"}`},
	{"inventory.reserve", events.Compensable, `{"sku":"A1","qty":1}`},
	{"payments.charge", events.Irreversible, `{"amount":100}`},
}

// TestOutcomeTable runs every cell of contract §2's table for each effect
// class against a fake downstream over real HTTP, asserting the exact
// downstream requests.
func TestOutcomeTable(t *testing.T) {
	t.Parallel()
	type cell struct {
		name    string
		faults  []testenv.Fault
		status  func(events.EffectClass) events.Status
		invokes func(events.EffectClass) int
		effects func(events.EffectClass) int
		check   func(t *testing.T, e *env, key string, class events.EffectClass)
	}
	always := func(s events.Status) func(events.EffectClass) events.Status {
		return func(events.EffectClass) events.Status { return s }
	}
	n := func(i int) func(events.EffectClass) int { return func(events.EffectClass) int { return i } }
	cells := []cell{
		{name: "succeeded", status: always(events.StatusCompleted), invokes: n(1), effects: n(1)},
		{name: "failed final 400", faults: []testenv.Fault{testenv.FaultFailBeforeEffect(400, "")},
			status: always(events.StatusFailed), invokes: n(1), effects: n(0)},
		{name: "failed final 403", faults: []testenv.Fault{testenv.FaultFailBeforeEffect(403, "")},
			status: always(events.StatusFailed), invokes: n(1), effects: n(0)},
		{name: "failed retryable 503", faults: []testenv.Fault{testenv.FaultFailBeforeEffect(503, "")},
			status: always(events.StatusCompleted), invokes: n(2), effects: n(1)},
		{name: "unknown: lost response", faults: []testenv.Fault{testenv.FaultLoseResponse},
			status: func(c events.EffectClass) events.Status {
				if c == events.Irreversible {
					return events.StatusNeedsReconciliation // never retried: the reconciler asks
				}
				return events.StatusCompleted
			},
			invokes: func(c events.EffectClass) int {
				if c == events.Irreversible {
					return 1
				}
				return 2
			},
			effects: n(1),
			check: func(t *testing.T, e *env, key string, c events.EffectClass) {
				keys := invokeKeys(e.fake)
				switch c {
				case events.Idempotent:
					if keys[0] != key || keys[1] != key {
						t.Fatalf("idempotent retry keys %v, want the same key twice", keys)
					}
				case events.Compensable:
					if keys[0] != key || keys[1] != key+"~c1" {
						t.Fatalf("compensable retry keys %v, want %s then %s~c1", keys, key, key)
					}
					if e.fake.Releases() != 1 {
						t.Fatalf("releases = %d, want the undo before the retry", e.fake.Releases())
					}
					log := e.fake.RequestLog()
					var undo, retry time.Time
					for _, r := range log {
						if r.Route == testenv.RouteCompensate {
							undo = r.Time
						}
						if r.Route == testenv.RouteInvoke && r.IdempotencyKey == key+"~c1" {
							retry = r.Time
						}
					}
					if !undo.Before(retry) {
						t.Fatalf("the retry went out before the undo")
					}
					if e.fake.Applied() != 2 || e.fake.Effects() != 1 {
						t.Fatalf("applied %d live %d, want 2 applied and 1 standing", e.fake.Applied(), e.fake.Effects())
					}
				}
			}},
		{name: "unknown: 502 after the effect", faults: []testenv.Fault{testenv.FaultFailAfterEffect(502)},
			status: func(c events.EffectClass) events.Status {
				if c == events.Irreversible {
					return events.StatusNeedsReconciliation
				}
				return events.StatusCompleted
			},
			invokes: func(c events.EffectClass) int {
				if c == events.Irreversible {
					return 1
				}
				return 2
			},
			effects: n(1)},
		{name: "unknown: caps exhausted", faults: []testenv.Fault{
			testenv.FaultFailBeforeEffect(500, ""), testenv.FaultFailBeforeEffect(500, ""),
			testenv.FaultFailBeforeEffect(500, ""), testenv.FaultFailBeforeEffect(500, ""),
			testenv.FaultFailBeforeEffect(500, "")},
			status: always(events.StatusNeedsReconciliation),
			invokes: func(c events.EffectClass) int {
				if c == events.Irreversible {
					return 1
				}
				return 4 // max_attempts
			},
			effects: n(0)},
		{name: "failed retryable caps exhausted", faults: []testenv.Fault{
			testenv.FaultFailBeforeEffect(503, ""), testenv.FaultFailBeforeEffect(503, ""),
			testenv.FaultFailBeforeEffect(503, ""), testenv.FaultFailBeforeEffect(503, ""),
			testenv.FaultFailBeforeEffect(503, "")},
			status: always(events.StatusFailed), invokes: n(4), effects: n(0)},
	}
	for _, c := range cells {
		for _, cl := range classes {
			t.Run(c.name+"/"+string(cl.class), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				e.fake.Script(testenv.RouteInvoke, c.faults...)
				e.start()
				key := "op-" + strings.ReplaceAll(c.name, " ", "-")
				e.produce(key, cl.tool, cl.class, cl.args)
				want := c.status(cl.class)
				op := e.waitStatus(key, want)
				// Let anything that should not happen have the chance to.
				time.Sleep(200 * time.Millisecond)
				op2, _ := e.store.Load(context.Background(), key)
				if op2.Status != want || op2.Seq != op.Seq {
					t.Fatalf("operation moved on after %s: %+v", want, op2)
				}
				if got := e.fake.Requests(testenv.RouteInvoke); got != c.invokes(cl.class) {
					t.Fatalf("invoke requests = %d, want %d (history %v)", got, c.invokes(cl.class), e.history(key))
				}
				if got := e.fake.Effects(); got != c.effects(cl.class) {
					t.Fatalf("standing effects = %d, want %d", got, c.effects(cl.class))
				}
				if op.Attempt != c.invokes(cl.class) {
					t.Fatalf("attempts journaled = %d, want %d", op.Attempt, c.invokes(cl.class))
				}
				if c.check != nil {
					c.check(t, e, key, cl.class)
				}
			})
		}
	}
}

// TestRetryAfterIsHonored: a 429 with Retry-After: 1 is retried no sooner
// than one second later.
func TestRetryAfterIsHonored(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.fake.Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(429, "1"))
	e.start()
	e.produce("ra", "payments.charge", events.Irreversible, `{"amount":5}`)
	e.waitStatus("ra", events.StatusCompleted)
	log := e.fake.RequestLog()
	if len(log) != 2 {
		t.Fatalf("%d requests, want 2", len(log))
	}
	if gap := log[1].Time.Sub(log[0].Time); gap < time.Second {
		t.Fatalf("retried after %v, want at least the 1s Retry-After", gap)
	}
	if e.fake.Effects() != 1 {
		t.Fatalf("effects = %d", e.fake.Effects())
	}
}

// TestDuplicateDeliveries: the same intent delivered five times makes one
// effect, and receivers that ignore idempotency keys are protected too.
func TestDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.WithHonorKeys(false))
	e.start()
	for range 5 {
		e.produce("dup", "payments.charge", events.Irreversible, `{"amount":7}`)
	}
	e.waitStatus("dup", events.StatusCompleted)
	time.Sleep(300 * time.Millisecond)
	if got := e.fake.Applied(); got != 1 {
		t.Fatalf("effects applied = %d, want 1", got)
	}
	if got := len(e.history("dup")); got != 3 {
		t.Fatalf("history %v, want intent, started, succeeded", e.history("dup"))
	}
}

// TestRacingExecutors: executors in one group and in separate groups (so
// each receives every intent) race on the same operations; every operation
// gets exactly one attempt and one effect.
func TestRacingExecutors(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.WithHonorKeys(false))
	e.start()
	e.start()
	e.start(func(c *executor.Config) { c.Group = "other-group" })
	const n = 60
	for i := range n {
		e.produce(fmt.Sprintf("race-%d", i), "payments.charge", events.Irreversible, `{"amount":1}`)
	}
	for i := range n {
		op := e.waitStatus(fmt.Sprintf("race-%d", i), events.StatusCompleted)
		if op.Attempt != 1 {
			// Say why: a race cannot start two attempts at once (the
			// store's claim), so a second one followed a first that ended.
			t.Fatalf("%s: %d attempts; history %v, last error class %q, effects for its key %d",
				op.Key, op.Attempt, e.history(op.Key), op.LastErrorClass, e.fake.EffectsForKey(op.Key))
		}
	}
	time.Sleep(300 * time.Millisecond)
	if got := e.fake.Applied(); got != n {
		t.Fatalf("effects applied = %d, want %d", got, n)
	}
}

// TestRetryDoesNotBlockThePartition: an operation waiting for its retry
// (Retry-After: 50 minutes) does not delay 100 others on its partition. The
// wait is long so that a loaded machine, however slow with the 100, cannot
// reach it on the real clock (a 30 s Retry-After once did under CI load).
func TestRetryDoesNotBlockThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.kafka.Partitions = 1 // one partition: every operation shares it
	e.fake.Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(429, "3000"))
	e.start()
	e.produce("slow", "cache.set", events.Idempotent, `{"k":"slow"}`)
	e.waitFor("slow", "waiting for its retry", func(op events.Operation) bool {
		return op.Status == events.StatusPending && op.Attempt == 1
	})
	for i := range 100 {
		e.produce(fmt.Sprintf("fast-%d", i), "cache.set", events.Idempotent, fmt.Sprintf(`{"k":"%d"}`, i))
	}
	for i := range 100 {
		e.waitStatus(fmt.Sprintf("fast-%d", i), events.StatusCompleted)
	}
	slow, _ := e.store.Load(context.Background(), "slow")
	if slow.Status != events.StatusPending || slow.DueAt == nil || slow.DueAt.Before(time.Now()) {
		t.Fatalf("the slow operation is %s (due %v) before its Retry-After passed", slow.Status, slow.DueAt)
	}
	// Move the clock past the Retry-After rather than wait it out.
	e.skew.Store(int64(3001 * time.Second))
	e.waitStatus("slow", events.StatusCompleted)
}

// TestPayloadConflictIsRejected: a second intent under the same key with
// other args is journaled as rejected and never executed.
func TestPayloadConflictIsRejected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start()
	e.produce("conf", "payments.charge", events.Irreversible, `{"amount":1}`)
	e.waitStatus("conf", events.StatusCompleted)
	e.produce("conf", "payments.charge", events.Irreversible, `{"amount":999}`)
	e.waitFor("conf", "with the rejection journaled", func(op events.Operation) bool { return op.Evidence == 1 })
	if got := e.fake.Applied(); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	h := e.history("conf")
	if h[len(h)-1] != events.IntentRejected {
		t.Fatalf("history %v, want intent.rejected last", h)
	}
}

// TestProducerChosenEventIDs: the contract asks producers for a non-empty
// event id, not a UUID, and cannot stop one from reusing an id. Neither may
// keep an intent from running, nor stall the partition behind it.
func TestProducerChosenEventIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start()
	produce := func(key, id string) {
		ev, err := events.New(events.IntentRecorded, key, 1, "payments.charge", events.Irreversible, 0,
			events.IntentData{Args: json.RawMessage(`{"amount":3}`), Principal: "billing-agent"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ev.EventID = id
		raw, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		e.broker.Produce(t, e.kafka.Topic(events.TopicIntents), []byte(key), raw, nil)
	}
	produce("id-a", "order-7/charge")
	produce("id-b", "order-7/charge") // the same id on another operation
	produce("id-c", events.NewID())
	for _, key := range []string{"id-a", "id-b", "id-c"} {
		e.waitStatus(key, events.StatusCompleted)
	}
	if got := e.fake.Applied(); got != 3 {
		t.Fatalf("effects = %d, want 3", got)
	}
}

// TestExecutionTimeChecks: intents produced straight to Kafka are checked
// again at execution time; each rejection is final and journaled. (One
// naming an unknown tool never becomes an operation: it is a dead letter,
// TestPoisonMessagesAreDeadLettered.)
func TestExecutionTimeChecks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start()
	cases := []struct{ key, tool, args, class string }{
		{"bad-args", "payments.charge", `{"amount":0}`, "invalid_args"},
		{"wrong-class", "payments.charge", `{"amount":1}`, "effect_class_mismatch"},
	}
	for _, c := range cases {
		class := events.Irreversible
		if c.key == "wrong-class" {
			class = events.Idempotent
		}
		e.produce(c.key, c.tool, class, c.args)
	}
	for _, c := range cases {
		op := e.waitStatus(c.key, events.StatusFailed)
		if op.LastErrorClass != c.class {
			t.Fatalf("%s failed with %q, want %q", c.key, op.LastErrorClass, c.class)
		}
	}
	if e.fake.Requests(testenv.RouteInvoke) != 0 {
		t.Fatal("a rejected intent reached the downstream")
	}
}

func TestUnauthorizedPrincipalIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start()
	ev, _ := events.New(events.IntentRecorded, "forbidden", 1, "payments.charge", events.Irreversible, 0,
		events.IntentData{Args: json.RawMessage(`{"amount":1}`), Principal: "marketing-agent"}, time.Now())
	if _, err := e.store.Append(context.Background(), store.Append{Events: []events.Envelope{ev}, TopicPrefix: "effectline."}); err != nil {
		t.Fatal(err)
	}
	// No message: the poller picks the intent up after the pickup grace.
	e.skew.Store(int64(events.IntentPickupGrace + time.Second))
	op := e.waitStatus("forbidden", events.StatusFailed)
	if op.LastErrorClass != "forbidden" {
		t.Fatalf("failed with %q", op.LastErrorClass)
	}
}

// TestApprovalGate: a tool that requires approval waits for a decision
// before its first attempt.
func TestApprovalGate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start()
	e.produce("payout", "payouts.send", events.Irreversible, `{"to":"acct"}`)
	op := e.waitStatus("payout", events.StatusEscalated)
	if op.Escalation == nil || op.Escalation.Reason != "approval_required" {
		t.Fatalf("escalation = %+v", op.Escalation)
	}
	now := time.Now()
	dec, _ := events.New(events.DecisionRecorded, "payout", op.Seq+1, op.Tool, op.EffectClass, 0,
		events.DecisionData{Action: events.ActionRetry, Approver: "alice", RetryAt: &now}, now)
	if _, err := e.store.Append(context.Background(), store.Append{Base: op, Events: []events.Envelope{dec}}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("payout", events.StatusCompleted)
	if e.fake.Applied() != 1 {
		t.Fatalf("effects = %d", e.fake.Applied())
	}
}

// TestGoToolSemantics: a tool written in Go signals with the same outcomes.
func TestGoToolSemantics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	calls := 0
	gt := tool.NewGoTool(tool.Spec{Name: "go.mail", Effect: events.Irreversible},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return nil, tool.Unknown(errors.New("smtp connection dropped after DATA"))
		})
	if err := gt.Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.tools.Register(gt); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.produce("mail", "go.mail", events.Irreversible, `{"to":"a@example.com"}`)
	op := e.waitStatus("mail", events.StatusNeedsReconciliation)
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 || op.Attempt != 1 {
		t.Fatalf("calls = %d attempts = %d, want 1: irreversible is never retried", calls, op.Attempt)
	}
}

// TestLateOutcomeIsEvidence: a worker whose lease was taken over still
// journals its outcome; it cannot overwrite the newer state, and a success
// of the current attempt settles an unresolved operation.
func TestLateOutcomeIsEvidence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.fake.Script(testenv.RouteInvoke, testenv.FaultStall(400*time.Millisecond))
	e.start()
	e.produce("late", "payments.charge", events.Irreversible, `{"amount":3}`)
	op := e.waitStatus("late", events.StatusInProgress)
	// The sweep declares the attempt Unknown while the call is still running.
	unk, _ := events.New(events.AttemptUnknown, "late", op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
		events.AttemptUnknownData{ErrorClass: "lease_expired", Next: events.NextReconcile}, time.Now())
	if _, err := e.store.Append(context.Background(), store.Append{Base: op, Events: []events.Envelope{unk}}); err != nil {
		t.Fatal(err)
	}
	done := e.waitStatus("late", events.StatusCompleted)
	evs, _ := e.store.Events(context.Background(), "late", 0)
	last := evs[len(evs)-1]
	d, _ := last.DecodeData()
	if s, ok := d.(*events.AttemptSucceededData); !ok || !s.Late {
		t.Fatalf("last event %s %+v, want a late attempt.succeeded", last.Type, d)
	}
	if done.Attempt != 1 || e.fake.Applied() != 1 {
		t.Fatalf("attempts %d effects %d", done.Attempt, e.fake.Applied())
	}
}

var _ = http.StatusOK

// TestHeartbeatKeepsALongCallsLease: a call longer than the lease renews it,
// so the reconciler's sweep never sees it expire, and the call's outcome is
// journaled as the attempt's own (not late).
func TestHeartbeatKeepsALongCallsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	release := make(chan struct{})
	gt := tool.NewGoTool(tool.Spec{Name: "slow.export", Effect: events.Irreversible, Timeout: 10 * time.Second},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			select {
			case <-release:
				return json.RawMessage(`{"id":"exp_1"}`), nil
			case <-ctx.Done():
				return nil, tool.Unknown(ctx.Err())
			}
		})
	if err := e.tools.Register(gt); err != nil {
		t.Fatal(err)
	}
	e.start(func(c *executor.Config) { c.Lease = 600 * time.Millisecond })
	e.produce("long", "slow.export", events.Irreversible, `{}`)
	op := e.waitStatus("long", events.StatusInProgress)
	claimed := *op.LeaseUntil
	// Wait well past the first lease; the heartbeat (every lease/3) must
	// have moved the lease column forward and kept it in the future.
	var renewed time.Time
	e.waitFor("long", "its lease renewed past three leases", func(events.Operation) bool {
		if err := e.store.Pool().QueryRow(context.Background(),
			`SELECT lease_until FROM operations WHERE operation_key = 'long'`).Scan(&renewed); err != nil {
			t.Fatal(err)
		}
		return renewed.After(claimed.Add(1800 * time.Millisecond))
	})
	if keys, err := e.store.ExpiredLeases(context.Background(), time.Now(), 10); err != nil || len(keys) != 0 {
		t.Fatalf("expired leases during a live call: %v %v", keys, err)
	}
	close(release)
	done := e.waitStatus("long", events.StatusCompleted)
	if done.Attempt != 1 || done.Evidence != 0 {
		t.Fatalf("attempts %d evidence %d, want one attempt and no late report", done.Attempt, done.Evidence)
	}
}
