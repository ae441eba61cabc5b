package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
)

const workflowTools = `tools:
  - name: inventory.reserve
    effect: compensable
    invoke: {method: POST, url: "URL/effects/reservations", timeout: 3s}
    compensate: {method: POST, url: "URL/effects/release", timeout: 2s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    args_schema:
      type: object
      required: [sku, quantity]
      properties: {sku: {type: string}, quantity: {type: integer, minimum: 1}}
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    args_schema:
      type: object
      required: [amount, currency]
      properties: {amount: {type: integer, minimum: 1}, currency: {enum: [EUR, USD]}, reservation: {type: string}}
  - name: payments.refund
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/refunds", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
  - name: email.send
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/emails", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
workflows:
  - name: order.checkout
    input_schema:
      type: object
      required: [order_id, sku, amount]
      properties: {order_id: {type: string}, sku: {type: string}, amount: {type: integer}}
    steps:
      - name: reserve
        tool: inventory.reserve
        args: {sku: "{{.Input.sku}}", quantity: 1}
      - name: charge
        tool: payments.charge
        args: {amount: "{{.Input.amount}}", currency: EUR, reservation: "{{.Steps.reserve.DownstreamID}}"}
        undo_with: payments.refund
        undo_args: {charge: "{{.Steps.charge.DownstreamID}}", amount: "{{.Input.amount}}"}
      - name: confirm
        tool: email.send
        args: {order: "{{.Input.order_id}}", text: "order {{.Input.order_id}} is confirmed"}
`

// wfCall is one downstream request of a workflow, as the test asserts it.
type wfCall struct{ route, path, key string }

func (c wfCall) String() string { return c.route + " " + c.path + " " + c.key }

type wfHarness struct {
	t    *testing.T
	ctx  context.Context
	base string
	fake *testenv.FakeTool
	hc   *http.Client
}

func (h *wfHarness) do(method, path string, body any) (int, map[string]any) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(h.ctx, method, h.base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func (h *wfHarness) start(id string, input map[string]any) {
	h.t.Helper()
	code, body := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": id, "workflow": "order.checkout", "input": input})
	if code != http.StatusAccepted {
		h.t.Fatalf("start %s: %d %v", id, code, body)
	}
}

// waitStatus polls the run until it has status, and fails on another
// settled status.
func (h *wfHarness) waitStatus(id, status string) map[string]any {
	h.t.Helper()
	var last map[string]any
	ok := waitForSoft(h.ctx, func() bool {
		_, last = h.do("GET", "/v1/workflows/"+id, nil)
		return last["status"] == status
	})
	if !ok {
		h.t.Fatalf("workflow %s did not become %s: %v", id, status, last)
	}
	return last
}

// calls lists the downstream requests made for run id, in order.
func (h *wfHarness) calls(id string) []wfCall {
	var out []wfCall
	for _, r := range h.fake.RequestLog() {
		if strings.HasPrefix(r.IdempotencyKey, "wf:"+id+"/") && r.Route != testenv.RouteReconcile {
			out = append(out, wfCall{r.Route, r.Path, r.IdempotencyKey})
		}
	}
	return out
}

func (h *wfHarness) expectCalls(id string, want ...wfCall) {
	h.t.Helper()
	if got := h.calls(id); !slices.Equal(got, want) {
		h.t.Errorf("workflow %s: downstream requests\n got %v\nwant %v", id, got, want)
	}
}

func inv(path, key string) wfCall { return wfCall{testenv.RouteInvoke, "/effects/" + path, key} }
func rel(key string) wfCall       { return wfCall{testenv.RouteCompensate, "/effects/release", key} }

// TestWorkflowSaga runs the order (reserve → charge → confirm) as the
// declared workflow against the real binary: the happy path, a final
// failure of each step before and after the pivot (the charge), each
// decision after the pivot, and a reused id. The scenarios run one after
// another on one process, each with its own workflow id; the fake's
// scripted faults apply to the requests in the order they come.
func TestWorkflowSaga(t *testing.T) {
	w := newFaultWorld(t, faultWorldOptions{tools: workflowTools})
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := start(t, "effectline (workflows)", w.with(map[string]string{envInsecureOpenAPI: "true", envHTTPAddr: addr}),
		"run", "--components", "relay,executor,projector,reconciler,workflow,api")
	h := &wfHarness{t: t, ctx: untilCtx(t, 5*time.Minute), base: "http://" + addr, fake: w.fake,
		hc: &http.Client{Timeout: 30 * time.Second}}
	waitFor(t, h.ctx, "the API to be ready", func() bool {
		resp, err := h.hc.Get(h.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	defer func() {
		if t.Failed() {
			t.Logf("process output:\n%s", p.output())
		}
	}()
	input := func(order string) map[string]any {
		return map[string]any{"order_id": order, "sku": "sku-1", "amount": 4200}
	}
	fail := testenv.FaultFailBeforeEffect(http.StatusUnprocessableEntity, "")
	ok := testenv.FaultNone

	t.Run("happy path", func(t *testing.T) {
		h.t = t
		h.start("o-happy", input("1"))
		h.waitStatus("o-happy", "completed")
		h.expectCalls("o-happy", inv("reservations", "wf:o-happy/reserve"), inv("charges", "wf:o-happy/charge"),
			inv("emails", "wf:o-happy/confirm"))
		// Typed values: the amount stays a number, the reservation is the
		// first step's downstream id.
		for _, r := range w.fake.RequestLog() {
			if r.IdempotencyKey != "wf:o-happy/charge" {
				continue
			}
			var body map[string]any
			_ = json.Unmarshal(r.Body, &body)
			if body["amount"] != float64(4200) || body["currency"] != "EUR" || !strings.HasPrefix(fmt.Sprint(body["reservation"]), "eff_") {
				t.Errorf("charge body = %s", r.Body)
			}
		}
		if n := w.fake.Effects(); n != 3 {
			t.Errorf("effects = %d, want 3", n)
		}
	})

	t.Run("same id", func(t *testing.T) {
		h.t = t
		if code, body := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": "o-happy", "workflow": "order.checkout", "input": input("1")}); code != http.StatusOK || body["status"] != "completed" {
			t.Errorf("same input: %d %v", code, body)
		}
		if code, body := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": "o-happy", "workflow": "order.checkout", "input": input("2")}); code != http.StatusConflict || body["error"] != "payload_conflict" {
			t.Errorf("other input: %d %v", code, body)
		}
		if code, _ := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": "o-x", "workflow": "order.checkout", "input": map[string]any{"sku": "s"}}); code != http.StatusBadRequest {
			t.Errorf("input missing required members: %d", code)
		}
		if code, _ := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": "o-x", "workflow": "nope", "input": input("3")}); code != http.StatusNotFound {
			t.Errorf("unknown workflow: %d", code)
		}
	})

	t.Run("reserve fails", func(t *testing.T) {
		h.t = t
		w.fake.Script(testenv.RouteInvoke, fail)
		h.start("o-r", input("r"))
		h.waitStatus("o-r", "unwound")
		h.expectCalls("o-r", inv("reservations", "wf:o-r/reserve"))
	})

	t.Run("charge fails", func(t *testing.T) {
		h.t = t
		w.fake.Script(testenv.RouteInvoke, ok, fail)
		h.start("o-c", input("c"))
		h.waitStatus("o-c", "unwound")
		h.expectCalls("o-c", inv("reservations", "wf:o-c/reserve"), inv("charges", "wf:o-c/charge"), rel("wf:o-c/reserve"))
	})

	afterPivot := func(t *testing.T, id string) {
		w.fake.Script(testenv.RouteInvoke, ok, ok, fail)
		h.start(id, input(id))
		rec := h.waitStatus(id, "escalated")
		esc, _ := rec["escalation"].(map[string]any)
		if esc["step"] != "confirm" || fmt.Sprint(esc["steps_done"]) != "[reserve charge]" {
			t.Errorf("escalation = %v", esc)
		}
		// The charge is never undone automatically, nor the reservation.
		h.expectCalls(id, inv("reservations", "wf:"+id+"/reserve"), inv("charges", "wf:"+id+"/charge"), inv("emails", "wf:"+id+"/confirm"))
	}
	decide := func(t *testing.T, id, action string) {
		if code, body := h.do("POST", "/v1/workflows/"+id+"/decisions", map[string]any{"action": action, "note": "test"}); code != http.StatusOK {
			t.Fatalf("%s: %d %v", action, code, body)
		}
	}

	t.Run("confirm fails, retry_step", func(t *testing.T) {
		h.t = t
		afterPivot(t, "o-e1")
		decide(t, "o-e1", "retry_step")
		h.waitStatus("o-e1", "completed")
		h.expectCalls("o-e1", inv("reservations", "wf:o-e1/reserve"), inv("charges", "wf:o-e1/charge"),
			inv("emails", "wf:o-e1/confirm"), inv("emails", "wf:o-e1/confirm~r1"))
	})

	t.Run("confirm fails, unwind", func(t *testing.T) {
		h.t = t
		afterPivot(t, "o-e2")
		decide(t, "o-e2", "unwind")
		rec := h.waitStatus("o-e2", "unwound")
		h.expectCalls("o-e2", inv("reservations", "wf:o-e2/reserve"), inv("charges", "wf:o-e2/charge"),
			inv("emails", "wf:o-e2/confirm"), inv("refunds", "wf:o-e2/charge~undo"), rel("wf:o-e2/reserve"))
		decs, _ := rec["decisions"].([]any)
		if len(decs) != 1 || decs[0].(map[string]any)["approver"] != "dev" {
			t.Errorf("decisions = %v", decs)
		}
	})

	t.Run("confirm fails, abandon", func(t *testing.T) {
		h.t = t
		afterPivot(t, "o-e3")
		decide(t, "o-e3", "abandon")
		h.waitStatus("o-e3", "abandoned")
		if code, _ := h.do("POST", "/v1/workflows/o-e3/decisions", map[string]any{"action": "unwind"}); code != http.StatusConflict {
			t.Errorf("a decision on an abandoned workflow: %d, want 409", code)
		}
		h.expectCalls("o-e3", inv("reservations", "wf:o-e3/reserve"), inv("charges", "wf:o-e3/charge"), inv("emails", "wf:o-e3/confirm"))
	})

	t.Run("list", func(t *testing.T) {
		h.t = t
		code, body := h.do("GET", "/v1/workflows?status=unwound", nil)
		list, _ := body["workflows"].([]any)
		if code != http.StatusOK || len(list) != 3 {
			t.Errorf("unwound workflows: %d, %d of them, want 3", code, len(list))
		}
	})
}
