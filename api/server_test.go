package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	var notReady atomic.Bool
	f := setup(t, func(_ *Config, d *Deps) {
		d.Ready = func(ctx context.Context) error {
			if notReady.Load() {
				return errors.New("dial tcp 10.0.0.7:5432: connection refused")
			}
			return nil
		}
	})
	// Health needs no token.
	if r := f.do(t, http.MethodGet, "/healthz", "", ""); r.status != http.StatusOK || r.json(t)["status"] != "ok" {
		t.Fatalf("healthz: %d %s", r.status, r.body)
	}
	if r := f.do(t, http.MethodGet, "/readyz", "", ""); r.status != http.StatusOK || r.json(t)["status"] != "ready" {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}

	notReady.Store(true)
	r := f.do(t, http.MethodGet, "/readyz", "", "")
	wantError(t, r, http.StatusServiceUnavailable, codeUnavailable)
	if strings.Contains(string(r.body), "10.0.0.7") {
		t.Fatalf("readyz tells an anonymous caller where the database is: %s", r.body)
	}
	notReady.Store(false)
	wantStatus(t, f.do(t, http.MethodGet, "/readyz", "", ""), http.StatusOK)

	f.srv.SetUnready()
	wantError(t, f.do(t, http.MethodGet, "/readyz", "", ""), http.StatusServiceUnavailable, codeUnavailable)
	// Liveness is unaffected: the process still serves.
	wantStatus(t, f.do(t, http.MethodGet, "/healthz", "", ""), http.StatusOK)
}

func TestDefaultReadinessPingsTheDatabase(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	srv, err := New(Config{Open: true, Logger: slog.New(slog.DiscardHandler)},
		Deps{Store: store.New(pool), Tools: testTools(t), Operations: &fakeOperations{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ready(context.Background()); err != nil {
		t.Fatalf("ready with a live database: %v", err)
	}
	pool.Close()
	if err := srv.ready(context.Background()); err == nil {
		t.Fatal("ready with a closed pool")
	}
}

func TestMetricsAndOpenAPIEndpoints(t *testing.T) {
	t.Parallel()
	prom := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, "# HELP up\nup 1\n")
	})
	f := setup(t, func(_ *Config, d *Deps) { d.Metrics = prom })
	r := f.do(t, http.MethodGet, "/metrics", "", "")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "up 1") {
		t.Fatalf("metrics: %d %s", r.status, r.body)
	}
	r = f.do(t, http.MethodGet, "/v1/openapi.json", "", "")
	if r.status != http.StatusOK || string(r.body) != string(OpenAPI) || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("openapi: %d %s", r.status, r.header.Get("Content-Type"))
	}

	none := setup(t)
	wantError(t, none.do(t, http.MethodGet, "/metrics", "", ""), http.StatusNotFound, codeNotFound)

	// Requests are counted and timed by route pattern and status code.
	wantStatus(t, f.post(t, supportToken, "m-1", "inventory.reserve", `{}`), http.StatusAccepted)
	var rm metricdata.ResourceMetrics
	if err := f.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	wantAttrs := attribute.NewSet(semconv.HTTPMethod.String("POST"), semconv.HTTPRoute.String("/v1/intents"), semconv.HTTPStatusCode.Int(202))
	var counted, timed bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					if m.Name == "effectline.http.requests" && dp.Attributes.Equals(&wantAttrs) && dp.Value == 1 {
						counted = true
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					if m.Name == "http.server.request.duration" && dp.Attributes.Equals(&wantAttrs) && dp.Count == 1 {
						timed = true
					}
				}
			}
		}
	}
	if !counted || !timed {
		t.Fatalf("request metrics: counted %v timed %v in %+v", counted, timed, rm.ScopeMetrics)
	}
}

func TestAccessLevelsAndOpenMode(t *testing.T) {
	t.Parallel()
	whoami := func(w http.ResponseWriter, r *http.Request) {
		name, _ := PrincipalFrom(r.Context())
		writeJSON(w, http.StatusOK, map[string]any{"principal": name, "approver": IsApprover(r.Context())})
	}
	f := setup(t)
	f.srv.HandleFunc("POST /test/approve", whoami, ApproverOnly)
	f.srv.HandleFunc("GET /test/whoami", whoami, Authenticated)

	wantError(t, f.do(t, http.MethodPost, "/test/approve", "", ""), http.StatusUnauthorized, codeUnauthorized)
	wantError(t, f.do(t, http.MethodPost, "/test/approve", billingToken, ""), http.StatusForbidden, codeForbidden)
	r := f.do(t, http.MethodPost, "/test/approve", opsToken, "")
	if r.status != http.StatusOK || r.json(t)["principal"] != "ops" || r.json(t)["approver"] != true {
		t.Fatalf("approver: %d %s", r.status, r.body)
	}
	// The scheme is case-insensitive; a wrong token is not a prefix match.
	r = f.do(t, http.MethodGet, "/test/whoami", "", "", "Authorization", "bearer "+billingToken)
	if r.status != http.StatusOK || r.json(t)["principal"] != "billing-agent" || r.json(t)["approver"] != false {
		t.Fatalf("whoami: %d %s", r.status, r.body)
	}
	wantStatus(t, f.do(t, http.MethodGet, "/test/whoami", billingToken[:len(billingToken)-1], ""), http.StatusUnauthorized)
	wantStatus(t, f.do(t, http.MethodGet, "/test/whoami", "", "", "Authorization", "Basic "+billingToken), http.StatusUnauthorized)

	// Open mode (dev): no token is the dev principal, an approver; a known
	// token is still its principal.
	open := setup(t, func(c *Config, _ *Deps) { c.Open = true; c.Tokens = map[string]string{billingToken: "billing-agent"} })
	open.srv.HandleFunc("POST /test/approve", whoami, ApproverOnly)
	r = open.do(t, http.MethodPost, "/test/approve", "", "")
	if r.status != http.StatusOK || r.json(t)["principal"] != DevPrincipal || r.json(t)["approver"] != true {
		t.Fatalf("open mode: %d %s", r.status, r.body)
	}
	wantStatus(t, open.post(t, "", "dev-1", "inventory.reserve", `{"sku": "a"}`), http.StatusAccepted)
	wantError(t, open.do(t, http.MethodPost, "/test/approve", billingToken, ""), http.StatusForbidden, codeForbidden)
}

func TestPanicsAnswer500(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.srv.HandleFunc("GET /test/panic", func(http.ResponseWriter, *http.Request) { panic("boom") }, Public)
	wantError(t, f.do(t, http.MethodGet, "/test/panic", "", ""), http.StatusInternalServerError, codeInternal)
	wantStatus(t, f.do(t, http.MethodGet, "/healthz", "", ""), http.StatusOK)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	deps := Deps{Store: store.New(pool), Tools: testTools(t), Operations: &fakeOperations{}}
	_, err := New(Config{}, deps)
	if !errors.Is(err, ErrNoTokens) || !strings.Contains(err.Error(), "--insecure-open") {
		t.Fatalf("New without tokens: %v", err)
	}
	if _, err := New(Config{Open: true}, deps); err != nil {
		t.Fatalf("New open: %v", err)
	}
	if _, err := New(Config{Open: true, RequestTimeout: -time.Second}, deps); err == nil {
		t.Fatal("New accepted a negative timeout")
	}
	noTools := deps
	noTools.Tools = nil
	if _, err := New(Config{Open: true}, noTools); err == nil {
		t.Fatal("New accepted missing tools")
	}
	cfg := Config{}.WithDefaults()
	if cfg.Addr != "127.0.0.1:8080" || cfg.MaxBodyBytes != 1<<20 || cfg.TopicPrefix != "effectline." {
		t.Fatalf("defaults = %+v", cfg)
	}
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	got, err := ParseTokens(" billing-agent=t1, ops=t2 ,,ops=t3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got["t1"] != "billing-agent" || got["t2"] != "ops" || got["t3"] != "ops" {
		t.Fatalf("tokens = %v", got)
	}
	if got, err := ParseTokens(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"noequals", "=t1", "name=", "a=tokX,b=tokX", "a=t 1"} {
		_, err := ParseTokens(bad)
		if err == nil {
			t.Errorf("ParseTokens(%q) accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), "tokX") || strings.Contains(err.Error(), "t1") {
			t.Errorf("ParseTokens(%q) error shows a token: %v", bad, err)
		}
	}
	if got := ParseApprovers(" ops , ,lead"); len(got) != 2 || got[0] != "ops" || got[1] != "lead" {
		t.Fatalf("approvers = %v", got)
	}
}

// TestRunServesAndShutsDownGracefully runs the real listener on a free port:
// requests are served, /readyz turns 503 as soon as shutdown begins, and Run
// returns nil once drained.
func TestRunServesAndShutsDownGracefully(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, storedb.New(t))
	srv, err := New(Config{
		Addr: "127.0.0.1:0", Tokens: map[string]string{billingToken: "billing-agent"},
		ShutdownDelay: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, Deps{Store: store.New(pool), Tools: testTools(t), Operations: &fakeOperations{}})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Addr() != "" {
		t.Fatalf("Addr before Listen = %q", srv.Addr())
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr()
	if strings.HasSuffix(base, ":0") {
		t.Fatalf("Addr %q is not the bound port", srv.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	get := func(path string) int {
		res, err := http.Get(base + path)
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := get("/readyz"); s != http.StatusOK {
		t.Fatalf("readyz while running: %d", s)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for get("/readyz") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("readyz did not turn 503 during shutdown")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if s := get("/healthz"); s != 0 {
		t.Fatalf("still serving after Run returned: %d", s)
	}
	if err := srv.Run(context.Background()); err == nil {
		t.Fatal("a second Run succeeded")
	}
}

// TestOpenAPIDocumentsEveryRoute: every route the server registers is in
// api/openapi.json with its method; TestMain checks the status codes the
// tests observed.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	doc, err := loadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi version %q, want 3.1.x", doc.OpenAPI)
	}
	f := setup(t)
	for _, r := range f.srv.Routes() {
		method := r.Method
		if method == "" {
			method = http.MethodGet
		}
		op, ok := doc.Paths[r.Path][strings.ToLower(method)]
		if !ok {
			t.Errorf("%s %s is not documented", method, r.Path)
			continue
		}
		if op.OperationID == "" || len(op.Responses) == 0 {
			t.Errorf("%s %s: no operationId or responses", method, r.Path)
		}
		// Public routes say so (security: []); others inherit bearer auth
		// and must document 401.
		public := op.Security != nil && len(*op.Security) == 0
		if public != (r.Access == Public) {
			t.Errorf("%s %s: documented public=%v, registered %v", method, r.Path, public, r.Access)
		}
		if r.Access != Public {
			if _, ok := op.Responses["401"]; !ok {
				t.Errorf("%s %s: 401 not documented", method, r.Path)
			}
		}
	}
	// The contract's routes other files add are documented too.
	for _, want := range []struct{ method, path string }{
		{"post", "/v1/operations/{key}/decisions"}, {"post", "/v1/webhooks/{source}"}, {"get", "/ui/"},
	} {
		if _, ok := doc.Paths[want.path][want.method]; !ok {
			t.Errorf("%s %s is not documented", want.method, want.path)
		}
	}
}
