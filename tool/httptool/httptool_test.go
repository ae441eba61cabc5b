package httptool

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// newTool loads a one-tool registry from YAML in which {{BASE}} stands for
// base (a test server's URL) and returns the tool.
func newTool(t *testing.T, base, yml string, env map[string]string) *HTTPTool {
	t.Helper()
	yml = strings.ReplaceAll(yml, "{{BASE}}", base)
	reg, err := Parse([]byte(yml), func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", yml, err)
	}
	names := reg.Names()
	if len(names) != 1 {
		t.Fatalf("want one tool, got %v", names)
	}
	tl, _ := reg.Get(names[0])
	ht := tl.(*HTTPTool)
	t.Cleanup(ht.CloseIdleConnections)
	return ht
}

const echoYAML = `
tools:
  - name: echo
    effect: idempotent
    invoke: {method: POST, url: "{{BASE}}/effects", timeout: 10s}
    reconcile: {url: "{{BASE}}/effects?idempotency_key={{.Key}}", timeout: 10s}
`

// TestInvokeStatuses runs every status class through a real HTTP exchange:
// the server answers with the status named in the args.
func TestInvokeStatuses(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var args struct {
			Status     int    `json:"status"`
			RetryAfter string `json:"retry_after"`
		}
		_ = json.NewDecoder(r.Body).Decode(&args)
		if args.RetryAfter != "" {
			w.Header().Set("Retry-After", args.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(args.Status)
		fmt.Fprintf(w, `{"id":"eff_%d","status":%d}`, args.Status, args.Status)
	}))
	t.Cleanup(srv.Close)
	tl := newTool(t, srv.URL, echoYAML, nil)

	tests := []struct {
		status     int
		retryAfter string
		outcome    events.Outcome
		kind       events.FailureKind
		wantAfter  time.Duration
	}{
		{200, "", events.Succeeded, "", 0},
		{201, "", events.Succeeded, "", 0},
		{400, "", events.Failed, events.Final, 0},
		{401, "", events.Failed, events.Final, 0},
		{403, "", events.Failed, events.Final, 0},
		{404, "", events.Failed, events.Final, 0},
		{409, "", events.Failed, events.Final, 0},
		{422, "", events.Failed, events.Final, 0},
		{429, "1", events.Failed, events.Retryable, time.Second},
		{429, "", events.Failed, events.Retryable, 0},
		{503, "", events.Failed, events.Retryable, 0},
		{503, "2", events.Failed, events.Retryable, 2 * time.Second},
		{500, "", events.Unknown, "", 0},
		{502, "", events.Unknown, "", 0},
		{504, "", events.Unknown, "", 0},
		{507, "", events.Unknown, "", 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%s", tt.status, tt.retryAfter), func(t *testing.T) {
			t.Parallel()
			args := fmt.Sprintf(`{"status":%d,"retry_after":%q}`, tt.status, tt.retryAfter)
			r := tl.Invoke(context.Background(), tool.Call{OperationKey: "op", DownstreamKey: "op", Args: json.RawMessage(args)})
			if r.Outcome != tt.outcome || r.Kind != tt.kind || r.StatusCode != tt.status || r.RetryAfter != tt.wantAfter {
				t.Fatalf("Invoke → %s/%s status %d retry-after %v (%v), want %s/%s %d %v",
					r.Outcome, r.Kind, r.StatusCode, r.RetryAfter, r.Err, tt.outcome, tt.kind, tt.status, tt.wantAfter)
			}
			if tt.outcome == events.Succeeded {
				if r.DownstreamID != fmt.Sprintf("eff_%d", tt.status) || len(r.Body) == 0 {
					t.Fatalf("body %s, downstream id %q", r.Body, r.DownstreamID)
				}
			} else if r.ErrorClass != fmt.Sprintf("http_%d", tt.status) || r.Err == nil {
				t.Fatalf("error class %q, err %v", r.ErrorClass, r.Err)
			}
		})
	}
}

func TestInvokeRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	r := newTool(t, srv.URL, echoYAML, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Failed || r.Kind != events.Retryable || r.RetryAfter < time.Second || r.RetryAfter > 3*time.Second {
		t.Fatalf("429 with an HTTP-date → %s/%s retry-after %v", r.Outcome, r.Kind, r.RetryAfter)
	}
}

// hijackAfterBody reads the whole request, as a server that acted on it
// would, then drops the connection without a response; with reset it sends
// a TCP RST instead of a FIN.
func hijackAfterBody(t *testing.T, w http.ResponseWriter, r *http.Request, reset bool) {
	_, _ = io.Copy(io.Discard, r.Body)
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

func TestInvokeLostResponse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		reset bool
		class string
	}{{"eof", false, "eof"}, {"reset", true, "connection_reset"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hijackAfterBody(t, w, r, tc.reset)
			}))
			t.Cleanup(srv.Close)
			r := newTool(t, srv.URL, echoYAML, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k", Args: json.RawMessage(`{"a":1}`)})
			if r.Outcome != events.Unknown || r.ErrorClass != tc.class {
				t.Fatalf("lost response → %s/%s (%v), want unknown/%s", r.Outcome, r.ErrorClass, r.Err, tc.class)
			}
		})
	}
}

// TestInvokeNoHiddenReplay: net/http re-sends a request carrying an
// Idempotency-Key header when a reused keep-alive connection breaks after
// the write. The tool must not let it: the server sees the request once and
// the caller sees Unknown.
func TestInvokeNoHiddenReplay(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "lose" {
			calls.Add(1)
			hijackAfterBody(t, w, r, false)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"id":"warm"}`)
	}))
	t.Cleanup(srv.Close)
	tl := newTool(t, srv.URL, echoYAML, nil)
	// Warm the pool so the next request goes out on a reused connection.
	if r := tl.Invoke(context.Background(), tool.Call{DownstreamKey: "warm"}); r.Outcome != events.Succeeded {
		t.Fatalf("warm-up: %+v", r)
	}
	r := tl.Invoke(context.Background(), tool.Call{DownstreamKey: "lose", Args: json.RawMessage(`{"a":1}`)})
	if r.Outcome != events.Unknown {
		t.Fatalf("lost response on a reused connection → %s/%s (%v), want unknown", r.Outcome, r.ErrorClass, r.Err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the server received the request %d times, want exactly 1", n)
	}
}

func TestInvokeStalledServer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // until the client gives up
	}))
	t.Cleanup(srv.Close)
	tl := newTool(t, srv.URL, strings.Replace(echoYAML, "timeout: 10s}", "timeout: 150ms}", 1), nil)
	start := time.Now()
	r := tl.Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Unknown || r.ErrorClass != "timeout_after_send" {
		t.Fatalf("stalled server → %s/%s (%v), want unknown/timeout_after_send", r.Outcome, r.ErrorClass, r.Err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the per-tool timeout did not apply: %v", el)
	}
}

func TestInvokeConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := newTool(t, "http://"+addr, echoYAML, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Failed || r.Kind != events.Retryable || r.ErrorClass != "connection_refused" {
		t.Fatalf("closed port → %s/%s/%s (%v), want failed/retryable/connection_refused", r.Outcome, r.Kind, r.ErrorClass, r.Err)
	}
}

func TestInvokeUnresolvableHost(t *testing.T) {
	t.Parallel()
	yml := `
tools:
  - name: nowhere
    effect: irreversible
    invoke: {url: "http://effectline-test.invalid/effects", timeout: 5s}
    allowed_hosts: [effectline-test.invalid]
`
	r := newTool(t, "", yml, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Failed || r.Kind != events.Retryable || r.ErrorClass != "dns" {
		t.Fatalf(".invalid host → %s/%s/%s (%v), want failed/retryable/dns", r.Outcome, r.Kind, r.ErrorClass, r.Err)
	}
}

func TestInvokeTLSHandshakeFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	// The tool does not trust the test server's certificate. The first
	// verification loads the system roots, which is slow under -race: give
	// it time, so that the failure seen is the handshake's.
	r := newTool(t, srv.URL, strings.Replace(echoYAML, "timeout: 10s}", "timeout: 30s}", 1), nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Failed || r.Kind != events.Retryable || r.ErrorClass != "tls_handshake" || calls.Load() != 0 {
		t.Fatalf("untrusted certificate → %s/%s/%s (%v), %d calls", r.Outcome, r.Kind, r.ErrorClass, r.Err, calls.Load())
	}
}

func TestInvokeRedirectRefused(t *testing.T) {
	t.Parallel()
	var followed atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/effects", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) { followed.Store(true) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r := newTool(t, srv.URL, echoYAML, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Unknown || r.ErrorClass != "redirect_refused" || r.StatusCode != 307 || followed.Load() {
		t.Fatalf("redirect → %s/%s status %d followed=%v (%v)", r.Outcome, r.ErrorClass, r.StatusCode, followed.Load(), r.Err)
	}
}

func TestInvokeOversizedResponse(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "reject" {
			w.WriteHeader(http.StatusBadRequest)
		}
		_, _ = io.WriteString(w, `{"id":"x","pad":"`+strings.Repeat("a", 500)+`"}`)
	}))
	t.Cleanup(srv.Close)
	yml := echoYAML + "    max_response_bytes: 100\n"
	tl := newTool(t, srv.URL, yml, nil)
	r := tl.Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Unknown || r.ErrorClass != "response_too_large" || r.StatusCode != 200 {
		t.Fatalf("oversized 200 → %s/%s status %d (%v)", r.Outcome, r.ErrorClass, r.StatusCode, r.Err)
	}
	// A refusal is still a refusal, however long its explanation.
	r = tl.Invoke(context.Background(), tool.Call{DownstreamKey: "reject"})
	if r.Outcome != events.Failed || r.Kind != events.Final {
		t.Fatalf("oversized 400 → %s/%s (%v)", r.Outcome, r.Kind, r.Err)
	}
}

func TestInvokeNonJSONBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "OK then")
	}))
	t.Cleanup(srv.Close)
	r := newTool(t, srv.URL, echoYAML, nil).Invoke(context.Background(), tool.Call{DownstreamKey: "k"})
	if r.Outcome != events.Succeeded || string(r.Body) != `"OK then"` {
		t.Fatalf("text body → %s %s", r.Outcome, r.Body)
	}
}

// recorder is a test server that records requests and answers 200 with an id.
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
	srv  *httptest.Server
}

type recorded struct {
	method, path, rawPath, query string
	header                       http.Header
	body                         []byte
}

func newRecorder(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, recorded{r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Header.Clone(), body})
		rec.mu.Unlock()
		if respond != nil {
			respond(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"id":"eff_1"}`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) last(t *testing.T) recorded {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) == 0 {
		t.Fatal("no request received")
	}
	return rec.reqs[len(rec.reqs)-1]
}

func testSecret(t *testing.T) string {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

func TestSigningHeaders(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, nil)
	secret := testSecret(t)
	yml := `
tools:
  - name: signed
    effect: compensable
    invoke: {url: "{{BASE}}/effects"}
    compensate: {url: "{{BASE}}/effects/release"}
    reconcile: {url: "{{BASE}}/effects?idempotency_key={{.Key}}"}
    signing_secret_env: TOOL_SECRET
`
	tl := newTool(t, rec.srv.URL, yml, map[string]string{"TOOL_SECRET": secret})
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	c := tool.Call{OperationKey: "op", DownstreamKey: "op", DownstreamID: "eff_1", Args: json.RawMessage(`{"sku":"A1"}`)}
	ids := map[string]bool{}
	check := func(what string) {
		t.Helper()
		req := rec.last(t)
		if err := wh.Verify(req.body, req.header); err != nil {
			t.Fatalf("%s: signature does not verify: %v", what, err)
		}
		id := req.header.Get("webhook-id")
		if !strings.HasPrefix(id, "msg_") || ids[id] {
			t.Fatalf("%s: webhook-id %q is not a fresh msg_ id", what, id)
		}
		ids[id] = true
		// A tampered body must not verify.
		if err := wh.Verify(append(req.body, ' '), req.header); err == nil {
			t.Fatalf("%s: a tampered body verified", what)
		}
	}
	if r := tl.Invoke(context.Background(), c); r.Outcome != events.Succeeded {
		t.Fatalf("invoke: %+v", r)
	}
	check("invoke")
	if r := tl.Invoke(context.Background(), c); r.Outcome != events.Succeeded {
		t.Fatalf("invoke again: %+v", r)
	}
	check("invoke again")
	if r := tl.Compensate(context.Background(), c); r.Outcome != events.Succeeded {
		t.Fatalf("compensate: %+v", r)
	}
	check("compensate")
	if rc := tl.Reconcile(context.Background(), c); rc.Answer != tool.Found {
		t.Fatalf("reconcile: %+v", rc)
	}
	check("reconcile")

	// Without a secret there are no signing headers.
	plain := newTool(t, rec.srv.URL, echoYAML, nil)
	plain.Invoke(context.Background(), c)
	if h := rec.last(t).header; h.Get("webhook-signature") != "" || h.Get("webhook-id") != "" {
		t.Fatalf("unsigned tool sent signing headers: %v", h)
	}
}

func TestRequestShape(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, nil)
	yml := `
tools:
  - name: shaped
    effect: compensable
    idempotency_header: X-Request-Key
    invoke: {method: put, url: "{{BASE}}/orders/{{.OperationKey}}/lines?key={{.Key}}&currency={{.Args.currency}}"}
    compensate: {method: POST, url: "{{BASE}}/orders/{{.DownstreamID}}/release"}
    reconcile: {url: "{{BASE}}/orders/{{.DownstreamID}}?idempotency_key={{.Key}}&raw={{.Args.currency | raw}}"}
`
	tl := newTool(t, rec.srv.URL, yml, nil)
	key := "order 7/x~c1&evil=1"
	c := tool.Call{OperationKey: "order 7/x", DownstreamKey: key, DownstreamID: "a/b c?", Args: json.RawMessage(`{"currency":"EUR","amount":12.50}`)}

	if r := tl.Invoke(context.Background(), c); r.Outcome != events.Succeeded {
		t.Fatalf("invoke: %+v", r)
	}
	req := rec.last(t)
	if req.method != http.MethodPut || req.path != "/orders/order 7/x/lines" || req.rawPath != "/orders/order%207%2Fx/lines" {
		t.Fatalf("invoke request line: %s %s (raw %s)", req.method, req.path, req.rawPath)
	}
	q := parseQuery(t, req.query)
	if q["key"] != key || q["currency"] != "EUR" || len(q) != 2 {
		t.Fatalf("invoke query %q decodes to %v, want key=%q", req.query, q, key)
	}
	if req.header.Get("X-Request-Key") != key || req.header.Get("Idempotency-Key") != "" {
		t.Fatalf("idempotency header: %v", req.header)
	}
	if req.header.Get("Content-Type") != "application/json" || string(req.body) != string(c.Args) {
		t.Fatalf("invoke body %q (%s)", req.body, req.header.Get("Content-Type"))
	}

	if r := tl.Compensate(context.Background(), c); r.Outcome != events.Succeeded {
		t.Fatalf("compensate: %+v", r)
	}
	req = rec.last(t)
	if req.method != http.MethodPost || req.rawPath != "/orders/a%2Fb%20c%3F/release" {
		t.Fatalf("compensate request line: %s %s (raw %s)", req.method, req.path, req.rawPath)
	}
	var body map[string]string
	if err := json.Unmarshal(req.body, &body); err != nil || body["idempotency_key"] != key || body["downstream_id"] != "a/b c?" || len(body) != 2 {
		t.Fatalf("compensate body %s", req.body)
	}
	if req.header.Get("X-Request-Key") != key {
		t.Fatalf("compensate key header: %v", req.header)
	}

	if rc := tl.Reconcile(context.Background(), c); rc.Answer != tool.Found || rc.DownstreamID != "eff_1" {
		t.Fatalf("reconcile: %+v", rc)
	}
	req = rec.last(t)
	q = parseQuery(t, req.query)
	if req.method != http.MethodGet || q["idempotency_key"] != key || q["raw"] != "EUR" || len(req.body) != 0 {
		t.Fatalf("reconcile: %s %s?%s body %q", req.method, req.path, req.query, req.body)
	}
}

func parseQuery(t *testing.T, raw string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kv := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(kv, "=")
		dk, err1 := urlQueryUnescape(k)
		dv, err2 := urlQueryUnescape(v)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad query %q", raw)
		}
		if _, dup := out[dk]; dup {
			t.Fatalf("query %q repeats %q: a value broke out of its parameter", raw, dk)
		}
		out[dk] = dv
	}
	return out
}

func TestInvokePreflight(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, nil)
	yml := `
tools:
  - name: guarded
    effect: irreversible
    invoke: {url: "{{BASE}}/charges/{{.Args.account}}"}
    allowed_principals: [billing-agent]
    args_schema:
      type: object
      required: [amount]
      properties: {amount: {type: integer, minimum: 1}}
`
	tl := newTool(t, rec.srv.URL, yml, nil)
	tests := []struct {
		name  string
		call  tool.Call
		class string
	}{
		{"forbidden principal", tool.Call{Principal: "intruder", Args: json.RawMessage(`{"amount":1,"account":"a"}`)}, "forbidden"},
		{"invalid args", tool.Call{Principal: "billing-agent", Args: json.RawMessage(`{"amount":0,"account":"a"}`)}, "invalid_args"},
		{"arg missing for the URL", tool.Call{Principal: "billing-agent", Args: json.RawMessage(`{"amount":1}`)}, "url_template"},
	}
	for _, tt := range tests {
		r := tl.Invoke(context.Background(), tt.call)
		if r.Outcome != events.Failed || r.Kind != events.Final || r.ErrorClass != tt.class {
			t.Errorf("%s → %s/%s/%s (%v)", tt.name, r.Outcome, r.Kind, r.ErrorClass, r.Err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) != 0 {
		t.Fatalf("a rejected call reached the server: %d requests", len(rec.reqs))
	}
}

func TestHostNotAllowedAtRequestTime(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, nil)
	yml := `
tools:
  - name: multi
    effect: idempotent
    invoke: {url: "http://{{.Args.host}}/effects"}
    allowed_hosts: [` + strings.TrimPrefix(rec.srv.URL, "http://") + `]
`
	tl := newTool(t, "", yml, nil)
	ok := tl.Invoke(context.Background(), tool.Call{Args: json.RawMessage(`{"host":"` + strings.TrimPrefix(rec.srv.URL, "http://") + `"}`)})
	if ok.Outcome != events.Succeeded {
		t.Fatalf("allowed host: %+v", ok)
	}
	r := tl.Invoke(context.Background(), tool.Call{Args: json.RawMessage(`{"host":"169.254.169.254"}`)})
	if r.Outcome != events.Failed || r.Kind != events.Final || r.ErrorClass != "host_not_allowed" {
		t.Fatalf("other host → %s/%s/%s (%v)", r.Outcome, r.Kind, r.ErrorClass, r.Err)
	}
}

func TestReconcileAnswers(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("idempotency_key") {
		case "done":
			_, _ = io.WriteString(w, `{"id":"ch_9","status":"done"}`)
		case "absent":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"not_found"}`)
		case "broken":
			w.WriteHeader(http.StatusInternalServerError)
		case "busy":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "forbidden":
			w.WriteHeader(http.StatusForbidden)
		case "lost":
			hijackAfterBody(t, w, r, false)
		case "slow":
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	tl := newTool(t, srv.URL, strings.Replace(echoYAML, `{{.Key}}", timeout: 10s}`, `{{.Key}}", timeout: 150ms}`, 1), nil)
	tests := []struct {
		key    string
		answer tool.Answer
		class  string
	}{
		{"done", tool.Found, ""},
		{"absent", tool.Absent, ""},
		{"broken", tool.CannotTell, "http_500"},
		{"busy", tool.CannotTell, "http_503"},
		{"forbidden", tool.CannotTell, "http_403"},
		{"lost", tool.CannotTell, "eof"},
		{"slow", tool.CannotTell, "timeout_after_send"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			rc := tl.Reconcile(context.Background(), tool.Call{DownstreamKey: tt.key})
			if rc.Answer != tt.answer || rc.ErrorClass != tt.class {
				t.Fatalf("reconcile %s → %s/%s (%v), want %s/%s", tt.key, rc.Answer, rc.ErrorClass, rc.Err, tt.answer, tt.class)
			}
			if tt.answer == tool.Found && (rc.DownstreamID != "ch_9" || !strings.Contains(string(rc.Body), `"done"`)) {
				t.Fatalf("found: %+v", rc)
			}
		})
	}
	// A refused connection cannot tell either.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if rc := newTool(t, "http://"+addr, echoYAML, nil).Reconcile(context.Background(), tool.Call{DownstreamKey: "k"}); rc.Answer != tool.CannotTell || rc.ErrorClass != "connection_refused" {
		t.Fatalf("refused → %+v", rc)
	}
}

func TestNoReconcileOrCompensate(t *testing.T) {
	t.Parallel()
	yml := `
tools:
  - name: bare
    effect: irreversible
    invoke: {url: "http://127.0.0.1:1/effects"}
`
	tl := newTool(t, "", yml, nil)
	if s := tl.Spec(); s.CanReconcile || s.CanCompensate {
		t.Fatalf("spec claims abilities it lacks: %+v", s)
	}
	if rc := tl.Reconcile(context.Background(), tool.Call{}); rc.Answer != tool.CannotTell {
		t.Fatalf("reconcile without a request: %+v", rc)
	}
	if r := tl.Compensate(context.Background(), tool.Call{}); r.Outcome != events.Failed || r.Kind != events.Final {
		t.Fatalf("compensate without a request: %+v", r)
	}
}

func urlQueryUnescape(s string) (string, error) { return url.QueryUnescape(s) }
