package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

func TestGetOperationShowsRecordAndHistoryRedacted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const key = "order-9/charge"
	// card_number is secret by its name, cvv by its schema (writeOnly).
	const card, cvv = "4111111111111111", "737"
	args := fmt.Sprintf(`{"amount": 500, "currency": "USD", "card_number": %q, "cvv": %q, "memo": "gift"}`, card, cvv)
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", args), http.StatusAccepted)

	// Its owner reads it (TestReadsAreScopedByPrincipal has who else may);
	// the key is one path segment.
	path := "/v1/operations/" + url.PathEscape(key)
	r := f.do(t, http.MethodGet, path, billingToken, "")
	wantStatus(t, r, http.StatusOK)
	var rec struct {
		OperationKey string            `json:"operation_key"`
		Status       string            `json:"status"`
		Principal    string            `json:"principal"`
		Args         map[string]any    `json:"args"`
		Events       []events.Envelope `json:"events"`
	}
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.OperationKey != key || rec.Status != "pending" || rec.Principal != "billing-agent" || len(rec.Events) != 1 {
		t.Fatalf("record = %s", r.body)
	}
	if rec.Args["card_number"] != "[redacted]" || rec.Args["cvv"] != "[redacted]" || rec.Args["memo"] != "gift" {
		t.Fatalf("args = %v", rec.Args)
	}

	// The history grows as the executor works; the secret never leaves.
	f.complete(t, key, `{"charge_id": "ch_9"}`)
	r = f.do(t, http.MethodGet, path, billingToken, "")
	wantStatus(t, r, http.StatusOK)
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range rec.Events {
		types = append(types, string(e.Type))
	}
	if rec.Status != "completed" || strings.Join(types, ",") != "intent.recorded,attempt.started,attempt.succeeded" {
		t.Fatalf("record after completion: status %s, events %v", rec.Status, types)
	}
	var intent events.IntentData
	if err := json.Unmarshal(rec.Events[0].Data, &intent); err != nil {
		t.Fatal(err)
	}
	if intent.Principal != "billing-agent" || !strings.Contains(string(intent.Args), `"card_number":"[redacted]"`) {
		t.Fatalf("intent event data = %s", rec.Events[0].Data)
	}
	if strings.Contains(string(r.body), card) || strings.Contains(string(r.body), `"737"`) {
		t.Fatalf("a secret arg left in the response: %s", r.body)
	}
	// The journal itself keeps the args as given: redaction is for readers.
	op, err := f.store.Load(context.Background(), key)
	if err != nil || !strings.Contains(string(op.Args), card) {
		t.Fatalf("journaled args lost the card number: %s %v", op.Args, err)
	}
}

func TestGetOperationWithdrawsArgsOfAnUnregisteredTool(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// An operation journaled for a tool that is no longer registered (here
	// written straight to the store): nothing says which args are secret.
	ev, err := events.New(events.IntentRecorded, "old-op", 1, "legacy.tool", events.Idempotent, 0,
		events.IntentData{Args: json.RawMessage(`{"pin": "1234"}`), Principal: "billing-agent"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Append(context.Background(), store.Append{Events: []events.Envelope{ev}}); err != nil {
		t.Fatal(err)
	}
	r := f.do(t, http.MethodGet, "/v1/operations/old-op", billingToken, "")
	wantStatus(t, r, http.StatusOK)
	if strings.Contains(string(r.body), "1234") || !strings.Contains(string(r.body), `"args":"[redacted]"`) {
		t.Fatalf("args of an unregistered tool: %s", r.body)
	}
}

func TestGetOperationErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	wantError(t, f.do(t, http.MethodGet, "/v1/operations/nope", billingToken, ""), http.StatusNotFound, codeNotFound)
	wantError(t, f.do(t, http.MethodGet, "/v1/operations/nope", "", ""), http.StatusUnauthorized, codeUnauthorized)
	// Routes the mux does not know answer in the same JSON shape.
	wantError(t, f.do(t, http.MethodGet, "/v1/nothing-here", billingToken, ""), http.StatusNotFound, codeNotFound)
	r := f.do(t, http.MethodDelete, "/v1/operations/nope", billingToken, "")
	wantError(t, r, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	if r.header.Get("Allow") == "" {
		t.Fatal("405 without Allow")
	}
}

func TestListOperations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.ops.set(events.ListPage{
		Items: []events.Operation{{
			Key: "a", Tool: "payments.charge", EffectClass: events.Irreversible, Status: events.StatusEscalated,
			Principal: "billing-agent", Attempt: 1, Args: json.RawMessage(`{"card_number": "4111"}`),
			CreatedAt: now, UpdatedAt: now, Seq: 4,
		}},
		NextCursor: "c2",
	}, nil)
	r := f.do(t, http.MethodGet, "/v1/operations?status=escalated&tool=payments.charge&limit=10&cursor=c1", opsToken, "")
	wantStatus(t, r, http.StatusOK)
	if got := f.ops.lastFilter(); got != (events.ListFilter{Status: events.StatusEscalated, Tool: "payments.charge", Limit: 10, Cursor: "c1"}) {
		t.Fatalf("filter = %+v", got)
	}
	var page struct {
		Items      []map[string]any `json:"items"`
		NextCursor string           `json:"next_cursor"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Items[0]["operation_key"] != "a" || page.Items[0]["status"] != "escalated" ||
		page.NextCursor != "c2" {
		t.Fatalf("page = %s", r.body)
	}
	if strings.Contains(string(r.body), "4111") {
		t.Fatalf("list items carry args: %s", r.body)
	}

	// Defaults, and an empty page is an empty list.
	f.ops.set(events.ListPage{}, nil)
	r = f.do(t, http.MethodGet, "/v1/operations", billingToken, "")
	wantStatus(t, r, http.StatusOK)
	// A principal that reads only its own gets a list narrowed to it.
	if got := f.ops.lastFilter(); got != (events.ListFilter{Limit: events.DefaultListLimit, Principal: "billing-agent"}) {
		t.Fatalf("default filter = %+v", got)
	}
	if strings.TrimSpace(string(r.body)) != `{"items":[]}` {
		t.Fatalf("empty page = %s", r.body)
	}

	wantError(t, f.do(t, http.MethodGet, "/v1/operations?status=done", billingToken, ""), http.StatusBadRequest, codeInvalidRequest, "status")
	wantError(t, f.do(t, http.MethodGet, "/v1/operations?limit=0", billingToken, ""), http.StatusBadRequest, codeInvalidRequest, "limit")
	wantError(t, f.do(t, http.MethodGet, "/v1/operations?limit=x", billingToken, ""), http.StatusBadRequest, codeInvalidRequest, "limit")
	wantError(t, f.do(t, http.MethodGet, "/v1/operations", "", ""), http.StatusUnauthorized, codeUnauthorized)

	f.ops.set(events.ListPage{}, fmt.Errorf("decoding cursor: %w", events.ErrInvalidFilter))
	wantError(t, f.do(t, http.MethodGet, "/v1/operations?cursor=zzz", billingToken, ""), http.StatusBadRequest, codeInvalidRequest, "cursor")
	f.ops.set(events.ListPage{}, errors.New("connection refused"))
	wantError(t, f.do(t, http.MethodGet, "/v1/operations", billingToken, ""), http.StatusInternalServerError, codeInternal)
}
