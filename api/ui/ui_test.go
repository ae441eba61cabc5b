package ui_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
)

// browser is a cookie-keeping client of the UI that does not follow
// redirects, so tests see the 303s. Like fixture.do, it records what it
// observed for the OpenAPI check.
type browser struct {
	f      *fixture
	client *http.Client
}

func newBrowser(t testing.TB, f *fixture) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{f: f, client: &http.Client{
		Jar:           jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (b *browser) do(t testing.TB, method, path string, form url.Values, header ...string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.f.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	_, pattern := routes.Handler(req)
	res, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if m, p, ok := strings.Cut(pattern, " "); ok {
		observe(m, p, res.StatusCode)
	}
	return response{status: res.StatusCode, header: res.Header, body: data}
}

func (b *browser) get(t testing.TB, path string, header ...string) response {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil, header...)
}

func (b *browser) post(t testing.TB, path string, form url.Values, header ...string) response {
	t.Helper()
	return b.do(t, http.MethodPost, path, form, header...)
}

// page checks a 200 HTML page with the UI's security headers and returns
// its body.
func page(t testing.TB, r response) string {
	t.Helper()
	wantStatus(t, r, http.StatusOK)
	wantUIHeaders(t, r)
	if ct := r.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	return string(r.body)
}

func wantUIHeaders(t testing.TB, r response) {
	t.Helper()
	for k, want := range map[string]string{
		"X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "default-src 'self'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
}

func wantRedirect(t testing.TB, r response, to string) {
	t.Helper()
	wantStatus(t, r, http.StatusSeeOther)
	if got := r.header.Get("Location"); got != to {
		t.Fatalf("redirect to %q, want %q", got, to)
	}
	wantUIHeaders(t, r)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t testing.TB, html string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(html)
	if m == nil {
		t.Fatalf("no CSRF field in the page:\n%s", html)
	}
	return m[1]
}

func decisionForm(csrf string, action events.Action, note string) url.Values {
	return url.Values{"csrf": {csrf}, "action": {string(action)}, "note": {note}}
}

func TestUIQueueShowsWaitingOperationsAndNoSecrets(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	const key = "order-3/charge"
	escalated(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	// Unknown-outcome operations wait too; running and settled ones do not.
	op := inProgress(t, f.store, "reserve-1", "inventory.reserve", events.Compensable, `{}`)
	journal(t, f.store, op, "reserve-1", "inventory.reserve", events.Compensable,
		ev{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile}})
	inProgress(t, f.store, "running-1", "payments.charge", events.Irreversible, secretArgs)

	b := newBrowser(t, f)
	html := page(t, b.get(t, "/ui/"))
	for _, want := range []string{
		key, "payments.charge", "irreversible", "escalated", "absent_downstream", "retry", // proposed
		"reserve-1", "needs_reconciliation", "compensable",
		"Record success", "Retry", "Compensate", "Abandon",
		`href="/ui/operations/order-3%2Fcharge"`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the queue does not show %q", want)
		}
	}
	if strings.Contains(html, "running-1") {
		t.Error("the queue lists a running operation")
	}
	if strings.Contains(html, secretCard) || strings.Contains(html, secretCVV) {
		t.Fatal("a secret arg reached the queue")
	}
	if strings.Contains(html, "<script") || strings.Contains(html, "style=") {
		t.Fatal("the page has a script or an inline style the CSP forbids")
	}

	html = page(t, b.get(t, ui.OperationHref(key)))
	for _, want := range []string{
		key, "irreversible", "absent_downstream", "the PSP has no charge under the idempotency key",
		"no charge for this key", // what the downstream showed
		"[redacted]", "gift",     // the request, redacted by the tool's schema
		"intent.recorded", "attempt.started", "attempt.unknown", "reconciliation.resolved", "operation.escalated",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the operation's page does not show %q", want)
		}
	}
	// The escalation's request was given unredacted on purpose (see
	// escalated): neither it, the intent's args nor the history leak.
	if strings.Contains(html, secretCard) || strings.Contains(html, secretCVV) {
		t.Fatal("a secret arg reached the operation's page")
	}
}

func TestUIDecisionCompletesTheOperation(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	const key = "order-4/charge"
	escalated(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	b := newBrowser(t, f)
	csrf := csrfOf(t, page(t, b.get(t, "/ui/")))
	n := f.countEvents(t, key)

	// Without the token, or with another session's, nothing is recorded.
	r := b.post(t, ui.OperationHref(key)+"/decisions", url.Values{"action": {"record_success"}})
	wantStatus(t, r, http.StatusForbidden)
	wantUIHeaders(t, r)
	wantStatus(t, b.post(t, ui.OperationHref(key)+"/decisions", decisionForm(ui.CSRFToken("another-session"), events.ActionRecordSuccess, "")),
		http.StatusForbidden)
	if m := f.countEvents(t, key); m != n {
		t.Fatalf("a refused form appended %d events", m-n)
	}

	r = b.post(t, ui.OperationHref(key)+"/decisions", decisionForm(csrf, events.ActionRecordSuccess, "seen in the PSP"))
	wantRedirect(t, r, ui.OperationHref(key))
	html := page(t, b.get(t, ui.OperationHref(key)))
	if !strings.Contains(html, `data-status="completed"`) || !strings.Contains(html, "Recorded record_success on "+key) {
		t.Fatalf("the page after the decision:\n%s", html)
	}
	if strings.Contains(html, `name="action"`) {
		t.Fatal("a settled operation still offers decisions")
	}
	if op := load(t, f.store, key); op.Status != events.StatusCompleted {
		t.Fatalf("stored status %s", op.Status)
	}
	if d := lastDecision(t, f.store, key); d.Approver != api.DevPrincipal || d.Note != "seen in the PSP" {
		t.Fatalf("decision %+v", d)
	}
	// The message is shown once.
	if html := page(t, b.get(t, ui.OperationHref(key))); strings.Contains(html, "Recorded record_success") {
		t.Fatal("the flash message is shown twice")
	}

	// A second decision (another tab, another approver) is refused with a
	// message, not an error page.
	r = b.post(t, ui.OperationHref(key)+"/decisions", decisionForm(csrf, events.ActionAbandon, ""))
	wantRedirect(t, r, ui.OperationHref(key))
	html = page(t, b.get(t, ui.OperationHref(key)))
	if !strings.Contains(html, "Not recorded: the operation is completed, not waiting for a decision") {
		t.Fatalf("no refusal message:\n%s", html)
	}
	if op := load(t, f.store, key); op.Status != events.StatusCompleted {
		t.Fatalf("stored status %s after a refused decision", op.Status)
	}

	// Compensate of an irreversible effect is refused with the reason; an
	// unknown key sends back to the queue.
	escalated(t, f.store, "c", "payments.charge", events.Irreversible, secretArgs)
	wantRedirect(t, b.post(t, ui.OperationHref("c")+"/decisions", decisionForm(csrf, events.ActionCompensate, "")), ui.OperationHref("c"))
	if html := page(t, b.get(t, ui.OperationHref("c"))); !strings.Contains(html, "only a compensable effect has an undo") {
		t.Fatalf("no reason for the refused compensate:\n%s", html)
	}
	wantRedirect(t, b.post(t, ui.OperationHref("nope")+"/decisions", decisionForm(csrf, events.ActionRetry, "")), "/ui/")
	if html := page(t, b.get(t, "/ui/")); !strings.Contains(html, "no operation with this key") {
		t.Fatal("no message for an unknown key")
	}
}

func TestUILoginFlow(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	escalated(t, f.store, "k1", "payments.charge", events.Irreversible, secretArgs)
	b := newBrowser(t, f)

	// Not signed in: every page sends to the sign-in form.
	wantRedirect(t, b.get(t, "/ui/"), "/ui/login?next=%2Fui%2F")
	wantRedirect(t, b.get(t, "/ui/operations/k1"), "/ui/login?next=%2Fui%2Foperations%2Fk1")
	wantRedirect(t, b.post(t, "/ui/operations/k1/decisions", decisionForm("x", events.ActionRetry, "")), "/ui/login")
	html := page(t, b.get(t, "/ui/login?next=%2Fui%2Foperations%2Fk1"))
	if !strings.Contains(html, `type="password" name="token"`) || !strings.Contains(html, `value="/ui/operations/k1"`) {
		t.Fatalf("sign-in form:\n%s", html)
	}

	// A wrong token is refused, and no cookie is set.
	r := b.post(t, "/ui/login", url.Values{"token": {"tok-wrong"}})
	wantStatus(t, r, http.StatusUnauthorized)
	if !strings.Contains(string(r.body), "not a valid API token") || len(r.header.Values("Set-Cookie")) != 0 {
		t.Fatalf("wrong token: %s %v", r.body, r.header.Values("Set-Cookie"))
	}

	// The approver's token: a cookie only scripts cannot read, sent back to
	// the UI only, never cross-site.
	r = b.post(t, "/ui/login", url.Values{"token": {opsToken}, "next": {"/ui/operations/k1"}})
	wantRedirect(t, r, "/ui/operations/k1")
	cookie := r.header.Get("Set-Cookie")
	for _, want := range []string{"effectline_ui=", "Path=/ui/", "HttpOnly", "SameSite=Strict", "Max-Age="} {
		if !strings.Contains(cookie, want) {
			t.Errorf("session cookie %q lacks %s", cookie, want)
		}
	}
	if strings.Contains(cookie, "Secure") {
		t.Errorf("cookie marked Secure over plain HTTP: %q", cookie)
	}
	html = page(t, b.get(t, "/ui/"))
	if !strings.Contains(html, "ops · approver") || !strings.Contains(html, "k1") {
		t.Fatalf("queue after sign-in:\n%s", html)
	}
	csrf := csrfOf(t, html)
	wantRedirect(t, b.post(t, "/ui/operations/k1/decisions", decisionForm(csrf, events.ActionRecordSuccess, "")), "/ui/operations/k1")
	if d := lastDecision(t, f.store, "k1"); d.Approver != "ops" {
		t.Fatalf("decision recorded as %q", d.Approver)
	}

	// The cookie is the UI's only: the JSON API still wants the header.
	req, _ := http.NewRequest(http.MethodGet, f.url+"/v1/operations/k1", nil)
	req.AddCookie(&http.Cookie{Name: ui.SessionCookie, Value: ui.SessionValue(opsToken)})
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the API accepted the UI's cookie: %d", res.StatusCode)
	}

	// Signing out needs the form's token, then ends the session.
	wantStatus(t, b.post(t, "/ui/logout", url.Values{}), http.StatusForbidden)
	wantRedirect(t, b.post(t, "/ui/logout", url.Values{"csrf": {csrf}}), "/ui/login")
	wantRedirect(t, b.get(t, "/ui/"), "/ui/login?next=%2Fui%2F")
}

func TestUINonApproverSeesButCannotDecide(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	escalated(t, f.store, "k", "payments.charge", events.Irreversible, secretArgs)
	b := newBrowser(t, f)
	wantRedirect(t, b.post(t, "/ui/login", url.Values{"token": {billingToken}}), "/ui/")
	html := page(t, b.get(t, "/ui/"))
	if !strings.Contains(html, "Only approvers record decisions") || strings.Contains(html, `name="action"`) {
		t.Fatalf("non-approver's queue:\n%s", html)
	}
	csrf := csrfOf(t, html) // the sign-out form's
	r := b.post(t, "/ui/operations/k/decisions", decisionForm(csrf, events.ActionRecordSuccess, ""))
	wantStatus(t, r, http.StatusForbidden)
	if op := load(t, f.store, "k"); op.Status != events.StatusEscalated {
		t.Fatalf("a non-approver's form changed the operation: %s", op.Status)
	}
}

func TestUIRefusesCrossSiteForms(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	escalated(t, f.store, "k", "payments.charge", events.Irreversible, secretArgs)
	b := newBrowser(t, f)
	csrf := csrfOf(t, page(t, b.get(t, "/ui/")))
	// Even with a valid token (a page that somehow got it), a browser that
	// says the form came from another site is refused; so is a cross-site
	// sign-in (login CSRF), which has no session to tie a token to.
	r := b.post(t, "/ui/operations/k/decisions", decisionForm(csrf, events.ActionRecordSuccess, ""), "Sec-Fetch-Site", "cross-site")
	wantStatus(t, r, http.StatusForbidden)
	wantStatus(t, b.post(t, "/ui/login", url.Values{"token": {opsToken}}, "Origin", "https://evil.example"), http.StatusForbidden)
	if op := load(t, f.store, "k"); op.Status != events.StatusEscalated {
		t.Fatalf("a cross-site form changed the operation: %s", op.Status)
	}
	// An oversized form is refused before anything reads it.
	big := decisionForm(csrf, events.ActionRetry, strings.Repeat("n", ui.FormMaxBytes))
	wantStatus(t, b.post(t, "/ui/operations/k/decisions", big), http.StatusRequestEntityTooLarge)
}

func TestUISecureCookieBehindTLS(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t)
	b := newBrowser(t, f)
	r := b.post(t, "/ui/login", url.Values{"token": {opsToken}}, "X-Forwarded-Proto", "https")
	wantStatus(t, r, http.StatusSeeOther)
	if c := r.header.Get("Set-Cookie"); !strings.Contains(c, "Secure") {
		t.Fatalf("cookie over TLS is not Secure: %q", c)
	}
}

func TestUIPagesAndAssets(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	b := newBrowser(t, f)
	if html := page(t, b.get(t, "/ui/")); !strings.Contains(html, "Nothing is waiting for a decision") {
		t.Fatalf("empty queue:\n%s", html)
	}
	r := b.get(t, ui.CSSURL)
	wantStatus(t, r, http.StatusOK)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/css") || !strings.Contains(string(r.body), ".queue") {
		t.Fatalf("stylesheet: %s", ct)
	}
	wantStatus(t, b.get(t, "/ui/static/nope.js"), http.StatusNotFound)
	r = b.get(t, "/ui/nowhere")
	wantStatus(t, r, http.StatusNotFound)
	wantUIHeaders(t, r)
	wantStatus(t, b.get(t, "/ui/operations/nope"), http.StatusNotFound)
	if html := page(t, b.get(t, "/ui/login")); !strings.Contains(html, "runs open") {
		t.Fatal("the sign-in page of an open server does not say it needs no token")
	}
}

// A token may hold bytes a cookie value cannot; the session still works.
func TestUILoginWithTokenOfAnyBytes(t *testing.T) {
	t.Parallel()
	const odd = `tok;"odd"\ä-long-enough`
	f, _ := setupApproval(t, func(c *api.Config, _ *api.Deps) {
		c.Tokens[odd] = "ops"
	})
	b := newBrowser(t, f)
	wantRedirect(t, b.post(t, "/ui/login", url.Values{"token": {odd}}), "/ui/")
	if html := page(t, b.get(t, "/ui/")); !strings.Contains(html, "ops · approver") {
		t.Fatalf("not signed in with the odd token:\n%s", html)
	}
}
