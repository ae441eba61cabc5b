package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/telemetry"
	"github.com/effectline/effectline/internal/testenv"
)

// The observability contract (contract §8), checked on the real binary: one
// trace per operation continued from the agent's traceparent, the metrics an
// SRE alerts on, and logs (and everything else a human reads) free of
// credentials and sensitive arguments.

// obsComponents is what the observability tests run: one process with
// everything, as `effectline run` does in a small deployment.
const obsComponents = "relay,executor,projector,reconciler,api"

// obsAPIListening is the API's start line; its addr attribute is the bound
// address, which is how a test learns the port of EFFECTLINE_HTTP_ADDR=:0.
var obsAPIListening = regexp.MustCompile(`"msg":"http api listening".*"addr":"([^"]+)"`)

// obsStart starts one process running every component with its API on a
// free loopback port, and returns it with a client for that API; token is
// the client's bearer token ("" in open mode).
func obsStart(t *testing.T, name string, env map[string]string, token string) (*proc, *obsClient) {
	t.Helper()
	p := start(t, name, env, "run", "--components", obsComponents)
	m := p.waitLine(obsAPIListening, 60*time.Second)
	return p, &obsClient{t: t, base: "http://" + m[1], token: token}
}

// obsClient calls the binary's HTTP API.
type obsClient struct {
	t     *testing.T
	base  string
	token string // the bearer token, "" in open mode
}

// do sends a request and returns the status and body. body is marshalled
// unless it is already []byte; hdr adds headers.
func (c *obsClient) do(ctx context.Context, method, path string, body any, hdr http.Header) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, ok := body.([]byte)
		if !ok {
			var err error
			if b, err = json.Marshal(body); err != nil {
				return 0, nil, err
			}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// postIntent posts an intent and fails the test unless it is accepted.
func (c *obsClient) postIntent(ctx context.Context, key, toolName string, args any, hdr http.Header) {
	c.t.Helper()
	body := map[string]any{"operation_key": key, "tool": toolName, "args": args}
	status, b, err := c.do(ctx, http.MethodPost, "/v1/intents", body, hdr)
	if err != nil || (status != http.StatusAccepted && status != http.StatusOK) {
		c.t.Fatalf("POST /v1/intents %s: %d %s (%v)", key, status, b, err)
	}
}

// operation is the part of GET /v1/operations/{key} the tests read.
type obsOperation struct {
	OperationKey   string            `json:"operation_key"`
	Status         events.Status     `json:"status"`
	Attempt        int               `json:"attempt"`
	LastErrorClass string            `json:"last_error_class"`
	Events         []json.RawMessage `json:"events"`
	raw            []byte
}

func (c *obsClient) operation(ctx context.Context, key string) (obsOperation, error) {
	status, b, err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(key), nil, nil)
	if err != nil {
		return obsOperation{}, err
	}
	if status != http.StatusOK {
		return obsOperation{}, fmt.Errorf("GET /v1/operations/%s: %d %s", key, status, b)
	}
	var op obsOperation
	if err := json.Unmarshal(b, &op); err != nil {
		return obsOperation{}, err
	}
	op.raw = b
	return op, nil
}

// waitStatus polls the API until the operation reaches want, failing early
// if it settles in another terminal state.
func (c *obsClient) waitStatus(ctx context.Context, key string, want events.Status) obsOperation {
	c.t.Helper()
	var (
		op  obsOperation
		err error
	)
	for {
		op, err = c.operation(ctx, key)
		if err == nil && op.Status == want {
			return op
		}
		if err == nil && op.Status.Terminal() && op.Status != want {
			c.t.Fatalf("%s settled as %s, want %s:\n%s", key, op.Status, want, op.raw)
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("%s not %s in time: last %s (%v)", key, want, op.raw, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// obsAgentTracer is the agent's side of the trace: a TracerProvider exporting
// synchronously to endpoint (the test receiver or a real collector) as
// service "agent", so the root of the operation's trace is in the backend
// too and the tree has no missing parent.
func obsAgentTracer(t *testing.T, endpoint string) trace.Tracer {
	t.Helper()
	exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(endpoint+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("agent"))))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	})
	return tp.Tracer("effectline-observability-test")
}

// obsTraceparent is the W3C header of the span in ctx.
func obsTraceparent(ctx context.Context) http.Header {
	h := http.Header{}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	return h
}

// obsTraceEnv points the binary's exporter at endpoint with a short batch
// delay, so spans arrive within a tenth of a second of ending.
func obsTraceEnv(endpoint string) map[string]string {
	return map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
		"OTEL_BSP_SCHEDULE_DELAY":     "100",
		"OTEL_SERVICE_NAME":           "effectline",
		envInsecureOpenAPI:            "true",
		envHTTPAddr:                   "127.0.0.1:0",
	}
}

// obsLostResponse is the operation the trace tests follow: an
// irreversible charge whose first (and only) invoke applies the effect and
// loses the response, so the executor records Unknown and the reconciler
// asks the downstream, finds the charge, and completes the operation. It
// returns the agent's span context.
func obsLostResponse(t *testing.T, w *world, endpoint, key string) trace.SpanContext {
	t.Helper()
	w.fake.Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	_, api := obsStart(t, "effectline", w.with(obsTraceEnv(endpoint)), "")
	ctx := untilCtx(t, 45*time.Second)

	ctx, agent := obsAgentTracer(t, endpoint).Start(ctx, "agent: charge the customer",
		trace.WithSpanKind(trace.SpanKindClient))
	api.postIntent(ctx, key, "payments.charge", map[string]any{"amount": 1200, "currency": "EUR"}, obsTraceparent(ctx))
	agent.End()
	api.waitStatus(ctx, key, events.StatusCompleted)
	if n := w.fake.Requests(testenv.RouteInvoke); n != 1 {
		t.Errorf("the irreversible charge was sent %d times, want 1", n)
	}
	return agent.SpanContext()
}

// TestTraceOfAnOperation follows one operation through every component and
// checks the trace an SRE would open in Jaeger (contract §8): one trace,
// rooted at the agent's span, with the API request, the relay publishes, the
// single attempt with its outcome unknown, the reconciliation that found the
// effect, and the publish of the resolution.
func TestTraceOfAnOperation(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	w := newWorld(t)
	const key = "trace/charge-1"
	agent := obsLostResponse(t, w, recv.Endpoint(), key)
	traceID := agent.TraceID().String()

	// Spans end (and are exported) after the operation's record says
	// completed: the resolution's publish happens after its commit. Poll
	// until the trace is whole.
	var spans []telemetry.Span
	deadline := time.Now().Add(20 * time.Second)
	for {
		spans = obsSpansOfTrace(recv.Spans(), traceID)
		if obsTraceComplete(spans) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("trace %s:\n%s", traceID, obsRenderTree(spans))
	obsCheckTrace(t, spans, agent, key)
}

// obsSpansOfTrace keeps the spans of one trace.
func obsSpansOfTrace(all []telemetry.Span, traceID string) []telemetry.Span {
	var out []telemetry.Span
	for _, s := range all {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// obsTraceComplete reports whether the spans the test asserts on have arrived
// and every parent they name is among them.
func obsTraceComplete(spans []telemetry.Span) bool {
	if len(obsFindSpans(spans, "reconciliation", nil)) == 0 ||
		len(obsFindSpans(spans, "relay publish", map[string]string{"effectline.event_type": string(events.ReconciliationResolved)})) == 0 {
		return false
	}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	for _, s := range spans {
		if s.ParentSpanID != "" && !ids[s.ParentSpanID] {
			return false
		}
	}
	return true
}

// obsFindSpans returns the spans named name whose attributes include attrs.
func obsFindSpans(spans []telemetry.Span, name string, attrs map[string]string) []telemetry.Span {
	var out []telemetry.Span
next:
	for _, s := range spans {
		if s.Name != name {
			continue
		}
		for k, v := range attrs {
			if s.Attributes[k] != v {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// obsCheckTrace asserts the shape of the lost-response operation's
// trace.
func obsCheckTrace(t *testing.T, spans []telemetry.Span, agent trace.SpanContext, key string) {
	t.Helper()
	byID := map[string]telemetry.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	one := func(name string, attrs map[string]string) (telemetry.Span, bool) {
		t.Helper()
		got := obsFindSpans(spans, name, attrs)
		if len(got) != 1 {
			t.Errorf("want exactly one %q span with %v in the trace, got %d", name, attrs, len(got))
			return telemetry.Span{}, false
		}
		return got[0], true
	}
	kind := func(s telemetry.Span, want trace.SpanKind) {
		t.Helper()
		if s.Kind != want.String() {
			t.Errorf("%q span: kind %s, want %s", s.Name, s.Kind, want)
		}
	}
	// ancestor reports whether a is an ancestor of s.
	ancestor := func(a, s telemetry.Span) bool {
		for p, ok := byID[s.ParentSpanID]; ok; p, ok = byID[p.ParentSpanID] {
			if p.SpanID == a.SpanID {
				return true
			}
		}
		return false
	}

	// The tree: rooted at the agent's span, every other span's parent in
	// the trace.
	root, ok := byID[agent.SpanID().String()]
	if !ok {
		t.Fatalf("the agent's span %s is not in the trace", agent.SpanID())
	}
	if root.ParentSpanID != "" {
		t.Errorf("the agent's span has a parent %s", root.ParentSpanID)
	}
	for _, s := range spans {
		if s.SpanID == root.SpanID {
			continue
		}
		if _, ok := byID[s.ParentSpanID]; !ok {
			t.Errorf("span %q (%s) has parent %q, which is not in the trace", s.Name, s.SpanID, s.ParentSpanID)
		}
		if !ancestor(root, s) {
			t.Errorf("span %q (%s) does not descend from the agent's span", s.Name, s.SpanID)
		}
		if s.Service != "effectline" {
			t.Errorf("span %q: service %q, want effectline", s.Name, s.Service)
		}
	}

	// The API request, a child of the agent's span.
	if api, ok := one("POST /v1/intents", nil); ok {
		kind(api, trace.SpanKindServer)
		if api.ParentSpanID != root.SpanID {
			t.Errorf("the API span's parent is %s, want the agent's span %s", api.ParentSpanID, root.SpanID)
		}
		for k, v := range map[string]string{
			"http.response.status_code": "202", "effectline.operation_key": key,
			"effectline.tool": "payments.charge", "effectline.effect_class": "irreversible",
		} {
			if api.Attributes[k] != v {
				t.Errorf("API span: %s=%q, want %q", k, api.Attributes[k], v)
			}
		}
		if api.StatusCode == "Error" {
			t.Errorf("API span status Error: %s", api.StatusMessage)
		}
	}

	// Every journaled event is published once, in a producer span.
	publishes := obsFindSpans(spans, "relay publish", nil)
	for _, p := range publishes {
		kind(p, trace.SpanKindProducer)
		if p.Attributes["effectline.operation_key"] != key || p.Attributes["messaging.system"] != "kafka" {
			t.Errorf("relay publish span with attributes %v", p.Attributes)
		}
		if p.StatusCode == "Error" {
			t.Errorf("relay publish of %s failed: %s", p.Attributes["effectline.event_type"], p.StatusMessage)
		}
	}
	// The intent goes to two topics: the executor's (whose publish the
	// attempt continues) and the outcomes topic the projector reads.
	intentPub, _ := one("relay publish", map[string]string{
		"effectline.event_type": string(events.IntentRecorded), "messaging.destination.name": "effectline.intents"})

	// The one attempt: irreversible, never retried.
	attempts := obsFindSpans(spans, "attempt", nil)
	if len(attempts) != 1 {
		t.Errorf("%d attempt spans, want exactly 1 (an irreversible effect is never retried)", len(attempts))
	}
	var attempt telemetry.Span
	if len(attempts) > 0 {
		attempt = attempts[0]
		kind(attempt, trace.SpanKindClient)
		for k, v := range map[string]string{
			"effectline.operation_key": key, "effectline.tool": "payments.charge",
			"effectline.effect_class": "irreversible", "effectline.attempt": "1",
			"effectline.outcome": "unknown",
		} {
			if attempt.Attributes[k] != v {
				t.Errorf("attempt span: %s=%q, want %q", k, attempt.Attributes[k], v)
			}
		}
		if attempt.Attributes["effectline.error_class"] == "" {
			t.Error("attempt span: effectline.error_class is not set")
		}
		if _, ok := attempt.Attributes["effectline.backoff_waited_ms"]; !ok {
			t.Error("attempt span: effectline.backoff_waited_ms is missing")
		}
		if attempt.StatusCode != "Error" {
			t.Errorf("attempt span: status %s, want Error (the outcome is unknown)", attempt.StatusCode)
		}
		if intentPub.SpanID != "" && !ancestor(intentPub, attempt) {
			t.Error("the attempt does not descend from the publish of the intent")
		}
	}

	// The reconciliation that found the charge.
	if rec, ok := one("reconciliation", nil); ok {
		kind(rec, trace.SpanKindClient)
		if rec.Attributes["effectline.reconcile_answer"] != "found" {
			t.Errorf("reconciliation span: answer %q, want found", rec.Attributes["effectline.reconcile_answer"])
		}
		if rec.Attributes["effectline.operation_key"] != key {
			t.Errorf("reconciliation span: operation key %q", rec.Attributes["effectline.operation_key"])
		}
		if rec.StatusCode == "Error" {
			t.Errorf("reconciliation span: status Error: %s", rec.StatusMessage)
		}
		if attempt.SpanID != "" && !ancestor(attempt, rec) {
			t.Error("the reconciliation does not descend from the attempt whose outcome it resolves")
		}
		// The completion: the resolution's publish, under the reconciliation.
		if done, ok := one("relay publish", map[string]string{"effectline.event_type": string(events.ReconciliationResolved)}); ok && !ancestor(rec, done) {
			t.Error("the publish of reconciliation.resolved does not descend from the reconciliation")
		}
	}
	if n := len(obsFindSpans(spans, "escalation", nil)); n != 0 {
		t.Errorf("%d escalation spans: a found effect needs no human", n)
	}
}

// obsRenderTree draws the spans as an indented tree, children in start order,
// for the test log and the documentation.
func obsRenderTree(spans []telemetry.Span) string {
	children := map[string][]telemetry.Span{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	var roots []telemetry.Span
	for _, s := range spans {
		if ids[s.ParentSpanID] {
			children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(ss []telemetry.Span) {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Start.Before(ss[j].Start) })
	}
	var b strings.Builder
	var walk func(s telemetry.Span, depth int)
	walk = func(s telemetry.Span, depth int) {
		detail := []string{s.Kind}
		for _, k := range []string{"effectline.event_type", "effectline.attempt", "effectline.outcome",
			"effectline.error_class", "effectline.reconcile_answer", "http.response.status_code"} {
			if v, ok := s.Attributes[k]; ok {
				detail = append(detail, strings.TrimPrefix(k, "effectline.")+"="+v)
			}
		}
		if s.StatusCode != "Unset" {
			detail = append(detail, "status="+s.StatusCode)
		}
		fmt.Fprintf(&b, "%s%s [%s] (%s)\n", strings.Repeat("  ", depth), s.Name, s.Service, strings.Join(detail, " "))
		kids := children[s.SpanID]
		byStart(kids)
		for _, c := range kids {
			walk(c, depth+1)
		}
	}
	byStart(roots)
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

// obsToolsFile writes a tools file for w's fake downstream and returns its
// path.
func obsToolsFile(t *testing.T, w *world, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(yaml, "URL", w.fake.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMetricsAfterAScriptedRun drives three operations through the binary
// (a success, a 503 then a success, a lost response that is reconciled) and
// checks what /metrics says about them (contract §8): attempts by tool, class
// and outcome, unknowns, reconciliations, end-to-end latency, outbox and
// consumer lag, and the API's request counters.
func TestMetricsAfterAScriptedRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	_, api := obsStart(t, "effectline", w.with(map[string]string{
		envInsecureOpenAPI: "true", envHTTPAddr: "127.0.0.1:0",
	}), "")
	ctx := untilCtx(t, 45*time.Second)

	// One at a time: the fake tool's script is per route, not per tool.
	api.postIntent(ctx, "metrics/cache", "cache.set", map[string]any{"k": "v"}, nil)
	api.waitStatus(ctx, "metrics/cache", events.StatusCompleted)

	w.fake.Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(http.StatusServiceUnavailable, ""))
	api.postIntent(ctx, "metrics/reserve", "inventory.reserve", map[string]any{"sku": "A-1", "qty": 2}, nil)
	api.waitStatus(ctx, "metrics/reserve", events.StatusCompleted)

	w.fake.Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	api.postIntent(ctx, "metrics/charge", "payments.charge", map[string]any{"amount": 500}, nil)
	api.waitStatus(ctx, "metrics/charge", events.StatusCompleted)

	type want struct {
		name   string
		labels map[string]string
		value  float64
	}
	wants := []want{
		{"effectline_attempts_total", map[string]string{"tool": "cache.set", "effect_class": "idempotent", "outcome": "succeeded"}, 1},
		{"effectline_attempts_total", map[string]string{"tool": "inventory.reserve", "effect_class": "compensable", "outcome": "failed"}, 1},
		{"effectline_attempts_total", map[string]string{"tool": "inventory.reserve", "effect_class": "compensable", "outcome": "succeeded"}, 1},
		{"effectline_attempts_total", map[string]string{"tool": "payments.charge", "effect_class": "irreversible", "outcome": "unknown"}, 1},
		{"effectline_attempts_total", map[string]string{"tool": "payments.charge", "outcome": "succeeded"}, 0},
		{"effectline_unknowns_total", map[string]string{"tool": "payments.charge"}, 1},
		{"effectline_unknowns_total", nil, 1},
		{"effectline_reconciliations_total", map[string]string{"tool": "payments.charge", "answer": "found"}, 1},
		{"effectline_reconciliations_total", nil, 1},
		{"effectline_escalations_total", nil, 0},
		{"effectline_operation_duration_seconds_count", map[string]string{"status": "completed"}, 3},
		{"effectline_operation_duration_seconds_count", map[string]string{"tool": "payments.charge", "status": "completed"}, 1},
		{"effectline_call_duration_seconds_count", nil, 4},
		{"effectline_http_requests_total", map[string]string{"http_request_method": "POST", "http_route": "/v1/intents", "http_response_status_code": "202"}, 3},
		{"http_server_request_duration_seconds_count", map[string]string{"http_request_method": "POST", "http_route": "/v1/intents"}, 3},
		{"effectline_http_intents_total", map[string]string{"result": "recorded"}, 3},
	}
	// The counters move as the components journal, a moment after the API
	// shows the state; scrape until they agree or the deadline passes.
	var (
		m    obsMetrics
		errs []string
	)
	for {
		m = api.scrape(ctx)
		errs = errs[:0]
		for _, w := range wants {
			if got := m.sum(w.name, w.labels); got != w.value {
				errs = append(errs, fmt.Sprintf("%s%v = %v, want %v", w.name, w.labels, got, w.value))
			}
		}
		// Gauges, and histograms whose counts depend on timing: present,
		// whatever their value.
		for _, g := range []struct {
			name   string
			labels map[string]string
		}{
			{"effectline_outbox_backlog", nil},
			{"effectline_outbox_lag_seconds", nil},
			{"effectline_journal_commit_appends_count", nil},
			{"effectline_kafka_consumer_lag", map[string]string{"group": "effectline-executor", "topic": "effectline.intents"}},
			{"effectline_kafka_consumer_lag", map[string]string{"group": "effectline-projector", "topic": "effectline.outcomes"}},
			{"effectline_kafka_consumer_lag", map[string]string{"group": "effectline-reconciler", "topic": "effectline.outcomes"}},
		} {
			if !m.has(g.name, g.labels) {
				errs = append(errs, fmt.Sprintf("gauge %s%v missing", g.name, g.labels))
			}
		}
		if len(errs) == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range errs {
		t.Error(e)
	}
	if t.Failed() {
		t.Logf("/metrics (effectline series):\n%s", m.effectline())
	}
	// Everything was published and consumed: the backlog drains to zero and
	// so does the lag (within the auto-commit interval and the monitor's 5s
	// period).
	for {
		m = api.scrape(ctx)
		if m.sum("effectline_outbox_backlog", nil) == 0 && m.sum("effectline_kafka_consumer_lag", nil) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Errorf("backlog %v and consumer lag %v did not drain to 0:\n%s",
				m.sum("effectline_outbox_backlog", nil), m.sum("effectline_kafka_consumer_lag", nil), m.effectline())
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sample is one series of a scrape.
type obsSample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is a parsed scrape in the Prometheus text format.
type obsMetrics struct {
	samples []obsSample
	raw     string
}

var (
	obsSampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)`)
	obsLabelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// scrape reads /metrics.
func (c *obsClient) scrape(ctx context.Context) obsMetrics {
	c.t.Helper()
	status, b, err := c.do(ctx, http.MethodGet, "/metrics", nil, nil)
	if err != nil || status != http.StatusOK {
		c.t.Fatalf("GET /metrics: %d (%v)", status, err)
	}
	m := obsMetrics{raw: string(b)}
	for _, line := range strings.Split(m.raw, "\n") {
		mm := obsSampleLine.FindStringSubmatch(line)
		if mm == nil {
			continue
		}
		s := obsSample{name: mm[1], labels: map[string]string{}}
		for _, lp := range obsLabelPair.FindAllStringSubmatch(mm[2], -1) {
			s.labels[lp[1]] = lp[2]
		}
		if _, err := fmt.Sscanf(mm[3], "%g", &s.value); err != nil {
			continue
		}
		m.samples = append(m.samples, s)
	}
	return m
}

func (m obsMetrics) matching(name string, labels map[string]string) []obsSample {
	var out []obsSample
next:
	for _, s := range m.samples {
		if s.name != name {
			continue
		}
		for k, v := range labels {
			if s.labels[k] != v {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// sum adds the series of name whose labels include labels.
func (m obsMetrics) sum(name string, labels map[string]string) float64 {
	var total float64
	for _, s := range m.matching(name, labels) {
		total += s.value
	}
	return total
}

func (m obsMetrics) has(name string, labels map[string]string) bool {
	return len(m.matching(name, labels)) > 0
}

// effectline returns the scrape's effectline lines, for failure messages.
func (m obsMetrics) effectline() string {
	var b strings.Builder
	for _, line := range strings.Split(m.raw, "\n") {
		if strings.Contains(line, "effectline") || strings.HasPrefix(line, "http_") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// obsSecretTools is the tools file of TestLogsNeverContainSecrets: a charge
// whose args carry a card number (writeOnly, and named like a secret), a
// security code marked writeOnly under an innocent name, and an api_key
// known only by its name.
const obsSecretTools = `tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    args_schema:
      type: object
      required: [amount]
      properties:
        amount: {type: integer}
        card_number: {type: string, writeOnly: true, maxLength: 19}
        security_code: {type: string, writeOnly: true}
        api_key: {type: string}
`

// TestLogsNeverContainSecrets runs charges carrying credentials through
// success, failure, reconciliation and escalation, at log level debug, with
// the API behind a token, and checks that no credential appears in the
// process's output, in the spans it exports, in any history the API serves
// or on the approval UI's pages (contract §8).
func TestLogsNeverContainSecrets(t *testing.T) {
	t.Parallel()
	const (
		card      = "4242424242424242"
		cvc       = "cvc_SECRET789"
		apiKey    = "sk_live_SECRET123"
		token     = "tok_SECRET456_0123"
		wrongTok  = "tok_WRONG_SECRET777"
		longCard  = "4242424242424242SECRETX" // over maxLength: refused
		principal = "agent"
	)
	secrets := []string{card, cvc, apiKey, token, wrongTok, longCard, "SECRET"}

	recv := telemetry.NewTestReceiver(t)
	w := newWorld(t)
	env := w.with(map[string]string{
		envTools:                      obsToolsFile(t, w, obsSecretTools),
		envLogLevel:                   "debug",
		envAPITokens:                  principal + "=" + token,
		envApprovers:                  principal,
		envHTTPAddr:                   "127.0.0.1:0",
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint(),
		"OTEL_BSP_SCHEDULE_DELAY":     "100",
	})
	p, api := obsStart(t, "effectline", env, token)
	ctx := untilCtx(t, 45*time.Second)
	args := map[string]any{"amount": 990, "card_number": card, "security_code": cvc, "api_key": apiKey}

	// The paths an operation can take, each with the secrets in its args.
	// One at a time: the fake tool's script is per route.
	paths := []struct {
		key   string
		fault testenv.Fault
		want  events.Status
	}{
		{"secrets/success", testenv.FaultNone, events.StatusCompleted},
		{"secrets/rejected", testenv.FaultFailBeforeEffect(http.StatusUnprocessableEntity, ""), events.StatusFailed},
		// The response is lost after the charge: the reconciler asks, and
		// the downstream's answer echoes the args it was sent.
		{"secrets/reconciled", testenv.FaultLoseResponse, events.StatusCompleted},
		// A 500 before the effect: unknown, the downstream has no charge,
		// and an irreversible effect is not retried blindly: a human decides.
		{"secrets/escalated", testenv.FaultFailBeforeEffect(http.StatusInternalServerError, ""), events.StatusEscalated},
	}
	var keys []string
	for _, path := range paths {
		w.fake.Script(testenv.RouteInvoke, path.fault)
		api.postIntent(ctx, path.key, "payments.charge", args, nil)
		api.waitStatus(ctx, path.key, path.want)
		keys = append(keys, path.key)
	}
	if n := w.fake.Requests(testenv.RouteInvoke); n != len(paths) {
		t.Errorf("%d charges sent for %d operations", n, len(paths))
	}

	// Refusals: args over the schema, a wrong token. Their answers must not
	// echo what was sent either.
	var served []string // every body the API or the UI answered
	status, b, err := api.do(ctx, http.MethodPost, "/v1/intents", map[string]any{
		"operation_key": "secrets/invalid", "tool": "payments.charge",
		"args": map[string]any{"amount": 1, "card_number": longCard, "api_key": apiKey},
	}, nil)
	if err != nil || status != http.StatusBadRequest {
		t.Errorf("invalid args: %d %s (%v), want 400", status, b, err)
	}
	served = append(served, string(b))
	wrong := &obsClient{t: t, base: api.base, token: wrongTok}
	if status, b, err = wrong.do(ctx, http.MethodGet, "/v1/operations/secrets%2Fsuccess", nil, nil); err != nil || status != http.StatusUnauthorized {
		t.Errorf("wrong token: %d %s (%v), want 401", status, b, err)
	}
	served = append(served, string(b))

	// The histories, through the API.
	for _, key := range keys {
		op, err := api.operation(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(op.Events) < 2 {
			t.Errorf("%s: history of %d events", key, len(op.Events))
		}
		served = append(served, string(op.raw))
		if key == "secrets/reconciled" {
			// The downstream's record, found by reconciliation, is the
			// result: kept, with the args it echoes redacted.
			var rec struct {
				Result struct {
					ID   string         `json:"id"`
					Args map[string]any `json:"args"`
				} `json:"result"`
			}
			_ = json.Unmarshal(op.raw, &rec)
			if rec.Result.ID == "" || rec.Result.Args["card_number"] != "[redacted]" || rec.Result.Args["security_code"] != "[redacted]" {
				t.Errorf("%s: result %+v, want the downstream's record with its echo of the args redacted", key, rec.Result)
			}
		}
	}
	_, b, _ = api.do(ctx, http.MethodGet, "/v1/operations?limit=100", nil, nil)
	served = append(served, string(b))

	// The approval UI, signed in with the token as an approver would: the
	// queue (with the escalated charge and its evidence) and every
	// operation's page.
	ui := obsUIBrowser(t, api.base)
	served = append(served, ui.post(ctx, "/ui/login", url.Values{"token": {wrongTok}}))
	served = append(served, ui.post(ctx, "/ui/login", url.Values{"token": {token}}))
	// The queue lists from the read model, which follows the head the
	// statuses above were read from by a relay hop and a projection.
	queue := ui.get(ctx, "/ui/")
	for !strings.Contains(queue, "secrets/escalated") {
		select {
		case <-ctx.Done():
			t.Fatalf("the approval queue does not show the escalated charge:\n%s", queue)
		case <-time.After(50 * time.Millisecond):
		}
		queue = ui.get(ctx, "/ui/")
	}
	served = append(served, queue)
	for _, key := range keys {
		served = append(served, ui.get(ctx, "/ui/operations/"+url.PathEscape(key)))
	}

	// A human settles the escalation; the decision is journaled and logged.
	status, b, err = api.do(ctx, http.MethodPost, "/v1/operations/secrets%2Fescalated/decisions",
		map[string]any{"action": events.ActionAbandon, "note": "no charge downstream; abandon"}, nil)
	if err != nil || status >= 300 {
		t.Errorf("decision: %d %s (%v)", status, b, err)
	}
	served = append(served, string(b))
	op := api.waitStatus(ctx, "secrets/escalated", events.StatusFailed)
	served = append(served, string(op.raw), ui.get(ctx, "/ui/operations/secrets%2Fescalated"))

	// Stop gracefully, so the shutdown's lines (and the last spans) are in.
	if err := p.stop(20 * time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
	output := p.output()
	if !strings.Contains(output, `"level":"DEBUG"`) {
		t.Error("no debug lines: the test must run at log level debug")
	}
	for _, key := range keys {
		if !strings.Contains(output, key) {
			t.Errorf("the log never mentions %s: the test would prove nothing", key)
		}
	}
	var spans strings.Builder
	for _, s := range recv.Spans() {
		fmt.Fprintf(&spans, "%s %s %v\n", s.Name, s.StatusMessage, s.Attributes)
	}
	if !strings.Contains(spans.String(), "secrets/escalated") {
		t.Error("no spans of the operations arrived")
	}

	for _, secret := range secrets {
		if i := strings.Index(output, secret); i >= 0 {
			t.Errorf("the process output contains %q: …%s…", secret, obsExcerpt(output, i))
		}
		if i := strings.Index(spans.String(), secret); i >= 0 {
			t.Errorf("an exported span contains %q: …%s…", secret, obsExcerpt(spans.String(), i))
		}
		for _, body := range served {
			if i := strings.Index(body, secret); i >= 0 {
				t.Errorf("an API or UI answer contains %q: …%s…", secret, obsExcerpt(body, i))
			}
		}
	}
}

// obsExcerpt is up to 150 bytes of s around i, for failure messages.
func obsExcerpt(s string, i int) string {
	return s[max(i-150, 0):min(i+150, len(s))]
}

// browser is an HTTP client with a cookie jar, for the approval UI.
type obsBrowser struct {
	t      *testing.T
	base   string
	client *http.Client
}

func obsUIBrowser(t *testing.T, base string) *obsBrowser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &obsBrowser{t: t, base: base, client: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
}

func (b *obsBrowser) get(ctx context.Context, path string) string {
	b.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.send(req, http.StatusOK)
}

// post submits a form as the login page does (no CSRF token: the login
// form is guarded by the origin check, which a same-origin post passes).
func (b *obsBrowser) post(ctx context.Context, path string, form url.Values) string {
	b.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.send(req, 0)
}

func (b *obsBrowser) send(req *http.Request, want int) string {
	b.t.Helper()
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	if want != 0 && resp.StatusCode != want {
		b.t.Errorf("%s %s: %d, want %d:\n%s", req.Method, req.URL.Path, resp.StatusCode, want, body)
	}
	return string(body)
}

// TestTraceInJaeger runs TestTraceOfAnOperation's scenario against a real
// Jaeger and reads the trace back through its query API, checking the same
// tree. It runs only when EFFECTLINE_JAEGER_URL names Jaeger's query/UI
// base URL (scripts/jaeger.sh start, then
// EFFECTLINE_JAEGER_URL=http://127.0.0.1:16686); spans go to
// OTEL_EXPORTER_OTLP_ENDPOINT, default http://127.0.0.1:4318. CI runs
// TestTraceOfAnOperation with the in-process receiver instead: building
// Jaeger cold takes about 16 minutes.
func TestTraceInJaeger(t *testing.T) {
	jaeger := strings.TrimRight(os.Getenv("EFFECTLINE_JAEGER_URL"), "/")
	if jaeger == "" {
		t.Skip("set EFFECTLINE_JAEGER_URL (e.g. http://127.0.0.1:16686 after scripts/jaeger.sh start) to run against Jaeger")
	}
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		endpoint = "http://127.0.0.1:4318"
	}
	t.Parallel()
	w := newWorld(t)
	key := fmt.Sprintf("jaeger/charge-%d", time.Now().UnixNano())
	agent := obsLostResponse(t, w, endpoint, key)
	traceID := agent.TraceID().String()

	// Jaeger batches before it stores: poll until the trace is whole.
	var (
		spans []telemetry.Span
		err   error
	)
	deadline := time.Now().Add(60 * time.Second)
	for {
		spans, err = obsJaegerTrace(t.Context(), jaeger, traceID)
		if (err == nil && obsTraceComplete(spans)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("reading trace %s from Jaeger: %v", traceID, err)
	}
	t.Logf("%s/trace/%s:\n%s", jaeger, traceID, obsRenderTree(spans))
	obsCheckTrace(t, spans, agent, key)
}

// obsJaegerTrace reads one trace from Jaeger's query API (GET
// /api/traces/{id}, the UI's JSON) as telemetry.Spans: the parent is the
// first CHILD_OF reference, the kind the span.kind tag (absent: internal),
// the status the otel.status_code tag.
func obsJaegerTrace(ctx context.Context, base, traceID string) ([]telemetry.Span, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/traces/"+traceID, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil // not stored yet
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET /api/traces/%s: %s %s", traceID, resp.Status, b)
	}
	var body struct {
		Data []struct {
			Spans []struct {
				TraceID       string `json:"traceID"`
				SpanID        string `json:"spanID"`
				OperationName string `json:"operationName"`
				ProcessID     string `json:"processID"`
				References    []struct {
					RefType string `json:"refType"`
					SpanID  string `json:"spanID"`
				} `json:"references"`
				Tags []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
			} `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber() // integer tags print as the receiver prints them
	if err := dec.Decode(&body); err != nil {
		return nil, err
	}
	// Jaeger prints ids without leading zeros.
	pad := func(id string, n int) string { return strings.Repeat("0", max(n-len(id), 0)) + id }
	var out []telemetry.Span
	for _, tr := range body.Data {
		for _, s := range tr.Spans {
			span := telemetry.Span{
				TraceID: pad(s.TraceID, 32), SpanID: pad(s.SpanID, 16), Name: s.OperationName,
				Kind: "internal", StatusCode: "Unset", Attributes: map[string]string{},
				Service: tr.Processes[s.ProcessID].ServiceName,
			}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" {
					span.ParentSpanID = pad(r.SpanID, 16)
					break
				}
			}
			for _, tag := range s.Tags {
				v := fmt.Sprint(tag.Value)
				switch tag.Key {
				case "span.kind":
					span.Kind = v
				case "otel.status_code":
					if c, ok := map[string]string{"ERROR": "Error", "OK": "Ok"}[v]; ok {
						span.StatusCode = c
					}
				case "otel.status_description":
					span.StatusMessage = v
				default:
					span.Attributes[tag.Key] = v
				}
			}
			out = append(out, span)
		}
	}
	return out, nil
}

// TestTraceFromJaegerJSON checks obsJaegerTrace's reading of Jaeger's query
// API on a canned answer, so TestTraceInJaeger, which CI skips, does not rot
// unnoticed.
func TestTraceFromJaegerJSON(t *testing.T) {
	t.Parallel()
	const answer = `{"data":[{"traceID":"4176ad5a5f1989376c17da0296edd1","spans":[
	  {"traceID":"4176ad5a5f1989376c17da0296edd1","spanID":"a1e5a8cf4511f43","operationName":"attempt","processID":"p1",
	   "references":[{"refType":"FOLLOWS_FROM","traceID":"x","spanID":"ffffffffffffffff"},
	                 {"refType":"CHILD_OF","traceID":"4176ad5a5f1989376c17da0296edd1","spanID":"6791cff795a54c8b"}],
	   "tags":[{"key":"span.kind","type":"string","value":"client"},{"key":"effectline.attempt","type":"int64","value":1},
	           {"key":"otel.status_code","type":"string","value":"ERROR"},{"key":"otel.status_description","type":"string","value":"unknown outcome: eof"}]},
	  {"traceID":"4176ad5a5f1989376c17da0296edd1","spanID":"6791cff795a54c8b","operationName":"escalation","processID":"p1",
	   "references":[],"tags":[]}],
	 "processes":{"p1":{"serviceName":"effectline","tags":[]}}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/traces/004176ad5a5f1989376c17da0296edd1" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	spans, err := obsJaegerTrace(t.Context(), srv.URL, "004176ad5a5f1989376c17da0296edd1")
	if err != nil || len(spans) != 2 {
		t.Fatalf("obsJaegerTrace: %d spans, %v", len(spans), err)
	}
	a, e := spans[0], spans[1]
	if a.TraceID != "004176ad5a5f1989376c17da0296edd1" || a.SpanID != "0a1e5a8cf4511f43" || a.ParentSpanID != "6791cff795a54c8b" ||
		a.Kind != "client" || a.StatusCode != "Error" || a.StatusMessage != "unknown outcome: eof" ||
		a.Attributes["effectline.attempt"] != "1" || a.Service != "effectline" {
		t.Errorf("attempt span = %+v", a)
	}
	if e.ParentSpanID != "" || e.Kind != "internal" || e.StatusCode != "Unset" {
		t.Errorf("escalation span = %+v", e)
	}
}
