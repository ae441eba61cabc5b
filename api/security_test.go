package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
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

// scopedOperations lists the head table by principal, as the read model
// does with ListFilter.Principal.
func scopedOperations(st *store.Store) Operations {
	return OperationsFunc(func(ctx context.Context, f events.ListFilter) (events.ListPage, error) {
		rows, err := st.Pool().Query(ctx, `SELECT `+store.HeadColumns+` FROM operations
			WHERE ($1 = '' OR status = $1) AND ($2 = '' OR coalesce(principal, record->>'principal') = $2)
			ORDER BY created_at DESC LIMIT $3`, string(f.Status), f.Principal, f.Limit)
		if err != nil {
			return events.ListPage{}, err
		}
		ops, err := store.CollectHeads(rows)
		return events.ListPage{Items: ops}, err
	})
}

const anotherToken = "tok-another-9d4e"

// TestReadsAreScopedByPrincipal: the owner reads its operation; another
// principal gets 404, an empty list, and 409 key_in_use (no record, no
// result) when it submits the key; approvers and readers read all. The UI
// follows the same rule.
func TestReadsAreScopedByPrincipal(t *testing.T) {
	t.Parallel()
	a := newApproval(t)
	f := setup(t, a.option(t), func(c *Config, d *Deps) {
		c.Tokens[anotherToken] = "another-agent"
		c.Readers = []string{"support-agent"}
		d.Operations = scopedOperations(d.Store)
	})
	const key = "order-9/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)
	f.complete(t, key, `{"id":"ch_9","status":"paid"}`)
	href := operationHref(key)

	for _, c := range []struct {
		who   string
		token string
		reads bool
	}{
		{"the owner", billingToken, true},
		{"another principal", anotherToken, false},
		{"an approver", opsToken, true},
		{"a reader", supportToken, true},
	} {
		r := f.do(t, http.MethodGet, href, c.token, "")
		list := f.do(t, http.MethodGet, "/v1/operations", c.token, "")
		wantStatus(t, list, http.StatusOK)
		listed := strings.Contains(string(list.body), key)
		if c.reads {
			wantStatus(t, r, http.StatusOK)
			if !listed {
				t.Errorf("%s does not find the operation in the list: %s", c.who, list.body)
			}
			continue
		}
		wantError(t, r, http.StatusNotFound, codeNotFound)
		if listed || strings.Contains(string(list.body), "ch_9") {
			t.Errorf("%s finds another principal's operation in the list: %s", c.who, list.body)
		}
		// Resubmitting the key, with the same args or others: 409
		// key_in_use, and neither the record nor its result.
		for _, args := range []string{chargeArgs, `{"amount": 1, "currency": "USD"}`} {
			dup := f.post(t, c.token, key, "payments.charge", args)
			wantError(t, dup, http.StatusConflict, codeKeyInUse)
			if strings.Contains(string(dup.body), "ch_9") || strings.Contains(string(dup.body), "billing-agent") {
				t.Errorf("key_in_use tells about the operation: %s", dup.body)
			}
		}
	}
	// The owner's duplicate still gets the stored result.
	dup := f.post(t, billingToken, key, "payments.charge", chargeArgs)
	wantStatus(t, dup, http.StatusOK)

	// The UI: another principal's operation is not found, and not queued.
	esc := "order-9/escalated"
	escalated(t, f.store, esc, "payments.charge", events.Irreversible, secretArgs)
	other := newBrowser(t, f)
	wantRedirect(t, other.post(t, "/ui/login", url.Values{"token": {anotherToken}}), "/ui/")
	if html := page(t, other.get(t, "/ui/")); strings.Contains(html, esc) {
		t.Error("another principal's queue lists the escalated operation")
	}
	if r := other.get(t, uiOperationHref(esc)); r.status != http.StatusNotFound || strings.Contains(string(r.body), "absent_downstream") {
		t.Errorf("another principal's page of the operation: %d", r.status)
	}
	for _, token := range []string{billingToken, supportToken, opsToken} {
		b := newBrowser(t, f)
		wantRedirect(t, b.post(t, "/ui/login", url.Values{"token": {token}}), "/ui/")
		if html := page(t, b.get(t, "/ui/")); !strings.Contains(html, esc) {
			t.Errorf("token %s: the queue does not list the escalated operation", token)
		}
		page(t, b.get(t, uiOperationHref(esc)))
	}
}

// TestEchoedSecretsAreRedactedOnEveryRead: a stored result that echoes
// sensitive args (journaled by a writer that did not scrub it) is served
// redacted by GET, the list, a duplicate's 200 and the UI.
func TestEchoedSecretsAreRedactedOnEveryRead(t *testing.T) {
	t.Parallel()
	a := newApproval(t)
	f := setup(t, a.option(t), func(_ *Config, d *Deps) { d.Operations = scopedOperations(d.Store) })
	const key = "order-10/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", secretArgs), http.StatusAccepted)
	f.complete(t, key, fmt.Sprintf(`{"id":"ch_10","source":{"number":%q,"check":%q},"note":"card %s ok"}`,
		secretCard, secretCVV, secretCard))

	reads := map[string][]byte{
		"GET":       f.do(t, http.MethodGet, operationHref(key), billingToken, "").body,
		"list":      f.do(t, http.MethodGet, "/v1/operations", billingToken, "").body,
		"duplicate": f.post(t, billingToken, key, "payments.charge", secretArgs).body,
	}
	b := newBrowser(t, f)
	wantRedirect(t, b.post(t, "/ui/login", url.Values{"token": {opsToken}}), "/ui/")
	reads["UI"] = []byte(page(t, b.get(t, uiOperationHref(key))))
	for name, body := range reads {
		if !strings.Contains(string(body), "ch_10") {
			t.Errorf("%s does not show the operation: %s", name, body)
		}
		if strings.Contains(string(body), secretCard) || strings.Contains(string(body), secretCVV) {
			t.Errorf("%s leaks a sensitive arg: %s", name, body)
		}
	}
}

// TestConfigRefusesWeakCredentials: a short token and an approver without a
// token are refused at start, with a message naming the principal and never
// the token.
func TestConfigRefusesWeakCredentials(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"one-character token", Config{Tokens: map[string]string{"Z": "billing-agent"}}, "the token of billing-agent is 1 characters; at least 16"},
		{"15 characters", Config{Tokens: map[string]string{"tok-123456789ab": "billing-agent"}}, "is 15 characters"},
		{"approver without a token", Config{Tokens: map[string]string{billingToken: "billing-agent"}, Approvers: []string{"alice"}},
			"EFFECTLINE_APPROVERS names alice, who has no token"},
		{"short token in open mode", Config{Open: true, Tokens: map[string]string{"short": "ops"}}, "at least 16"},
	} {
		_, err := New(c.cfg, Deps{Store: &store.Store{}, Tools: testTools(t), Operations: &fakeOperations{}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error saying %q", c.name, err, c.want)
			continue
		}
		for token := range c.cfg.Tokens {
			if strings.Contains(err.Error(), token) {
				t.Errorf("%s: the error shows the token: %v", c.name, err)
			}
		}
	}
	// Open mode with approvers and no tokens is dev: the approver is dev.
	if _, err := New(Config{Open: true, Approvers: []string{"alice"}}, Deps{Store: &store.Store{}, Tools: testTools(t), Operations: &fakeOperations{}}); err != nil {
		t.Fatalf("open mode: %v", err)
	}
}
