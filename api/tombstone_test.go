package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// TestPostIntentOfAPrunedOperation: after the operation was pruned to its
// tombstone, the same intent is answered 200 from the tombstone with
// "pruned": true, other args 409, and neither journals anything: the
// operation never runs again.
func TestPostIntentOfAPrunedOperation(t *testing.T) {
	t.Parallel()
	a := newApproval(t) // its tools let another-agent use payments.charge
	f := setup(t, a.option(t), func(c *Config, _ *Deps) { c.Tokens[anotherToken] = "another-agent" })
	ctx := context.Background()
	const key = "order-9/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)
	done := f.complete(t, key, `{"charge_id": "ch_1"}`)
	if _, err := f.store.Pool().Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.PruneSettled(ctx, "payments.charge", time.Now().Add(time.Hour), time.Now(), 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want 1", n, err)
	}

	r := f.post(t, billingToken, key, "payments.charge", `{"memo":"order 7","currency":"EUR","amount":1.2e3}`)
	wantStatus(t, r, http.StatusOK)
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatal(err)
	}
	if string(rec["pruned"]) != "true" || string(rec["status"]) != `"completed"` || string(rec["downstream_id"]) != `"ch_1"` ||
		string(rec["operation_key"]) != `"`+key+`"` || string(rec["tool"]) != `"payments.charge"` ||
		string(rec["payload_hash"]) != `"`+done.PayloadHash+`"` || string(rec["result"]) != "null" {
		t.Fatalf("200 tombstone = %s", r.body)
	}
	var settled time.Time
	if err := json.Unmarshal(rec["settled_at"], &settled); err != nil || !settled.Equal(done.UpdatedAt.Truncate(time.Microsecond)) {
		t.Fatalf("settled_at = %s (%v), want %s", rec["settled_at"], err, done.UpdatedAt)
	}
	for _, field := range []string{"operation_key", "tool", "effect_class", "payload_hash", "principal",
		"status", "attempt", "lease_until", "result", "downstream_id", "undo_ref", "created_at",
		"updated_at", "last_error_class", "seq"} {
		if _, ok := rec[field]; !ok {
			t.Errorf("tombstone record lacks %s: %s", field, r.body)
		}
	}

	wantError(t, f.post(t, billingToken, key, "payments.charge", `{"amount": 1300, "currency": "EUR"}`),
		http.StatusConflict, codePayloadConflict)
	wantError(t, f.post(t, billingToken, key, "inventory.reserve", chargeArgs),
		http.StatusConflict, codePayloadConflict)

	if n := f.countEvents(t, key); n != 0 {
		t.Fatalf("%d events after duplicates of a pruned operation, want 0", n)
	}
	var outbox int
	if err := f.store.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&outbox); err != nil || outbox != 0 {
		t.Fatalf("%d outbox rows (err %v): a duplicate would run again", outbox, err)
	}
	if _, err := f.store.Load(ctx, key); err == nil {
		t.Fatal("the pruned operation is live again")
	}

	// Reading it shows the tombstone too.
	g := f.do(t, http.MethodGet, operationHref(key), billingToken, "")
	wantStatus(t, g, http.StatusOK)
	if b := g.json(t); b["pruned"] != true || b["status"] != string(events.StatusCompleted) {
		t.Fatalf("GET of a pruned operation = %s", g.body)
	}

	// A tombstone is scoped like the live record: another principal learns
	// nothing of it, neither by reading nor by resubmitting its key.
	wantError(t, f.do(t, http.MethodGet, operationHref(key), anotherToken, ""), http.StatusNotFound, codeNotFound)
	dup := f.post(t, anotherToken, key, "payments.charge", chargeArgs)
	wantError(t, dup, http.StatusConflict, codeKeyInUse)
	if strings.Contains(string(dup.body), "ch_1") {
		t.Fatalf("key_in_use tells about the pruned operation: %s", dup.body)
	}
}
