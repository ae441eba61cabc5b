package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool/httptool"
)

// TestMain checks, after every test ran, that each (method, route, status)
// a test observed is documented in api/openapi.json: the document and the
// handlers cannot drift apart without a failing build.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if problems := undocumentedObservations(); len(problems) > 0 {
			fmt.Fprintln(os.Stderr, "FAIL: responses observed in tests but missing from api/openapi.json:")
			for _, p := range problems {
				fmt.Fprintln(os.Stderr, "  "+p)
			}
			code = 1
		}
	}
	os.Exit(code)
}

// observed holds "METHOD /route status" for every response a test saw
// through fixture.do.
var observed sync.Map

func observe(method, route string, status int) {
	observed.Store(method+" "+route+" "+strconv.Itoa(status), struct{}{})
}

func undocumentedObservations() []string {
	doc, err := loadOpenAPI()
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	observed.Range(func(k, _ any) bool {
		parts := strings.Fields(k.(string))
		method, route, status := parts[0], parts[1], parts[2]
		if !doc.documents(method, route, status) {
			problems = append(problems, k.(string))
		}
		return true
	})
	sort.Strings(problems)
	return problems
}

// openAPIDoc is the part of an OpenAPI document the tests read.
type openAPIDoc struct {
	OpenAPI string                                 `json:"openapi"`
	Paths   map[string]map[string]openAPIOperation `json:"paths"`
}

type openAPIOperation struct {
	OperationID string                     `json:"operationId"`
	Responses   map[string]json.RawMessage `json:"responses"`
	Security    *[]map[string][]string     `json:"security"`
}

func loadOpenAPI() (*openAPIDoc, error) {
	var doc openAPIDoc
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		return nil, fmt.Errorf("api/openapi.json is not valid JSON: %v", err)
	}
	return &doc, nil
}

// documents reports whether the document lists status for method and
// route. A route registered without a method is documented under get.
func (d *openAPIDoc) documents(method, route, status string) bool {
	if method == "" || method == http.MethodHead {
		method = http.MethodGet
	}
	op, ok := d.Paths[route][strings.ToLower(method)]
	if !ok {
		return false
	}
	_, ok = op.Responses[status]
	return ok
}

// Tokens of the test principals.
const (
	billingToken = "tok-billing-3f9a"
	supportToken = "tok-support-77c1"
	opsToken     = "tok-ops-0b2e-5d71"
)

// toolsFile is a tools file (contract §6) for the tests. card_number is secret
// by its name, cvv by its schema (writeOnly).
const toolsFile = `
tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "http://127.0.0.1:9/charges", timeout: 2s}
    reconcile: {method: GET, url: "http://127.0.0.1:9/charges?idempotency_key={{.Key}}"}
    args_schema:
      type: object
      required: [amount, currency]
      properties:
        amount: {type: integer, minimum: 1}
        currency: {type: string, enum: [EUR, USD]}
        card_number: {type: string}
        cvv: {type: string, writeOnly: true, pattern: "^[0-9]{3,4}$"}
        memo: {type: string}
    allowed_principals: [billing-agent]
  - name: inventory.reserve
    effect: compensable
    invoke:     {method: POST, url: "http://127.0.0.1:9/reservations", timeout: 2s}
    compensate: {method: POST, url: "http://127.0.0.1:9/reservations/release"}
`

// testTools is the real tool registry loaded from toolsFile.
func testTools(t testing.TB) Tools {
	t.Helper()
	reg, err := httptool.Parse([]byte(toolsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// fakeOperations stands in for the projector's read model.
type fakeOperations struct {
	mu   sync.Mutex
	last events.ListFilter
	page events.ListPage
	err  error
}

func (f *fakeOperations) List(_ context.Context, filter events.ListFilter) (events.ListPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = filter
	return f.page, f.err
}

func (f *fakeOperations) set(page events.ListPage, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.page, f.err = page, err
}

func (f *fakeOperations) lastFilter() events.ListFilter {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

type fixture struct {
	srv     *Server
	store   *store.Store
	url     string
	ops     *fakeOperations
	spans   *tracetest.SpanRecorder
	metrics *sdkmetric.ManualReader
}

type option func(*Config, *Deps)

// setup returns a server on a fresh, migrated database, with a running group
// committer, served by an httptest server.
func setup(t *testing.T, opts ...option) *fixture {
	t.Helper()
	pool := testenv.NewPool(t, storedb.New(t))
	st := store.New(pool)
	committer := st.NewCommitter(store.CommitterConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = committer.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })

	f := &fixture{store: st, ops: &fakeOperations{}, spans: tracetest.NewSpanRecorder(),
		metrics: sdkmetric.NewManualReader()}
	cfg := Config{
		Tokens:         map[string]string{billingToken: "billing-agent", supportToken: "support-agent", opsToken: "ops"},
		Approvers:      []string{"ops"},
		Logger:         slog.New(slog.DiscardHandler),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans)),
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.metrics)),
	}
	deps := Deps{Store: st, Committer: committer, Tools: testTools(t), Operations: f.ops}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	srv, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a generic map.
func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d is not a JSON object: %v: %s", r.status, err, r.body)
	}
	return m
}

// do sends a request and records what it observed for the OpenAPI check.
// body is sent as application/json unless a Content-Type header is given.
func (f *fixture) do(t testing.TB, method, path, token string, body string, header ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	_, pattern := f.srv.mux.Handler(req)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	// Routes under /test/ are registered by tests only and not part of the
	// API.
	if m, p := splitPattern(pattern); pattern != "" && !strings.HasPrefix(p, "/test/") {
		observe(m, p, res.StatusCode)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// post sends an intent.
func (f *fixture) post(t testing.TB, token, key, toolName, args string, header ...string) response {
	t.Helper()
	body, err := json.Marshal(map[string]any{"operation_key": key, "tool": toolName, "args": json.RawMessage(args)})
	if err != nil {
		t.Fatal(err)
	}
	return f.do(t, http.MethodPost, "/v1/intents", token, string(body), header...)
}

// complete journals a successful first attempt of key, as the executor would.
func (f *fixture) complete(t testing.TB, key, result string) events.Operation {
	t.Helper()
	ctx := context.Background()
	op, err := f.store.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	started, err := events.New(events.AttemptStarted, key, op.Seq+1, op.Tool, op.EffectClass, 1,
		events.AttemptStartedData{DownstreamKey: key, Worker: "test-worker", LeaseUntil: now.Add(time.Minute)}, now)
	if err != nil {
		t.Fatal(err)
	}
	succeeded, err := events.New(events.AttemptSucceeded, key, op.Seq+2, op.Tool, op.EffectClass, 1,
		events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(result), DownstreamID: "ch_1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	done, err := f.store.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started, succeeded}, TopicPrefix: "effectline."})
	if err != nil {
		t.Fatal(err)
	}
	return done
}

// countEvents returns how many events key has in the journal.
func (f *fixture) countEvents(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := f.store.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE operation_key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantStatus(t testing.TB, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body: %s", r.status, want, bytes.TrimSpace(r.body))
	}
}

// wantError checks an error response's status and code (and field, if given).
func wantError(t testing.TB, r response, status int, code string, field ...string) map[string]any {
	t.Helper()
	wantStatus(t, r, status)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	m := r.json(t)
	if m["error"] != code {
		t.Fatalf("error %v, want %q; body: %s", m["error"], code, r.body)
	}
	if len(field) > 0 && m["field"] != field[0] {
		t.Fatalf("field %v, want %q; body: %s", m["field"], field[0], r.body)
	}
	return m
}
