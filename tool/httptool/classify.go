package httptool

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/effectline/effectline/tool"
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

// Classify maps one HTTP exchange to an outcome, exactly as contract §2 says.
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
func Classify(resp *http.Response, err error, wroteRequest bool) tool.Result {
	if err != nil {
		r := classifyError(err, wroteRequest)
		if resp != nil {
			r.StatusCode = resp.StatusCode
		}
		return r
	}
	if resp == nil {
		return tool.UnknownResult("no_response", errors.New("no response and no error"))
	}
	return classifyStatus(resp, time.Now())
}

func classifyStatus(resp *http.Response, now time.Time) tool.Result {
	code := resp.StatusCode
	class := "http_" + strconv.Itoa(code)
	statusErr := fmt.Errorf("downstream answered %s", statusText(code))
	var r tool.Result
	switch {
	case code >= 200 && code <= 299:
		r = tool.SucceededResult()
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable:
		// The server says it did not take the request on, and when to come
		// back: nothing happened.
		r = tool.FailedResult(events.Retryable, class, statusErr)
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
			r.RetryAfter = d
		}
	case code >= 400 && code <= 499:
		// 400/422 validation or business rules, 401/403 credentials or
		// configuration, 404/409 and the rest: a deliberate refusal that
		// another identical request would meet again.
		r = tool.FailedResult(events.Final, class, statusErr)
	default:
		// 500/502/504 and the rest of 5xx: the handler may have committed
		// the effect before failing, or a gateway may have timed out on a
		// backend that is still working. 3xx (redirects are not followed),
		// 1xx and nonsense statuses confirm nothing either.
		r = tool.UnknownResult(class, statusErr)
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

func classifyError(err error, wrote bool) tool.Result {
	switch {
	case errors.Is(err, errRedirectRefused):
		return tool.UnknownResult("redirect_refused", err)
	case errors.Is(err, errReplayRefused):
		return tool.UnknownResult("connection_lost", err)
	}
	if !wrote {
		if class, ok := neverSent(err); ok {
			return tool.FailedResult(events.Retryable, class, err)
		}
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return tool.UnknownResult("timeout_after_send", err)
	case errors.Is(err, context.Canceled):
		return tool.UnknownResult("canceled_after_send", err)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return tool.UnknownResult("connection_reset", err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return tool.UnknownResult("eof", err)
	}
	return tool.UnknownResult("transport_error", err)
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
func withBody(r tool.Result, body []byte, readErr error, limit int64, idField string) tool.Result {
	tooLarge := int64(len(body)) > limit
	if tooLarge {
		body = body[:limit]
	}
	if r.Outcome == events.Succeeded {
		switch {
		case tooLarge:
			u := tool.UnknownResult("response_too_large", fmt.Errorf("response body exceeds %d bytes", limit))
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
	r.Body = tool.JSONBody(body)
	if r.Outcome == events.Succeeded {
		r.DownstreamID = tool.BodyField(r.Body, idField)
	}
	return r
}
