package httptool

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

const preconditionTools = `tools:
  - name: payments.refund
    effect: irreversible
    invoke: {method: POST, url: "URL/refunds"}
    precondition:
      url: "URL/orders/{{.Args.order_id}}"
      timeout: 1s
      expect:
        type: object
        required: [status, owner, total]
        properties:
          status: {enum: [paid]}
          owner: {const: "{{.Principal}}"}
          total: {minimum: "{{.Args.amount}}"}
    approval:
      when: {type: object, properties: {amount: {minimum: 10000}}, required: [amount]}
      approvers: 2
`

// TestPrecondition: expect's actions take the call's typed values; a stale
// record or a 404 rejects, any other answer leaves the call unchecked.
func TestPrecondition(t *testing.T) {
	t.Parallel()
	var answer atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answer.Load().([2]string)
		if a[0] == "404" {
			http.Error(w, `{"error":"not_found"}`, http.StatusNotFound)
			return
		}
		if a[0] == "503" {
			http.Error(w, `{"error":"busy"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(a[1]))
	}))
	defer srv.Close()
	reg, err := Parse([]byte(strings.ReplaceAll(preconditionTools, "URL", srv.URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	tl, _ := reg.Get("payments.refund")
	call := tool.Call{OperationKey: "k", DownstreamKey: "k", Principal: "alice", Attempt: 1,
		Args: json.RawMessage(`{"order_id":"o1","amount":500}`)}
	cases := []struct {
		name, status, body string
		verdict            tool.Verdict
		reason             string
	}{
		{"good record", "200", `{"status":"paid","owner":"alice","total":500}`, tool.Passed, ""},
		{"refunded", "200", `{"status":"refunded","owner":"alice","total":500}`, tool.Rejected, "/status"},
		{"other owner", "200", `{"status":"paid","owner":"bob","total":500}`, tool.Rejected, "/owner"},
		{"amount above the total", "200", `{"status":"paid","owner":"alice","total":499}`, tool.Rejected, "/total"},
		{"no such order", "404", ``, tool.Rejected, "404"},
		{"precondition down", "503", ``, tool.Unchecked, "503"},
	}
	for _, c := range cases {
		answer.Store([2]string{c.status, c.body})
		chk, ok := tl.(tool.Checker).Check(context.Background(), call)
		if !ok || chk.Verdict != c.verdict || !strings.Contains(chk.Reason, c.reason) {
			t.Errorf("%s: %+v", c.name, chk)
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal(chk.Evidence, &ev); err != nil || ev["verdict"] != string(c.verdict) ||
			ev["url"] != srv.URL+"/orders/o1" {
			t.Errorf("%s: evidence %s", c.name, chk.Evidence)
		}
		if c.verdict == tool.Passed {
			continue
		}
		r := chk.Result()
		wantKind := events.Final
		if c.verdict == tool.Unchecked {
			wantKind = events.Retryable
		}
		if r.Outcome != events.Failed || r.Kind != wantKind {
			t.Errorf("%s: result %+v", c.name, r)
		}
	}
	if n, ok := tl.Spec().NeedsApproval(json.RawMessage(`{"amount":20000}`)); !ok || n != 2 {
		t.Errorf("a high amount needs 2 approvers, got %d %v", n, ok)
	}
	if _, ok := tl.Spec().NeedsApproval(json.RawMessage(`{"amount":20}`)); ok {
		t.Error("a low amount needs no approval")
	}
}

func TestPreconditionParseErrors(t *testing.T) {
	t.Parallel()
	head := `tools:
  - name: t
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/x"}
`
	for name, c := range map[string]struct{ yaml, want string }{
		"no expect":       {head + "    precondition: {url: \"http://127.0.0.1:9/o\"}\n", "expect: required"},
		"partial action":  {head + "    precondition: {url: \"http://127.0.0.1:9/o\", expect: {const: \"x-{{.Principal}}\"}}\n", "whole string"},
		"unknown field":   {head + "    precondition: {url: \"http://127.0.0.1:9/o\", expect: {const: \"{{.Nope}}\"}}\n", ".Args.<field>"},
		"unknown key":     {head + "    precondition: {url: \"http://127.0.0.1:9/o\", expect: {}, retries: 3}\n", "precondition.retries"},
		"zero approvers":  {head + "    approval: {approvers: 0}\n", "approval.approvers"},
		"bad when":        {head + "    approval: {when: {type: 7}}\n", "approval.when"},
		"approval typo":   {head + "    approval: {approver: 2}\n", "approval.approver"},
		"bad expect type": {head + "    precondition: {url: \"http://127.0.0.1:9/o\", expect: {type: 7}}\n", "invalid JSON Schema"},
	} {
		_, err := Parse([]byte(c.yaml), nil)
		var ce *tool.ConfigError
		if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (want %q)", name, err, c.want)
		}
	}
}
