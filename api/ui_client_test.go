package api

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
)

// browser is a cookie-keeping client of the approval UI, for the API's own
// tests that check the UI applies the API's read rules (the UI's tests of
// its pages are in package ui).
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

func (b *browser) do(t testing.TB, method, path string, form url.Values) response {
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
	res, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: data}
}

func (b *browser) get(t testing.TB, path string) response { return b.do(t, http.MethodGet, path, nil) }

func (b *browser) post(t testing.TB, path string, form url.Values) response {
	return b.do(t, http.MethodPost, path, form)
}

// page checks a 200 HTML page and returns its body.
func page(t testing.TB, r response) string {
	t.Helper()
	wantStatus(t, r, http.StatusOK)
	if ct := r.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	return string(r.body)
}

func wantRedirect(t testing.TB, r response, to string) {
	t.Helper()
	wantStatus(t, r, http.StatusSeeOther)
	if got := r.header.Get("Location"); got != to {
		t.Fatalf("redirect to %q, want %q", got, to)
	}
}

func uiOperationHref(key string) string { return "/ui/operations/" + url.PathEscape(key) }
