package tool

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/effectline/effectline/events"
)

var (
	// errRedirectRefused is what the client's CheckRedirect returns: a tool
	// answers, never redirects, and following a redirect could send the
	// request (and its signature) to a host nobody allowed.
	errRedirectRefused = errors.New("redirect refused")
	// errReplayRefused stops net/http from silently sending a request again
	// after it was written (see HTTPTool.do).
	errReplayRefused = errors.New("connection lost after the request was written; not re-sent")
)

// handshakeError marks a TLS handshake failure seen by the client trace, for
// failures whose error type alone does not say so.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return "tls handshake: " + e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// Classify maps one HTTP exchange to an outcome, exactly as DESIGN §2 says.
// wroteRequest reports whether the whole request was written to the
// connection (httptrace's WroteRequest without an error).
//
// Responses, by status:
//
//	2xx                  Succeeded
//	400, 422             Failed, final   (validation or business rejection)
//	401, 403             Failed, final   (authorization or configuration)
//	404, 409, other 4xx  Failed, final   (the server refused; nothing was done)
//	429                  Failed, retryable, with Retry-After
//	503                  Failed, retryable, with or without Retry-After
//	500, 502, 504        Unknown         (the handler, or a gateway in front of it,
//	other 5xx            Unknown          may have acted before failing)
//	3xx, 1xx, other      Unknown         (a redirect confirms nothing)
//
// Transport errors. Failed, retryable ("never sent") only when the request
// provably did not leave: it was not written, and the error is one that
// happens before any byte goes out (DNS, connection refused, TLS handshake,
// another dial error, a timeout or cancellation before the write). A
// connection reset, an EOF or a timeout once the request was written is
// Unknown: the server may have received it and acted, and only its response
// was lost. An error of any other kind before the write completed is Unknown
// too: part of the request may already be on the wire.
//
// Classify does not read the body; the HTTP tool does (and turns a 2xx whose
// body cannot be read in full into Unknown).
func Classify(resp *http.Response, err error, wroteRequest bool) Result {
	if err != nil {
		r := classifyError(err, wroteRequest)
		if resp != nil {
			r.StatusCode = resp.StatusCode
		}
		return r
	}
	if resp == nil {
		return unknown("no_response", errors.New("no response and no error"))
	}
	return classifyStatus(resp, time.Now())
}

func classifyStatus(resp *http.Response, now time.Time) Result {
	code := resp.StatusCode
	class := "http_" + strconv.Itoa(code)
	statusErr := fmt.Errorf("downstream answered %s", statusText(code))
	var r Result
	switch {
	case code >= 200 && code <= 299:
		r = succeeded()
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable:
		// The server says it did not take the request on, and when to come
		// back: nothing happened.
		r = failed(events.Retryable, class, statusErr)
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
			r.RetryAfter = d
		}
	case code >= 400 && code <= 499:
		// 400/422 validation or business rules, 401/403 credentials or
		// configuration, 404/409 and the rest: a deliberate refusal that
		// another identical request would meet again.
		r = failed(events.Final, class, statusErr)
	default:
		// 500/502/504 and the rest of 5xx: the handler may have committed
		// the effect before failing, or a gateway may have timed out on a
		// backend that is still working. 3xx (redirects are not followed),
		// 1xx and nonsense statuses confirm nothing either.
		r = unknown(class, statusErr)
	}
	r.StatusCode = code
	return r
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return strconv.Itoa(code) + " " + t
	}
	return strconv.Itoa(code)
}

func classifyError(err error, wrote bool) Result {
	switch {
	case errors.Is(err, errRedirectRefused):
		return unknown("redirect_refused", err)
	case errors.Is(err, errReplayRefused):
		return unknown("connection_lost", err)
	}
	if !wrote {
		if class, ok := neverSent(err); ok {
			return failed(events.Retryable, class, err)
		}
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return unknown("timeout_after_send", err)
	case errors.Is(err, context.Canceled):
		return unknown("canceled_after_send", err)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return unknown("connection_reset", err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return unknown("eof", err)
	}
	return unknown("transport_error", err)
}

// neverSent recognises errors that happen before a request can leave: name
// resolution, connecting, the TLS handshake, or running out of time or being
// cancelled while doing those. It is only consulted when the request was not
// written.
func neverSent(err error) (class string, ok bool) {
	var (
		dnsErr   *net.DNSError
		hsErr    *handshakeError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invErr   x509.CertificateInvalidError
		opErr    *net.OpError
		netErr   net.Error
	)
	switch {
	case errors.As(err, &dnsErr):
		return "dns", true
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused", true
	case errors.As(err, &hsErr), errors.As(err, &recErr), errors.As(err, &alertErr),
		errors.As(err, &certErr), errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &invErr):
		return "tls_handshake", true
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout_before_send", true
	case errors.Is(err, context.Canceled):
		return "canceled_before_send", true
	case errors.As(err, &opErr) && (opErr.Op == "dial" || opErr.Op == "proxyconnect"):
		return "dial", true
	}
	return "", false
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3). A date in the past means "now".
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(365*24*time.Hour/time.Second) { // absurd: cap, never overflow
			secs = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// withBody adds the response body to a classified Result. body holds at most
// limit+1 bytes; more than limit means the response was cut short.
//
// Only a 2xx depends on the body: its body is the result duplicates are
// answered with, so a 2xx whose body could not be read in full is Unknown
// (the effect happened, but nothing storable says what it was). For other
// statuses the status line has already decided and the body is diagnostic.
func withBody(r Result, body []byte, readErr error, limit int64, idField string) Result {
	tooLarge := int64(len(body)) > limit
	if tooLarge {
		body = body[:limit]
	}
	if r.Outcome == events.Succeeded {
		switch {
		case tooLarge:
			u := unknown("response_too_large", fmt.Errorf("response body exceeds %d bytes", limit))
			u.StatusCode = r.StatusCode
			return u
		case readErr != nil:
			u := classifyError(fmt.Errorf("reading response body: %w", readErr), true)
			u.StatusCode = r.StatusCode
			return u
		}
	}
	if tooLarge || readErr != nil {
		return r // diagnostic only; a truncated body is not worth keeping
	}
	r.Body = asJSON(body)
	if r.Outcome == events.Succeeded {
		r.DownstreamID = idFrom(r.Body, idField)
	}
	return r
}

// asJSON returns body if it is JSON, else body as a JSON string; empty is nil.
func asJSON(body []byte) json.RawMessage {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if json.Valid(body) {
		return json.RawMessage(append([]byte(nil), body...))
	}
	s, _ := json.Marshal(string(body)) // invalid UTF-8 becomes U+FFFD
	return s
}

// idFrom reads a top-level string or number field from a JSON object.
func idFrom(body json.RawMessage, field string) string {
	if field == "" || len(body) == 0 || body[0] != '{' {
		return ""
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	raw, ok := obj[field]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}
