package api

import (
	"net/http"
	"strings"
	"testing"
)

// TestIntentKeyRule: the API applies events.CheckOperationKey to the key as
// sent, before encoding/json could rewrite it, and refuses bodies that mean
// different things to different parsers. Nothing is journaled.
func TestIntentKeyRule(t *testing.T) {
	t.Parallel()
	f := setup(t)
	body := func(key string) string {
		return `{"operation_key":"` + key + `","tool":"payments.charge","args":{"amount":1,"currency":"EUR"}}`
	}
	for _, c := range []struct{ name, body, field string }{
		{"invalid UTF-8", body("k-\xff"), ""},
		{"NUL", body(`k-\u0000`), "operation_key"},
		{"newline", body(`k-\n`), "operation_key"},
		{"DEL", body("k-\x7f"), "operation_key"},
		{"513 bytes", body(strings.Repeat("k", 513)), "operation_key"},
		{"lone surrogate", body(`k-\ud800`), "operation_key"},
		{"empty", body(""), "operation_key"},
		{"duplicate operation_key", `{"operation_key":"k-a","operation_key":"k-b","tool":"payments.charge","args":{"amount":1,"currency":"EUR"}}`, "operation_key"},
		{"duplicate tool", `{"operation_key":"k-c","tool":"x","tool":"payments.charge","args":{"amount":1,"currency":"EUR"}}`, "tool"},
	} {
		r := f.do(t, http.MethodPost, "/v1/intents", billingToken, c.body)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400: %s", c.name, r.status, r.body)
			continue
		}
		if m := r.json(t); c.field != "" && m["field"] != c.field {
			t.Errorf("%s: field %v, want %s", c.name, m["field"], c.field)
		}
	}
	var n int
	if err := f.store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM events`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events journaled (%v), want none", n, err)
	}
	// A surrogate pair is one character, and a key like any other.
	r := f.do(t, http.MethodPost, "/v1/intents", billingToken, body(`k-\ud83d\ude00`))
	wantStatus(t, r, http.StatusAccepted)
}
