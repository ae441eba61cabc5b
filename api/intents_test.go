package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
)

const chargeArgs = `{"amount": 1200, "currency": "EUR", "memo": "order 7"}`

func TestPostIntentRecordsTheIntent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	// The caller's trace: the intent must continue it (contract §8).
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	const callerSpan = "00f067aa0ba902b7"
	r := f.post(t, billingToken, "order-7/charge", "payments.charge", chargeArgs,
		"traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	wantStatus(t, r, http.StatusAccepted)
	body := r.json(t)
	if body["operation_key"] != "order-7/charge" || body["status"] != "pending" ||
		body["href"] != "/v1/operations/order-7%2Fcharge" {
		t.Fatalf("202 body = %s", r.body)
	}
	if loc := r.header.Get("Location"); loc != "/v1/operations/order-7%2Fcharge" {
		t.Fatalf("Location = %q", loc)
	}

	op, err := f.store.Load(ctx, "order-7/charge")
	if err != nil {
		t.Fatal(err)
	}
	if op.Tool != "payments.charge" || op.EffectClass != events.Irreversible ||
		op.Principal != "billing-agent" || op.Status != events.StatusPending || op.Seq != 1 {
		t.Fatalf("journaled operation = %+v", op)
	}
	wantHash, _ := events.PayloadHash([]byte(chargeArgs))
	if op.PayloadHash != wantHash {
		t.Fatalf("payload hash %s, want %s", op.PayloadHash, wantHash)
	}

	// The intent is in the outbox for both topics, under the prefix.
	var topics []string
	rows, err := f.store.Pool().Query(ctx, `SELECT topic FROM outbox WHERE operation_key = $1 ORDER BY topic`, "order-7/charge")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var topic string
		if err := rows.Scan(&topic); err != nil {
			t.Fatal(err)
		}
		topics = append(topics, topic)
	}
	if strings.Join(topics, ",") != "effectline.intents,effectline.outcomes" {
		t.Fatalf("outbox topics = %v", topics)
	}

	// The stored traceparent is the server span's, a child of the caller's.
	tp, err := f.store.Traceparent(ctx, "order-7/charge")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tp, "00-"+callerTrace+"-") || strings.Contains(tp, callerSpan) {
		t.Fatalf("stored traceparent %q does not continue trace %s in a new span", tp, callerTrace)
	}
	var server trace.SpanContext
	for _, s := range f.spans.Ended() {
		if s.Name() == "POST /v1/intents" {
			server = s.SpanContext()
			if s.Parent().SpanID().String() != callerSpan || s.SpanKind() != trace.SpanKindServer {
				t.Fatalf("server span parent %s kind %v", s.Parent().SpanID(), s.SpanKind())
			}
		}
	}
	if !server.IsValid() || !strings.Contains(tp, server.SpanID().String()) {
		t.Fatalf("stored traceparent %q is not the server span %v", tp, server.SpanID())
	}
}

func TestPostIntentRepeatedKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const key = "order-8/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)

	// The same args, spelled differently (member order, spacing, number
	// form), are the same request: 202 with the current status, nothing new
	// journaled.
	r := f.post(t, billingToken, key, "payments.charge", `{"memo":"order 7","currency":"EUR","amount":1.2e3}`)
	wantStatus(t, r, http.StatusAccepted)
	if b := r.json(t); b["status"] != "pending" || b["operation_key"] != key {
		t.Fatalf("repeat of a pending key: %s", r.body)
	}
	if n := f.countEvents(t, key); n != 1 {
		t.Fatalf("%d events after a repeat, want 1", n)
	}

	// Other args under the key: 409, nothing journaled.
	wantError(t, f.post(t, billingToken, key, "payments.charge", `{"amount": 1300, "currency": "EUR"}`),
		http.StatusConflict, codePayloadConflict)
	// The same args for another tool are another request too.
	wantError(t, f.post(t, billingToken, key, "inventory.reserve", chargeArgs),
		http.StatusConflict, codePayloadConflict)
	if n := f.countEvents(t, key); n != 1 {
		t.Fatalf("%d events after conflicts, want 1", n)
	}

	// Once completed, a repeat gets the stored record with its result.
	f.complete(t, key, `{"charge_id": "ch_1", "amount": 1200}`)
	r = f.post(t, billingToken, key, "payments.charge", chargeArgs)
	wantStatus(t, r, http.StatusOK)
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatal(err)
	}
	if string(rec["status"]) != `"completed"` || string(rec["downstream_id"]) != `"ch_1"` ||
		string(rec["attempt"]) != "1" {
		t.Fatalf("200 record = %s", r.body)
	}
	var result map[string]any
	if err := json.Unmarshal(rec["result"], &result); err != nil || result["charge_id"] != "ch_1" {
		t.Fatalf("stored result = %s (%v)", rec["result"], err)
	}
	for _, field := range []string{"operation_key", "tool", "effect_class", "payload_hash", "principal",
		"status", "attempt", "lease_until", "result", "downstream_id", "undo_ref", "created_at",
		"updated_at", "last_error_class"} {
		if _, ok := rec[field]; !ok {
			t.Errorf("record lacks %s: %s", field, r.body)
		}
	}
	if n := f.countEvents(t, key); n != 3 {
		t.Fatalf("%d events after a repeat of a completed key, want 3", n)
	}
	// A completed key with other args is still a conflict.
	wantError(t, f.post(t, billingToken, key, "payments.charge", `{"amount": 1, "currency": "USD"}`),
		http.StatusConflict, codePayloadConflict)
}

func TestPostIntentRejectsBadRequests(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config, _ *Deps) { c.MaxBodyBytes = 4 << 10 })
	intent := func(key, toolName, args string) string {
		k, _ := json.Marshal(key)
		return fmt.Sprintf(`{"operation_key": %s, "tool": %q, "args": %s}`, k, toolName, args)
	}
	cases := []struct {
		name        string
		token, body string
		contentType string
		status      int
		code, field string
	}{
		{name: "no token", body: intent("k1", "payments.charge", chargeArgs), status: 401, code: codeUnauthorized},
		{name: "unknown token", token: "tok-nope", body: intent("k1", "payments.charge", chargeArgs), status: 401, code: codeUnauthorized},
		{name: "malformed JSON", token: billingToken, body: `{"operation_key": "k1", "tool":`, status: 400, code: codeInvalidJSON},
		{name: "not an object", token: billingToken, body: `["k1"]`, status: 400, code: codeInvalidRequest},
		{name: "trailing data", token: billingToken, body: intent("k1", "payments.charge", chargeArgs) + `{}`, status: 400, code: codeInvalidJSON},
		{name: "unknown member", token: billingToken, body: `{"operation_key": "k1", "tool": "payments.charge", "args": {}, "priority": 1}`, status: 400, code: codeInvalidRequest, field: "priority"},
		{name: "wrong member type", token: billingToken, body: `{"operation_key": 7, "tool": "payments.charge", "args": {}}`, status: 400, code: codeInvalidRequest, field: "operation_key"},
		{name: "missing operation_key", token: billingToken, body: `{"tool": "payments.charge", "args": {}}`, status: 400, code: codeInvalidRequest, field: "operation_key"},
		{name: "missing tool", token: billingToken, body: `{"operation_key": "k1", "args": {}}`, status: 400, code: codeInvalidRequest, field: "tool"},
		{name: "missing args", token: billingToken, body: `{"operation_key": "k1", "tool": "payments.charge"}`, status: 400, code: codeInvalidRequest, field: "args"},
		{name: "null args", token: billingToken, body: intent("k1", "payments.charge", "null"), status: 400, code: codeInvalidRequest, field: "args"},
		{name: "empty key", token: billingToken, body: intent("", "payments.charge", chargeArgs), status: 400, code: codeInvalidRequest, field: "operation_key"},
		{name: "key too long", token: billingToken, body: intent(strings.Repeat("k", events.MaxOperationKeyBytes+1), "payments.charge", chargeArgs), status: 400, code: codeInvalidRequest, field: "operation_key"},
		{name: "control character in key", token: billingToken, body: intent("k\u0000", "payments.charge", chargeArgs), status: 400, code: codeInvalidRequest, field: "operation_key"},
		{name: "args not an object", token: billingToken, body: intent("k1", "payments.charge", `[1]`), status: 400, code: codeInvalidArgs},
		{name: "invalid arg", token: billingToken, body: intent("k1", "payments.charge", `{"amount": "12", "currency": "EUR"}`), status: 400, code: codeInvalidArgs, field: "/amount"},
		{name: "missing arg", token: billingToken, body: intent("k1", "payments.charge", `{"amount": 12}`), status: 400, code: codeInvalidArgs, field: "/currency"},
		{name: "secret arg not echoed", token: billingToken, body: intent("k1", "payments.charge", `{"amount": 1, "currency": "EUR", "cvv": "73x9"}`), status: 400, code: codeInvalidArgs, field: "/cvv"},
		{name: "duplicate arg member", token: supportToken, body: intent("k1", "inventory.reserve", `{"sku": "a", "sku": "b"}`), status: 400, code: codeInvalidArgs},
		{name: "unknown tool", token: billingToken, body: intent("k1", "payments.refund", chargeArgs), status: 404, code: codeUnknownTool, field: "tool"},
		{name: "principal not allowed", token: supportToken, body: intent("k1", "payments.charge", chargeArgs), status: 403, code: codeForbidden},
		{name: "oversized", token: billingToken, body: intent("k1", "payments.charge", `{"amount": 1, "currency": "EUR", "memo": "`+strings.Repeat("x", 5<<10)+`"}`), status: 413, code: codePayloadTooLarge},
		{name: "not JSON content", token: billingToken, body: intent("k1", "payments.charge", chargeArgs), contentType: "text/plain", status: 415, code: codeUnsupportedMediaType},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.contentType != "" {
				hdr = []string{"Content-Type", c.contentType}
			}
			r := f.do(t, http.MethodPost, "/v1/intents", c.token, c.body, hdr...)
			m := wantError(t, r, c.status, c.code)
			if c.field != "" && m["field"] != c.field {
				t.Fatalf("field %v, want %q: %s", m["field"], c.field, r.body)
			}
			if c.status == http.StatusUnauthorized && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without a Bearer challenge: %q", r.header.Get("WWW-Authenticate"))
			}
			if strings.Contains(string(r.body), "1200") || strings.Contains(string(r.body), "73x9") {
				t.Fatalf("error echoes the request: %s", r.body)
			}
		})
	}
	var n int
	if err := f.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("rejected requests journaled %d events", n)
	}
}

// TestPostIntentConcurrently: many clients at once. Distinct keys all
// commit (sharing group commits); the same key and args from many clients
// make exactly one operation, and every client is told it was accepted.
func TestPostIntentConcurrently(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const n = 50

	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i] = f.post(t, supportToken, fmt.Sprintf("distinct-%02d", i), "inventory.reserve",
				fmt.Sprintf(`{"sku": "sku-%d", "qty": 1}`, i)).status
		})
	}
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusAccepted {
			t.Fatalf("distinct key %d: status %d, want 202", i, s)
		}
	}
	var ops int
	if err := f.store.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM operations WHERE operation_key LIKE 'distinct-%'`).Scan(&ops); err != nil {
		t.Fatal(err)
	}
	if ops != n {
		t.Fatalf("%d operations for %d distinct keys", ops, n)
	}

	bodies := make([]map[string]any, n)
	for i := range n {
		wg.Go(func() {
			r := f.post(t, supportToken, "same-key", "inventory.reserve", `{"sku": "sku-1", "qty": 2}`)
			statuses[i] = r.status
			if r.status == http.StatusAccepted {
				bodies[i] = r.json(t)
			}
		})
	}
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusAccepted || bodies[i]["operation_key"] != "same-key" || bodies[i]["status"] != "pending" {
			t.Fatalf("same key, client %d: status %d body %v", i, s, bodies[i])
		}
	}
	if got := f.countEvents(t, "same-key"); got != 1 {
		t.Fatalf("%d events for one key posted %d times, want exactly 1", got, n)
	}
	var outbox int
	if err := f.store.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM outbox WHERE operation_key = 'same-key'`).Scan(&outbox); err != nil {
		t.Fatal(err)
	}
	if outbox != 2 {
		t.Fatalf("%d outbox rows for one intent, want 2 (intents and outcomes)", outbox)
	}
}

// TestPostIntentRefusesArgsLargerThanAnEvent: a body within MaxBodyBytes
// whose args cannot fit in one journaled event is 413, not a 500 from the
// store.
func TestPostIntentRefusesArgsLargerThanAnEvent(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config, _ *Deps) { c.MaxBodyBytes = 2 * events.MaxEnvelopeBytes })
	args := `{"blob": "` + strings.Repeat("x", events.MaxEnvelopeBytes) + `"}`
	wantError(t, f.post(t, supportToken, "big", "inventory.reserve", args), http.StatusRequestEntityTooLarge, codePayloadTooLarge)
	if n := f.countEvents(t, "big"); n != 0 {
		t.Fatalf("%d events journaled", n)
	}
}
