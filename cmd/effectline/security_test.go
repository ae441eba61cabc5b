package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// secTools: a charge whose downstream (the fake tool) echoes every arg in
// its answer, the same charge behind an approval gate (its evidence goes to
// effectline.escalations), and a tool with an arg in a URL path segment.
const secTools = `tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    args_schema:
      type: object
      properties:
        cvv: {type: string, writeOnly: true}
  - name: payments.gated
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/gated", timeout: 3s}
    requires_approval: true
    args_schema:
      type: object
      properties:
        memo: {type: string, x-sensitive: true}
  - name: orders.touch
    effect: idempotent
    invoke: {method: POST, url: "URL/effects/orders/{{.Args.order}}", timeout: 3s}
`

const (
	secCard = "4111111111111111"
	secCVV  = "cvv-98765"
	secMemo = "memo-secret-gift"
)

type secClient struct {
	base string
	hc   *http.Client
}

func (c secClient) do(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestSecurityEndToEnd runs the real binary and checks, from outside:
// sensitive args echoed by a downstream reach no read path and no message
// on effectline.outcomes or effectline.escalations; invalid keys and
// ambiguous bodies are 400 with nothing stored or executed; "..", "." and
// "" as a path arg are 400 with no request downstream; and reads are scoped
// by principal over the API and the UI.
func TestSecurityEndToEnd(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	echo := newEchoDownstream(t)
	tools := filepath.Join(t.TempDir(), "sec-tools.yaml")
	if err := os.WriteFile(tools, []byte(strings.ReplaceAll(secTools, "URL", echo.srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	const (
		ownerTok   = "tok-owner-0123456789"
		otherTok   = "tok-other-0123456789"
		opsTok     = "tok-ops-01234567890"
		auditorTok = "tok-auditor-0123456"
	)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	start(t, "effectline (security)", w.with(map[string]string{
		envTools:     tools,
		envHTTPAddr:  addr,
		envAPITokens: "owner=" + ownerTok + ",other=" + otherTok + ",ops=" + opsTok + ",auditor=" + auditorTok,
		envApprovers: "ops",
		envReaders:   "auditor",
	}), "run", "--components", "relay,executor,projector,reconciler,api")
	api := secClient{base: "http://" + addr, hc: &http.Client{Timeout: 30 * time.Second}}
	ctx := untilCtx(t, 3*time.Minute)
	waitFor(t, ctx, "the API to be ready", func() bool {
		res, err := api.hc.Get(api.base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	countEvents := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	intent := func(token, key, toolName, args string) (int, string) {
		k, _ := json.Marshal(key)
		return api.do(t, http.MethodPost, "/v1/intents", token, fmt.Sprintf(`{"operation_key":%s,"tool":%q,"args":%s}`, k, toolName, args))
	}
	// card_number is sensitive by its name everywhere, cvv by the charge's
	// schema (writeOnly) and its name, memo only by the gated tool's schema
	// (x-sensitive).
	secretArgs := fmt.Sprintf(`{"amount":500,"card_number":%q,"cvv":%q,"memo":%q}`, secCard, secCVV, secMemo)
	const key = "sec/charge-1"
	const gated = "sec/gated-1"
	if s, b := intent(ownerTok, key, "payments.charge", secretArgs); s != http.StatusAccepted {
		t.Fatalf("intent: %d %s", s, b)
	}
	if s, b := intent(ownerTok, gated, "payments.gated", secretArgs); s != http.StatusAccepted {
		t.Fatalf("gated intent: %d %s", s, b)
	}
	waitFor(t, ctx, "the charge to complete and the gated one to escalate", func() bool {
		a, _ := st.Load(ctx, key)
		b, _ := st.Load(ctx, gated)
		return a.Status == events.StatusCompleted && b.Status == events.StatusEscalated
	})
	// The downstream did echo the card number: the test means something.
	if op, _ := st.Load(ctx, key); !strings.Contains(echo.answers(), secCard) || !strings.Contains(string(op.Result), "eff_") {
		t.Fatalf("the downstream did not echo the args; result %s", op.Result)
	}

	t.Run("redacted on every way out", func(t *testing.T) {
		reads := map[string]string{}
		_, reads["GET record"] = api.do(t, http.MethodGet, "/v1/operations/"+url.PathEscape(key), ownerTok, "")
		_, reads["GET escalated record"] = api.do(t, http.MethodGet, "/v1/operations/"+url.PathEscape(gated), ownerTok, "")
		waitFor(t, ctx, "the read model to list both", func() bool {
			_, l := api.do(t, http.MethodGet, "/v1/operations", ownerTok, "")
			reads["list"] = l
			return strings.Contains(l, key) && strings.Contains(l, gated)
		})
		var dup int
		dup, reads["duplicate POST"] = intent(ownerTok, key, "payments.charge", secretArgs)
		if dup != http.StatusOK || !strings.Contains(reads["duplicate POST"], "eff_") {
			t.Fatalf("duplicate: %d %s", dup, reads["duplicate POST"])
		}
		ui := uiBrowser(t, api.base, opsTok)
		reads["UI page"] = ui(t, "/ui/operations/"+url.PathEscape(key))
		reads["UI escalated page"] = ui(t, "/ui/operations/"+url.PathEscape(gated))
		reads["UI queue"] = ui(t, "/ui/")
		for _, topic := range []string{"effectline.outcomes", "effectline.escalations"} {
			var all []string
			for _, r := range w.broker.ReadAll(t, topic, 1, 15*time.Second) {
				all = append(all, string(r.Value))
			}
			reads[topic] = strings.Join(all, "\n")
			if !strings.Contains(reads[topic], gated) {
				t.Errorf("%s holds no message of %s", topic, gated)
			}
		}
		for name, body := range reads {
			for _, secret := range []string{secCard, secCVV} {
				if strings.Contains(body, secret) {
					t.Errorf("%s leaks %q:\n%s", name, secret, body)
				}
			}
		}
		// Only the intents topic carries the args whole.
		intents := w.broker.ReadAll(t, "effectline.intents", 2, 15*time.Second)
		whole := false
		for _, r := range intents {
			whole = whole || strings.Contains(string(r.Value), secCard)
		}
		if !whole {
			t.Error("effectline.intents does not carry the args whole")
		}
	})

	t.Run("invalid keys and bodies are 400, nothing stored or run", func(t *testing.T) {
		before, requests := countEvents(), echo.requests()
		body := func(k string) string {
			return `{"operation_key":"` + k + `","tool":"orders.touch","args":{"order":"o-1"}}`
		}
		for name, b := range map[string]string{
			"invalid UTF-8":           body("sec/\xff"),
			"NUL":                     body(`sec/\u0000`),
			"newline":                 body(`sec/\n`),
			"513 bytes":               body(strings.Repeat("k", 513)),
			"duplicate operation_key": `{"operation_key":"sec/a","operation_key":"sec/b","tool":"orders.touch","args":{"order":"o-1"}}`,
		} {
			if s, r := api.do(t, http.MethodPost, "/v1/intents", ownerTok, b); s != http.StatusBadRequest {
				t.Errorf("%s: %d %s, want 400", name, s, r)
			}
		}
		for _, order := range []string{`".."`, `"."`, `""`} {
			if s, r := intent(ownerTok, "sec/path-"+order, "orders.touch", `{"order":`+order+`}`); s != http.StatusBadRequest || !strings.Contains(r, "/order") {
				t.Errorf("path arg %s: %d %s, want 400 on /order", order, s, r)
			}
		}
		if n := countEvents(); n != before {
			t.Errorf("refused intents journaled %d events", n-before)
		}
		if n := echo.requests(); n != requests {
			t.Errorf("refused intents reached the downstream: %d requests", n-requests)
		}
	})

	t.Run("reads scoped by principal", func(t *testing.T) {
		path := "/v1/operations/" + url.PathEscape(key)
		for _, c := range []struct {
			who, token string
			reads      bool
		}{{"owner", ownerTok, true}, {"other", otherTok, false}, {"approver", opsTok, true}, {"reader", auditorTok, true}} {
			s, _ := api.do(t, http.MethodGet, path, c.token, "")
			_, list := api.do(t, http.MethodGet, "/v1/operations", c.token, "")
			page := uiBrowser(t, api.base, c.token)(t, "/ui/operations/"+url.PathEscape(gated))
			queue := uiBrowser(t, api.base, c.token)(t, "/ui/")
			if c.reads {
				if s != http.StatusOK || !strings.Contains(list, key) || !strings.Contains(page, "payments.gated") || !strings.Contains(queue, gated) {
					t.Errorf("%s: GET %d, listed %v, UI page shows it %v, queued %v", c.who, s, strings.Contains(list, key),
						strings.Contains(page, "payments.gated"), strings.Contains(queue, gated))
				}
				continue
			}
			if s != http.StatusNotFound || strings.Contains(list, key) || strings.Contains(page, "payments.gated") || strings.Contains(queue, gated) {
				t.Errorf("%s reads another principal's operation: GET %d, list %s", c.who, s, list)
			}
			ds, db := intent(c.token, key, "payments.charge", secretArgs)
			if ds != http.StatusConflict || !strings.Contains(db, `"key_in_use"`) || strings.Contains(db, "eff_") {
				t.Errorf("%s resubmitting the key: %d %s, want 409 key_in_use", c.who, ds, db)
			}
		}
	})
}

// uiBrowser signs in to the UI with token and returns a page getter.
func uiBrowser(t *testing.T, base, token string) func(t *testing.T, path string) string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	res, err := hc.PostForm(base+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return func(t *testing.T, path string) string {
		res, err := hc.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
}

// echoDownstream answers every call with the request's body echoed, as a
// payment API that returns the charge it made ({"source": {"number": …}})
// would.
type echoDownstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   int
	out []string
}

func newEchoDownstream(t *testing.T) *echoDownstream {
	e := &echoDownstream{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if !json.Valid(body) {
			body = []byte("null")
		}
		e.mu.Lock()
		e.n++
		answer := fmt.Sprintf(`{"id":"eff_%d","status":"done","path":%q,"request":%s}`, e.n, r.URL.Path, body)
		e.out = append(e.out, answer)
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *echoDownstream) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *echoDownstream) answers() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.out, "\n")
}
