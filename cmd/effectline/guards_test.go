package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// guardTools: a refund guarded by a precondition on the order it refunds,
// a charge that needs two approvers above 10 000, and a payout that always
// needs one (the simple form).
const guardTools = `tools:
  - name: payments.refund
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/refunds", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    precondition:
      method: GET
      url: "URL/orders/{{.Args.order_id}}"
      timeout: 2s
      expect:
        type: object
        required: [status, owner, total]
        properties:
          status: {enum: [paid]}
          owner: {const: "{{.Principal}}"}
          total: {minimum: "{{.Args.amount}}"}
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    approval:
      when: {type: object, required: [amount], properties: {amount: {minimum: 10000}}}
      approvers: 2
  - name: payouts.send
    effect: irreversible
    requires_approval: true
    invoke: {method: POST, url: "URL/effects/payouts", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
`

// Tokens of the guard tests: the agent is an approver too, so that only
// not_requester stands between it and approving its own intents.
var guardTokens = map[string]string{
	"agent": "agent-token-0123456789",
	"alice": "alice-token-0123456789",
	"bob":   "bob-token-0123456789ab",
}

type guardAPI struct {
	base string
	hc   *http.Client
}

type guardAnswer struct {
	status int
	body   map[string]any
	raw    string
}

func (c guardAPI) do(t *testing.T, who, method, path, body string) guardAnswer {
	t.Helper()
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+guardTokens[who])
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := guardAnswer{status: resp.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (c guardAPI) intent(t *testing.T, key, tool, args string) {
	t.Helper()
	a := c.do(t, "agent", http.MethodPost, "/v1/intents", fmt.Sprintf(`{"operation_key":%q,"tool":%q,"args":%s}`, key, tool, args))
	if a.status != http.StatusAccepted {
		t.Fatalf("intent %s: %d %s", key, a.status, a.raw)
	}
}

func (c guardAPI) decide(t *testing.T, who, key, action string) guardAnswer {
	t.Helper()
	return c.do(t, who, http.MethodPost, "/v1/operations/"+url.PathEscape(key)+"/decisions", fmt.Sprintf(`{"action":%q,"note":"checked"}`, action))
}

func guardWait(ctx context.Context, t *testing.T, st *store.Store, key string, ok func(events.Operation) bool) events.Operation {
	t.Helper()
	var op events.Operation
	waitFor(t, ctx, key+" to settle", func() bool {
		var err error
		op, err = st.Load(ctx, key)
		return err == nil && ok(op)
	})
	return op
}

func guardStatus(s events.Status) func(events.Operation) bool {
	return func(op events.Operation) bool { return op.Status == s }
}

func guardRequests(fake *testenv.FakeTool, route, key string) int {
	n := 0
	for _, r := range fake.RequestLog() {
		if r.Route == route && (key == "" || r.IdempotencyKey == key) {
			n++
		}
	}
	return n
}

// TestGuardsEndToEnd runs the binary against a downstream whose records
// change state: preconditions stop stale intents before any mutation,
// approval rules hold the first attempt for distinct approvers who are not
// the requester, and a decision on an operation of unknown outcome asks the
// downstream again before it is carried out.
func TestGuardsEndToEnd(t *testing.T) {
	t.Parallel()
	w := newFaultWorld(t, faultWorldOptions{tools: guardTools})
	st := store.New(testenv.NewPool(t, w.db))
	ctx := untilCtx(t, 4*time.Minute)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	var tokens []string
	for who, tok := range guardTokens {
		tokens = append(tokens, who+"="+tok)
	}
	start(t, "effectline (guards)", w.with(map[string]string{
		envHTTPAddr:  addr,
		envAPITokens: strings.Join(tokens, ","),
		envApprovers: "agent,alice,bob",
	}), "run", "--components", faultComponents+",api")
	api := guardAPI{base: "http://" + addr, hc: &http.Client{Timeout: 30 * time.Second}}
	waitFor(t, ctx, "the API to be ready", func() bool {
		resp, err := api.hc.Get(api.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	t.Run("precondition", func(t *testing.T) {
		fake := w.fake
		fake.SetOrder("o-good", map[string]any{"status": "paid", "owner": "agent", "total": 1000})
		fake.SetOrder("o-refunded", map[string]any{"status": "refunded", "owner": "agent", "total": 1000})
		fake.SetOrder("o-other", map[string]any{"status": "paid", "owner": "mallory", "total": 1000})
		fake.SetOrder("o-small", map[string]any{"status": "paid", "owner": "agent", "total": 499})
		cases := []struct {
			key, order string
			want       events.Status
			reason     string
		}{
			{"refund/good", "o-good", events.StatusCompleted, ""},
			{"refund/refunded", "o-refunded", events.StatusFailed, "/status"},
			{"refund/other-owner", "o-other", events.StatusFailed, "/owner"},
			{"refund/above-total", "o-small", events.StatusFailed, "/total"},
			{"refund/no-order", "o-missing", events.StatusFailed, "404"},
		}
		for _, c := range cases {
			api.intent(t, c.key, "payments.refund", fmt.Sprintf(`{"order_id":%q,"amount":500}`, c.order))
		}
		for _, c := range cases {
			op := guardWait(ctx, t, st, c.key, func(op events.Operation) bool { return op.Status.Terminal() })
			invokes := guardRequests(fake, testenv.RouteInvoke, c.key)
			if op.Status != c.want {
				t.Errorf("%s: %s (%s), want %s", c.key, op.Status, op.LastErrorClass, c.want)
			}
			if c.want == events.StatusCompleted {
				if invokes != 1 || fake.EffectsForKey(c.key) != 1 {
					t.Errorf("%s: %d invokes, %d effects, want one", c.key, invokes, fake.EffectsForKey(c.key))
				}
				continue
			}
			if invokes != 0 || op.LastErrorClass != "precondition_failed" {
				t.Errorf("%s: %d mutations sent, error class %q; want none, precondition_failed", c.key, invokes, op.LastErrorClass)
			}
			// The record shows why: the failed attempt carries the check,
			// its answer and the schema's message.
			rec := api.do(t, "agent", http.MethodGet, "/v1/operations/"+url.PathEscape(c.key), "")
			if rec.status != http.StatusOK || !strings.Contains(rec.raw, `"precondition":{"check":"precondition"`) ||
				!strings.Contains(rec.raw, `"verdict":"rejected"`) || !strings.Contains(rec.raw, c.reason) {
				t.Errorf("%s: the record does not show the precondition's answer: %d %s", c.key, rec.status, rec.raw)
			}
			// The agent's outcome says why, with the schema's message.
			outcome, _ := rec.body["outcome"].(map[string]any)
			if reason, _ := outcome["reason"].(string); outcome["state"] != "failed" ||
				!strings.Contains(reason, "precondition_failed") || !strings.Contains(reason, c.reason) {
				t.Errorf("%s: outcome %v, want failed with precondition_failed and %q", c.key, outcome, c.reason)
			}
		}

		// A precondition that cannot be asked is a retryable failure:
		// nothing was sent, and the mutation runs once it answers.
		fake.SetOrder("o-flaky", map[string]any{"status": "paid", "owner": "agent", "total": 1000})
		fake.Script(testenv.RouteOrder, testenv.FaultFailBeforeEffect(503, ""))
		api.intent(t, "refund/flaky", "payments.refund", `{"order_id":"o-flaky","amount":500}`)
		op := guardWait(ctx, t, st, "refund/flaky", func(op events.Operation) bool { return op.Status.Terminal() })
		if op.Status != events.StatusCompleted || op.Attempt != 2 || guardRequests(fake, testenv.RouteInvoke, "refund/flaky") != 1 {
			t.Errorf("flaky precondition: %s after %d attempts, %d mutations; want completed after 2, one mutation",
				op.Status, op.Attempt, guardRequests(fake, testenv.RouteInvoke, "refund/flaky"))
		}
	})

	t.Run("approval", func(t *testing.T) {
		// The simple form: one approver, never the requester.
		api.intent(t, "payout/1", "payouts.send", `{"to":"acct_1"}`)
		op := guardWait(ctx, t, st, "payout/1", guardStatus(events.StatusEscalated))
		if op.Escalation == nil || op.Escalation.Reason != "approval_required" {
			t.Fatalf("payout/1: %+v", op.Escalation)
		}
		if a := api.decide(t, "agent", "payout/1", "retry"); a.status != http.StatusForbidden || a.body["error"] != "requester_cannot_decide" {
			t.Errorf("self-approval: %d %s, want 403 requester_cannot_decide", a.status, a.raw)
		}
		if a := api.decide(t, "alice", "payout/1", "retry"); a.status != http.StatusOK {
			t.Errorf("alice's approval: %d %s", a.status, a.raw)
		}
		guardWait(ctx, t, st, "payout/1", guardStatus(events.StatusCompleted))
		if n := w.fake.EffectsForKey("payout/1"); n != 1 {
			t.Errorf("payout/1: %d effects", n)
		}

		// when: a small charge runs at once, a large one waits for two.
		api.intent(t, "charge/small", "payments.charge", `{"amount":50}`)
		api.intent(t, "charge/large", "payments.charge", `{"amount":20000}`)
		guardWait(ctx, t, st, "charge/small", guardStatus(events.StatusCompleted))
		op = guardWait(ctx, t, st, "charge/large", guardStatus(events.StatusEscalated))
		if op.Escalation == nil || op.Escalation.Approvers != 2 {
			t.Fatalf("charge/large: %+v", op.Escalation)
		}
		if a := api.decide(t, "alice", "charge/large", "retry"); a.status != http.StatusOK || a.body["status"] != "escalated" {
			t.Errorf("first approval: %d %s, want 200 still escalated", a.status, a.raw)
		}
		if a := api.decide(t, "alice", "charge/large", "retry"); a.status != http.StatusBadRequest {
			t.Errorf("the same approver again: %d %s, want 400", a.status, a.raw)
		}
		time.Sleep(300 * time.Millisecond) // a wrong execution would start at once
		if n := guardRequests(w.fake, testenv.RouteInvoke, "charge/large"); n != 0 {
			t.Fatalf("charge/large ran after one approval: %d invokes", n)
		}
		if a := api.decide(t, "bob", "charge/large", "retry"); a.status != http.StatusOK {
			t.Errorf("second approval: %d %s", a.status, a.raw)
		}
		guardWait(ctx, t, st, "charge/large", guardStatus(events.StatusCompleted))
		if n := w.fake.EffectsForKey("charge/large"); n != 1 {
			t.Errorf("charge/large: %d effects", n)
		}
	})

	t.Run("decision-time re-check", func(t *testing.T) {
		// The charge happens but its answer is a 500, and the downstream
		// cannot tell at first: the reconciler escalates. By the time an
		// approver decides retry, the downstream shows the charge.
		const key = "charge/recheck"
		w.fake.Script(testenv.RouteInvoke, testenv.FaultFailAfterEffect(500))
		for range 50 {
			w.fake.Script(testenv.RouteReconcile, testenv.FaultFailBeforeEffect(503, ""))
		}
		api.intent(t, key, "payments.charge", `{"amount":70}`)
		guardWait(ctx, t, st, key, guardStatus(events.StatusEscalated))
		w.fake.Unscript(testenv.RouteReconcile)
		if n := w.fake.EffectsForKey(key); n != 1 {
			t.Fatalf("%s: %d effects before the decision", key, n)
		}
		a := api.decide(t, "alice", key, "retry")
		if a.status != http.StatusConflict || a.body["error"] != "effect_found" {
			t.Errorf("retry of a charge that happened: %d %s, want 409 effect_found", a.status, a.raw)
		}
		op := guardWait(ctx, t, st, key, guardStatus(events.StatusCompleted))
		if op.DownstreamID == "" {
			t.Errorf("%s: completed without the downstream's id: %+v", key, op)
		}
		if a := api.decide(t, "alice", key, "retry"); a.status != http.StatusConflict {
			t.Errorf("a retry after completion: %d %s", a.status, a.raw)
		}
		time.Sleep(300 * time.Millisecond)
		if n, sent := w.fake.EffectsForKey(key), guardRequests(w.fake, testenv.RouteInvoke, key); n != 1 || sent != 1 {
			t.Errorf("%s: %d charges, %d sent; want one in total", key, n, sent)
		}
	})
}
