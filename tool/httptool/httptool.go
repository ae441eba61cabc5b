package httptool

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Defaults for tools file keys.
const (
	DefaultTimeout          = 10 * time.Second
	DefaultMaxResponseBytes = 1 << 20
)

// endpoint is one of a tool's requests: invoke, compensate or reconcile.
type endpoint struct {
	method  string
	url     *urlTemplate
	timeout time.Duration
}

// HTTPTool is a tool declared in the tools file: it invokes, compensates and
// reconciles over HTTP, signs its requests, and classifies what comes back
// (Classify). Build it with Parse or Load.
type HTTPTool struct {
	spec       tool.Spec
	invoke     endpoint
	compensate *endpoint
	reconcile  *endpoint
	// precondition is checked before every attempt; nil when the tool
	// declares none.
	precondition *precondition

	allowedHosts map[string]bool
	idField      string
	maxBody      int64
	signer       *signer
	client       *http.Client
}

// SigningSecret returns the tool's Standard Webhooks secret, or "" when it
// has none. Inbound callbacks from the tool are verified with the same
// secret its outbound calls are signed with: one secret per tool to rotate.
func (t *HTTPTool) SigningSecret() string {
	if t.signer == nil {
		return ""
	}
	return t.signer.secret
}

var (
	_ tool.Tool        = (*HTTPTool)(nil)
	_ tool.Compensator = (*HTTPTool)(nil)
	_ tool.Reconciler  = (*HTTPTool)(nil)
	_ tool.Checker     = (*HTTPTool)(nil)
)

// newHTTPClient builds the client of one tool.
//
//   - No redirects: CheckRedirect refuses, and the 3xx is Unknown.
//   - No proxy from the environment: a proxy answers for the tool (a 502
//     when the tool is down), which would blur "never sent" into "unknown",
//     and would route signed requests through a host nobody listed.
//   - HTTP/1.1 with a deep idle pool (256 per host), so a busy executor
//     reuses connections to a tool instead of exhausting ephemeral ports.
//   - No timeout on the client: each call has its own context deadline.
func newHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errRedirectRefused
		},
	}
}

// Spec returns the tool's spec.
func (t *HTTPTool) Spec() *tool.Spec { return &t.spec }

// CloseIdleConnections closes the tool's idle keep-alive connections.
func (t *HTTPTool) CloseIdleConnections() { t.client.CloseIdleConnections() }

// Invoke runs one attempt: the args as the JSON body, the downstream key in
// the idempotency header, signed when the tool has a secret.
func (t *HTTPTool) Invoke(ctx context.Context, c tool.Call) tool.Result {
	if r, ok := t.spec.Preflight(c); !ok {
		return r
	}
	body := []byte(c.Args)
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	return t.call(ctx, t.invoke, c, body)
}

// Compensate undoes an attempt: the body names the downstream key and id of
// the attempt being undone, and the same key goes in the idempotency
// header, so the downstream can find the effect (or see there is none) and
// deduplicate a repeated undo.
func (t *HTTPTool) Compensate(ctx context.Context, c tool.Call) tool.Result {
	if t.compensate == nil {
		return tool.FailedResult(events.Final, "not_compensable", fmt.Errorf("tool %q has no compensate request", t.spec.Name))
	}
	body, err := json.Marshal(struct {
		IdempotencyKey string `json:"idempotency_key"`
		DownstreamID   string `json:"downstream_id"`
	}{c.DownstreamKey, c.DownstreamID})
	if err != nil {
		return tool.FailedResult(events.Final, "invalid_request", err)
	}
	return t.call(ctx, *t.compensate, c, body)
}

// Reconcile asks "did the effect for this key happen?" (contract §6): 2xx
// means found (the body is the result), 404 absent, and anything else,
// transport errors and timeouts included, cannot tell.
func (t *HTTPTool) Reconcile(ctx context.Context, c tool.Call) tool.Reconciliation {
	if t.reconcile == nil {
		return tool.Reconciliation{Answer: tool.CannotTell, ErrorClass: "not_reconcilable",
			Err: fmt.Errorf("tool %q has no reconcile request", t.spec.Name)}
	}
	var body []byte
	if m := t.reconcile.method; m != http.MethodGet && m != http.MethodHead && m != http.MethodDelete {
		body = []byte(c.Args)
		if len(bytes.TrimSpace(body)) == 0 {
			body = []byte("{}")
		}
	}
	r := t.call(ctx, *t.reconcile, c, body)
	switch {
	case r.Outcome == events.Succeeded:
		return tool.Reconciliation{Answer: tool.Found, Body: r.Body, DownstreamID: r.DownstreamID}
	case r.Outcome == events.Failed && r.StatusCode == http.StatusNotFound:
		return tool.Reconciliation{Answer: tool.Absent, Body: r.Body}
	}
	return tool.Reconciliation{Answer: tool.CannotTell, Body: r.Body, ErrorClass: r.ErrorClass, Err: r.Err}
}

// call sends one request of endpoint ep and classifies the outcome.
func (t *HTTPTool) call(ctx context.Context, ep endpoint, c tool.Call, body []byte) tool.Result {
	u, err := ep.url.render(c)
	if err != nil {
		return tool.FailedResult(events.Final, "url_template", err)
	}
	if !t.hostAllowed(u.Host, u.Hostname()) {
		return tool.FailedResult(events.Final, "host_not_allowed",
			fmt.Errorf("tool %q: host %q is not in allowed_hosts", t.spec.Name, u.Host))
	}
	ctx, cancel := context.WithTimeout(ctx, ep.timeout)
	defer cancel()

	var rdr io.Reader
	if body != nil {
		rdr = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, ep.method, u.String(), rdr)
	if err != nil {
		return tool.FailedResult(events.Final, "invalid_request", fmt.Errorf("building request: %w", err))
	}
	req.Header.Set("User-Agent", "effectline")
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.DownstreamKey != "" {
		req.Header.Set(t.spec.IdempotencyHeader, c.DownstreamKey)
	}
	if t.signer != nil {
		if err := t.signer.sign(req.Header, body); err != nil {
			return tool.FailedResult(events.Final, "signing", err)
		}
	}
	return t.do(req, body)
}

// do sends req and classifies the response, tracing whether the request was
// written so that a transport error can be told apart: before the write,
// nothing left (Failed, retryable); after it, the server may have acted
// (Unknown).
func (t *HTTPTool) do(req *http.Request, body []byte) tool.Result {
	var wrote, responded atomic.Bool
	var handshake atomic.Pointer[error]
	trace := &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
		GotFirstResponseByte: func() { responded.Store(true) },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			if err != nil {
				handshake.Store(&err)
			}
		},
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	// net/http re-sends a request on a fresh connection when a reused one
	// breaks, and treats any request with an Idempotency-Key header as safe
	// to re-send even after it was written. That would be a blind retry the
	// executor never sees, of an effect that may be irreversible. A body
	// that refuses to rewind once the request was written keeps only the
	// retries that are provably safe (nothing was written). The client also
	// rewinds the body to follow a 307/308, once a response arrived; that
	// rewind is let through, and CheckRedirect refuses the redirect itself.
	if body != nil {
		req.GetBody = func() (io.ReadCloser, error) {
			if wrote.Load() && !responded.Load() {
				return nil, errReplayRefused
			}
			return io.NopCloser(bytes.NewReader(body)), nil
		}
	}

	resp, err := t.client.Do(req)
	if err != nil && !wrote.Load() {
		if hs := handshake.Load(); hs != nil {
			err = &handshakeError{err: err}
		}
	}
	r := Classify(resp, err, wrote.Load())
	if resp == nil || resp.Body == nil || err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		return r
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, t.maxBody+1))
	return withBody(r, data, readErr, t.maxBody, t.idField)
}

func (t *HTTPTool) hostAllowed(host, hostname string) bool {
	return t.allowedHosts[strings.ToLower(host)] || t.allowedHosts[strings.ToLower(hostname)]
}
