package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/effectline/effectline/events"
)

func decisionPath(key string) string { return "/v1/operations/" + url.PathEscape(key) + "/decisions" }

func TestDecisionIsRecordedAsTheAuthenticatedApprover(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	const key = "order-1/charge"
	escalated(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)

	r := f.do(t, http.MethodPost, decisionPath(key), opsToken,
		`{"action": "record_success", "note": "charge visible in the PSP dashboard"}`)
	wantStatus(t, r, http.StatusOK)
	var rec struct {
		OperationKey string         `json:"operation_key"`
		Status       string         `json:"status"`
		Args         map[string]any `json:"args"`
	}
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.OperationKey != key || rec.Status != "completed" {
		t.Fatalf("record = %s", r.body)
	}
	if rec.Args["card_number"] != "[redacted]" || strings.Contains(string(r.body), secretCard) {
		t.Fatalf("the answer leaks args: %s", r.body)
	}
	if op := load(t, f.store, key); op.Status != events.StatusCompleted {
		t.Fatalf("stored status %s", op.Status)
	}
	d := lastDecision(t, f.store, key)
	if d.Action != events.ActionRecordSuccess || d.Approver != "ops" || d.Note != "charge visible in the PSP dashboard" {
		t.Fatalf("decision = %+v", d)
	}
}

func TestDecisionApproverComesFromTheTokenNotTheBody(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	escalated(t, f.store, "k", "payments.charge", events.Irreversible, secretArgs)
	wantError(t, f.do(t, http.MethodPost, decisionPath("k"), opsToken,
		`{"action": "abandon", "approver": "someone-else"}`), http.StatusBadRequest, codeInvalidRequest, "approver")
	wantStatus(t, f.do(t, http.MethodPost, decisionPath("k"), opsToken, `{"action": "abandon"}`), http.StatusOK)
	if d := lastDecision(t, f.store, "k"); d.Approver != "ops" || d.Action != events.ActionAbandon {
		t.Fatalf("decision = %+v", d)
	}
	if op := load(t, f.store, "k"); op.Status != events.StatusFailed {
		t.Fatalf("status %s after abandon", op.Status)
	}
}

func TestDecisionErrors(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, func(c *Config, _ *Deps) { c.MaxBodyBytes = 8 << 10 })
	escalated(t, f.store, "charge", "payments.charge", events.Irreversible, secretArgs)
	path := decisionPath("charge")
	tests := []struct {
		name   string
		token  string
		body   string
		header []string
		status int
		code   string
		field  string
	}{
		{"no token", "", `{"action": "retry"}`, nil, http.StatusUnauthorized, codeUnauthorized, ""},
		{"not an approver", billingToken, `{"action": "retry"}`, nil, http.StatusForbidden, codeForbidden, ""},
		{"not json", opsToken, `{"action": `, nil, http.StatusBadRequest, codeInvalidJSON, ""},
		{"no action", opsToken, `{"note": "x"}`, nil, http.StatusBadRequest, codeInvalidRequest, "action"},
		{"unknown action", opsToken, `{"action": "approve"}`, nil, http.StatusBadRequest, codeInvalidRequest, "action"},
		{"action of another type", opsToken, `{"action": 1}`, nil, http.StatusBadRequest, codeInvalidRequest, "action"},
		{"compensate of an irreversible effect", opsToken, `{"action": "compensate"}`, nil,
			http.StatusBadRequest, codeInvalidDecision, ""},
		{"note too long", opsToken, `{"action": "retry", "note": "` + strings.Repeat("n", 5000) + `"}`, nil,
			http.StatusBadRequest, codeInvalidDecision, ""},
		{"too large", opsToken, `{"action": "retry", "note": "` + strings.Repeat("n", 9000) + `"}`, nil,
			http.StatusRequestEntityTooLarge, codePayloadTooLarge, ""},
		{"form post", opsToken, `action=retry`, []string{"Content-Type", "application/x-www-form-urlencoded"},
			http.StatusUnsupportedMediaType, codeUnsupportedMediaType, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do(t, http.MethodPost, path, tt.token, tt.body, tt.header...)
			if tt.field != "" {
				wantError(t, r, tt.status, tt.code, tt.field)
			} else {
				wantError(t, r, tt.status, tt.code)
			}
		})
	}
	// None of them changed the operation.
	if op := load(t, f.store, "charge"); op.Status != events.StatusEscalated {
		t.Fatalf("status %s after refused decisions", op.Status)
	}

	wantError(t, f.do(t, http.MethodPost, decisionPath("no-such-op"), opsToken, `{"action": "retry"}`),
		http.StatusNotFound, codeNotFound)

	// Decided once; a second decision finds it no longer waiting.
	wantStatus(t, f.do(t, http.MethodPost, path, opsToken, `{"action": "retry"}`), http.StatusOK)
	m := wantError(t, f.do(t, http.MethodPost, path, opsToken, `{"action": "abandon"}`), http.StatusConflict, codeNotWaiting)
	if !strings.Contains(m["detail"].(string), "pending") {
		t.Fatalf("409 does not say what the operation is: %v", m)
	}
	// An operation that never waited is refused the same way.
	inProgress(t, f.store, "running", "payments.charge", events.Irreversible, secretArgs)
	wantError(t, f.do(t, http.MethodPost, decisionPath("running"), opsToken, `{"action": "record_success"}`),
		http.StatusConflict, codeNotWaiting)
}

// Two approvers deciding at once record one decision: the other is told
// the operation no longer waits.
func TestConcurrentDecisionsRecordOne(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	escalated(t, f.store, "race", "payments.charge", events.Irreversible, secretArgs)
	actions := []string{"record_success", "abandon", "retry", "record_success"}
	statuses := make([]int, len(actions))
	var wg sync.WaitGroup
	for i, a := range actions {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, f.url+decisionPath("race"), strings.NewReader(`{"action":"`+a+`"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+opsToken)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			statuses[i] = res.StatusCode
		})
	}
	wg.Wait()
	var ok, conflict int
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusConflict:
			conflict++
		}
	}
	if ok != 1 || conflict != len(actions)-1 {
		t.Fatalf("statuses %v: want one 200 and the rest 409", statuses)
	}
	if n := f.countEvents(t, "race"); n != 6 {
		t.Fatalf("%d events, want 5 + one decision", n)
	}
}

func TestDecisionInOpenModeIsDev(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	escalated(t, f.store, "k", "payments.charge", events.Irreversible, secretArgs)
	wantStatus(t, f.do(t, http.MethodPost, decisionPath("k"), "", `{"action": "record_success"}`), http.StatusOK)
	if d := lastDecision(t, f.store, "k"); d.Approver != DevPrincipal {
		t.Fatalf("approver %q, want %q", d.Approver, DevPrincipal)
	}
}

func TestDecisionFailures(t *testing.T) {
	t.Parallel()
	// Without a Decider the route says so rather than pretending.
	f := setup(t)
	r := wantError(t, f.do(t, http.MethodPost, decisionPath("k"), opsToken, `{"action": "retry"}`),
		http.StatusServiceUnavailable, codeUnavailable)
	if !strings.Contains(r["detail"].(string), "no decisions") {
		t.Fatalf("503 detail: %v", r)
	}

	var fail error
	var mu sync.Mutex
	f = setup(t, func(_ *Config, d *Deps) {
		d.Decider = DeciderFunc(func(context.Context, string, events.Action, string, string) (events.Operation, error) {
			mu.Lock()
			defer mu.Unlock()
			return events.Operation{}, fail
		})
	})
	setFail := func(err error) { mu.Lock(); fail = err; mu.Unlock() }

	setFail(errors.New("connection reset by peer"))
	r = wantError(t, f.do(t, http.MethodPost, decisionPath("k"), opsToken, `{"action": "retry"}`),
		http.StatusInternalServerError, codeInternal)
	if strings.Contains(r["detail"].(string), "connection") {
		t.Fatalf("500 leaks the cause: %v", r)
	}
	setFail(context.DeadlineExceeded)
	resp := f.do(t, http.MethodPost, decisionPath("k"), opsToken, `{"action": "retry"}`)
	wantError(t, resp, http.StatusServiceUnavailable, codeUnavailable)
	if resp.header.Get("Retry-After") == "" {
		t.Fatal("503 after a deadline without Retry-After")
	}
}
