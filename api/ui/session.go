package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// The approval UI's session.
//
// Outside open mode an approver signs in by pasting their API token, which
// the UI keeps (base64url-encoded) in the cookie uiSessionCookie: HttpOnly (no script can read
// it), SameSite=Strict (a cross-site request never carries it), Secure when
// the request came over TLS, and scoped to /ui/. The cookie is accepted by
// the UI routes only; the JSON API keeps requiring the Authorization
// header, so a browser that holds the cookie still cannot be made to call
// the API on its user's behalf.
//
// In open mode everyone is Config.DevPrincipal and the cookie holds a random
// value instead, issued on the first page: it exists only to anchor the
// CSRF token, since a dev server on localhost is exactly what a malicious
// page would post forms to.
//
// CSRF: every UI form carries a hidden token, HMAC-SHA256 keyed by the
// cookie's value, and a POST without the token of its own cookie is
// refused. A cross-site page can neither read the cookie nor the pages, so
// it cannot compute or copy the token; SameSite=Strict and the Origin /
// Sec-Fetch-Site check (http.CrossOriginProtection) are further layers. The
// token needs no server-side key, so it verifies on any replica behind a
// load balancer, and it reveals nothing of the cookie (HMAC is one-way).

const (
	uiSessionCookie = "effectline_ui"
	uiFlashCookie   = "effectline_flash"
	uiCookiePath    = "/ui/"
	// uiSessionMaxAge bounds how long a browser keeps a signed-in token:
	// a working day, so a forgotten tab does not stay signed in for good.
	uiSessionMaxAge = 12 * time.Hour
	// uiFlashMaxAge: a flash message lives across one redirect.
	uiFlashMaxAge = time.Minute
	// uiFormMaxBytes bounds a UI form body: a token or a note and an action.
	uiFormMaxBytes = 64 << 10
	// maxFlashBytes keeps the flash cookie well under the 4 KiB browsers
	// keep per cookie.
	maxFlashBytes = 1024
)

// csrfLabel is the message the CSRF token is the HMAC of; the version lets
// the derivation change without accepting old tokens.
const csrfLabel = "effectline/ui/csrf/v1"

// uiCrossOrigin refuses non-safe browser requests from another origin
// (Sec-Fetch-Site, or Origin against Host). It is the only CSRF defence the
// login form has, since no session exists before it.
var uiCrossOrigin = http.NewCrossOriginProtection()

// uiSession is who is using the UI.
type uiSession struct {
	Principal string
	Approver  bool
	// LoggedIn: signed in with a token (the page offers to sign out), as
	// opposed to open mode's anonymous DevPrincipal.
	LoggedIn bool
	// CSRF is the token the session's forms carry; "" when the session has
	// no cookie yet (a POST from it is refused).
	CSRF string
}

// session returns the request's UI session, or false when the UI must ask
// the user to sign in. In open mode a session always exists, and issue says
// whether to give the browser its cookie now (on page views: a form is
// about to be rendered).
func (s *UI) session(w http.ResponseWriter, r *http.Request, issue bool) (uiSession, bool) {
	var value string
	if c, err := r.Cookie(uiSessionCookie); err == nil {
		value = c.Value
	}
	if token, err := base64.RawURLEncoding.DecodeString(value); err == nil && len(token) > 0 {
		if name, approver, ok := s.server.TokenPrincipal(string(token)); ok {
			return uiSession{Principal: name, Approver: approver, LoggedIn: true, CSRF: csrfToken(value)}, true
		}
	}
	if !s.cfg.Open {
		return uiSession{}, false
	}
	sess := uiSession{Principal: s.cfg.DevPrincipal, Approver: true}
	if value == "" && issue {
		value = rand.Text()
		setSessionCookie(w, r, value)
	}
	if value != "" {
		sess.CSRF = csrfToken(value)
	}
	return sess, true
}

// checkCSRF reports whether a form carries its session's token.
func (sess uiSession) checkCSRF(r *http.Request) bool {
	got := r.PostForm.Get("csrf")
	return sess.CSRF != "" && got != "" && hmac.Equal([]byte(got), []byte(sess.CSRF))
}

func csrfToken(cookieValue string) string {
	m := hmac.New(sha256.New, []byte(cookieValue))
	m.Write([]byte(csrfLabel))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// secureRequest reports whether the browser reached the server over TLS,
// directly or through a proxy that says so. Trusting the proxy's header can
// only make the cookie stricter, never weaker.
func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// sessionValue is the cookie value of a signed-in token: base64url, since
// a token may hold bytes a cookie value cannot (";", "\"", non-ASCII), which
// net/http would silently drop.
func sessionValue(token string) string { return base64.RawURLEncoding.EncodeToString([]byte(token)) }

func setSessionCookie(w http.ResponseWriter, r *http.Request, value string) {
	http.SetCookie(w, &http.Cookie{
		Name: uiSessionCookie, Value: value, Path: uiCookiePath,
		MaxAge: int(uiSessionMaxAge / time.Second), HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secureRequest(r),
	})
}

func clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: "", Path: uiCookiePath, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secureRequest(r),
	})
}

// uiFlash is a message shown once, on the page a form redirects to.
type uiFlash struct {
	// Kind is "ok" or "error" (a CSS class).
	Kind string
	Text string
}

const (
	flashOK    = "ok"
	flashError = "error"
)

// setFlash keeps a message for the next page in a short-lived cookie. A
// cookie rather than a query parameter: a link someone else crafted cannot
// show a made-up "decision recorded".
func setFlash(w http.ResponseWriter, r *http.Request, f uiFlash) {
	text := f.Text
	if len(text) > maxFlashBytes {
		text = strings.ToValidUTF8(text[:maxFlashBytes], "") + "…"
	}
	http.SetCookie(w, &http.Cookie{
		Name: uiFlashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(f.Kind + "\n" + text)),
		Path: uiCookiePath, MaxAge: int(uiFlashMaxAge / time.Second), HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secureRequest(r),
	})
}

// takeFlash returns the pending message, if any, and clears it.
func takeFlash(w http.ResponseWriter, r *http.Request) *uiFlash {
	c, err := r.Cookie(uiFlashCookie)
	if err != nil {
		return nil
	}
	clearCookie(w, r, uiFlashCookie)
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || !utf8.Valid(b) {
		return nil
	}
	kind, text, ok := strings.Cut(string(b), "\n")
	if !ok || (kind != flashOK && kind != flashError) || text == "" {
		return nil
	}
	return &uiFlash{Kind: kind, Text: text}
}

// uiSecurityHeaders are set on every UI response. The pages need nothing
// but their own stylesheet: no scripts, no inline styles, no frames, and
// forms post only back here.
func uiSecurityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
}
