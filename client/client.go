// Package client calls effectline's HTTP API from Go: submit an intent,
// wait for its outcome, read it, stream its events. Results come back in
// one of three settled states (Succeeded, Failed, Unknown) or Pending, so
// an agent never has to read statuses or event histories to choose its
// next step.
//
// Every call is safe to retry, because an intent is identified by its
// operation key: a resubmission journals nothing and answers from the
// operation. The client retries its own HTTP calls on connection errors
// and on 502, 503 and 504 for that reason.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// State is what is known about an operation's effect.
type State string

const (
	// Pending: not settled yet.
	Pending State = "pending"
	// Succeeded: the effect happened; Result.Value holds its result.
	Succeeded State = "succeeded"
	// Failed: confirmed that no effect stands.
	Failed State = "failed"
	// Unknown: the effect may have happened. Never retry it as if it had
	// failed: effectline reconciles it or a human decides.
	Unknown State = "unknown"
)

// Settled reports whether s is an answer rather than "not yet".
func (s State) Settled() bool { return s == Succeeded || s == Failed || s == Unknown }

// Next is the step the outcome advises.
type Next string

const (
	NextWait     Next = "wait"
	NextDone     Next = "done"
	NextFixArgs  Next = "fix_args"
	NextAskHuman Next = "ask_human"
)

// Result is an operation as the agent needs it.
type Result struct {
	OperationKey string
	State        State
	// Retryable says, for a failure, that the same request under a new
	// operation key may go through later.
	Retryable bool
	// Reason is the error class, and for a rejection the downstream's own
	// answer.
	Reason string
	Next   Next
	// Value is the stored result of a success (JSON), else nil.
	Value json.RawMessage
	// Status is the operation's detailed status (pending, in_progress,
	// completed, failed, compensated, needs_reconciliation, escalated).
	Status string
	// Record is the operation record as the server sent it.
	Record json.RawMessage
}

// Intent is a request to run a tool once.
type Intent struct {
	// OperationKey identifies the one business effect; made by the
	// caller's deterministic workflow, never by a model.
	OperationKey string
	Tool         string
	// Args are marshalled as the tool's JSON args.
	Args any
}

// Error is an answer of the API that is not a record.
type Error struct {
	StatusCode int
	// Code is the API's error code ("payload_conflict", "invalid_args" …).
	Code   string
	Detail string
	Field  string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("effectline: %d %s", e.StatusCode, e.Code)
	if e.Field != "" {
		msg += " (" + e.Field + ")"
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// ErrPayloadConflict is matched (errors.Is) by the error of an intent whose
// key was already used with other args.
var ErrPayloadConflict = errors.New("effectline: operation key used with other args")

// Is makes errors.Is(err, ErrPayloadConflict) work.
func (e *Error) Is(target error) bool {
	return target == ErrPayloadConflict && e.Code == "payload_conflict"
}

// Client is an effectline API client. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	token   string
	http    *http.Client
	retries int
	backoff time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends a bearer token (EFFECTLINE_API_TOKENS on the server).
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient replaces http.DefaultClient. Its Timeout, if any, must
// exceed the waits asked for.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithRetries sets how many times a call is retried after a connection
// error or a 502/503/504 (default 4), with jittered backoff from base.
func WithRetries(n int, base time.Duration) Option {
	return func(c *Client) { c.retries, c.backoff = n, base }
}

// New returns a client of the API at baseURL ("http://127.0.0.1:8080").
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("effectline: base URL %q is not an absolute URL", baseURL)
	}
	c := &Client{base: u, http: http.DefaultClient, retries: 4, backoff: 100 * time.Millisecond}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// MaxWait is the longest wait the server applies to one request.
const MaxWait = 60 * time.Second

// Submit records the intent and waits up to wait (at most MaxWait; 0 for
// none) for its outcome. A Pending result means the wait ran out; call
// Wait. Submitting the same intent again is safe and executes nothing
// twice: it answers with the operation's outcome.
func (c *Client) Submit(ctx context.Context, in Intent, wait time.Duration) (*Result, error) {
	args, err := json.Marshal(in.Args)
	if err != nil {
		return nil, fmt.Errorf("effectline: marshalling the args: %w", err)
	}
	if in.Args == nil {
		args = []byte("{}")
	}
	body, err := json.Marshal(map[string]any{"operation_key": in.OperationKey, "tool": in.Tool, "args": json.RawMessage(args)})
	if err != nil {
		return nil, err
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if wait > 0 {
		h.Set("Prefer", "wait="+strconv.Itoa(int(min(wait, MaxWait).Seconds())))
	}
	return c.record(ctx, http.MethodPost, "/v1/intents", nil, body, h)
}

// Get returns the operation's current outcome.
func (c *Client) Get(ctx context.Context, key string) (*Result, error) {
	return c.record(ctx, http.MethodGet, operationPath(key), nil, nil, nil)
}

// Wait returns once the operation settled, asking the server to hold each
// request up to MaxWait, or when ctx ends: then it returns the latest
// Pending result with ctx's error.
func (c *Client) Wait(ctx context.Context, key string) (*Result, error) {
	q := url.Values{"wait": {MaxWait.String()}}
	var last *Result
	for {
		r, err := c.record(ctx, http.MethodGet, operationPath(key), q, nil, nil)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			return last, ctx.Err()
		case err != nil:
			return nil, err
		case r.State.Settled():
			return r, nil
		}
		last = r
		if ctx.Err() != nil {
			return last, ctx.Err()
		}
	}
}

// Event is one journaled event of an operation.
type Event struct {
	Seq  int64
	Type string
	// Envelope is the event's JSON envelope (args redacted).
	Envelope json.RawMessage
}

// Stream calls fn with each event of the operation from after seq
// (0: from the first), as they are journaled, and returns nil once the
// operation settled and its events were delivered. A dropped stream is
// resumed where it stopped. An error from fn ends the stream with it.
func (c *Client) Stream(ctx context.Context, key string, after int64, fn func(Event) error) error {
	failures := 0
	for {
		err := c.streamOnce(ctx, key, &after, fn)
		var fnErr fnError
		if errors.As(err, &fnErr) {
			return fnErr.err
		}
		if err == nil {
			// The server ends a stream once the operation settled, and
			// also at its own bound or shutdown: the record tells which.
			r, gerr := c.Get(ctx, key)
			if gerr == nil && r.State.Settled() {
				return nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && !retryable(err):
			return err
		}
		if err != nil {
			failures++
			if failures > c.retries {
				return err
			}
		} else {
			failures = 0 // the server ended the stream early (its bound, a shutdown): resume
		}
		if err := c.sleep(ctx, failures); err != nil {
			return err
		}
	}
}

type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// streamOnce reads one SSE response to its end.
func (c *Client) streamOnce(ctx context.Context, key string, after *int64, fn func(Event) error) error {
	req, err := c.request(ctx, http.MethodGet, operationPath(key)+"/events", nil, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if *after > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(*after, 10))
	}
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return apiError(res)
	}
	var ev Event
	dec := newSSEReader(res.Body)
	for {
		field, value, err := dec.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch field {
		case "id":
			ev.Seq, _ = strconv.ParseInt(value, 10, 64)
		case "event":
			ev.Type = value
		case "data":
			ev.Envelope = json.RawMessage(value)
		case "":
			if ev.Type == "" {
				continue
			}
			if err := fn(ev); err != nil {
				return fnError{err}
			}
			*after = ev.Seq
			ev = Event{}
		}
	}
}

func operationPath(key string) string { return "/v1/operations/" + url.PathEscape(key) }

// record makes a call that answers an operation record, retrying what is
// safe to retry.
func (c *Client) record(ctx context.Context, method, path string, q url.Values, body []byte, h http.Header) (*Result, error) {
	for attempt := 0; ; attempt++ {
		r, err := c.recordOnce(ctx, method, path, q, body, h)
		if err == nil || !retryable(err) || attempt >= c.retries || ctx.Err() != nil {
			return r, err
		}
		if err := c.sleep(ctx, attempt+1); err != nil {
			return nil, err
		}
	}
}

func (c *Client) recordOnce(ctx context.Context, method, path string, q url.Values, body []byte, h http.Header) (*Result, error) {
	req, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusAccepted {
		return nil, apiError(res)
	}
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	var rec struct {
		OperationKey string `json:"operation_key"`
		Status       string `json:"status"`
		Outcome      struct {
			State     State           `json:"state"`
			Retryable bool            `json:"retryable"`
			Reason    string          `json:"reason"`
			Next      Next            `json:"next"`
			Result    json.RawMessage `json:"result"`
		} `json:"outcome"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("effectline: decoding the answer: %w", err)
	}
	r := &Result{OperationKey: rec.OperationKey, State: rec.Outcome.State, Retryable: rec.Outcome.Retryable,
		Reason: rec.Outcome.Reason, Next: rec.Outcome.Next, Status: rec.Status, Record: raw}
	if r.State == "" {
		r.State = Pending
	}
	if len(rec.Outcome.Result) > 0 && string(rec.Outcome.Result) != "null" {
		r.Value = rec.Outcome.Result
	}
	return r, nil
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body []byte) (*http.Request, error) {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	u.Path, _ = url.PathUnescape(u.RawPath)
	u.RawQuery = q.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// retryable reports whether a failed call may be sent again: the server
// may not have seen it, or said it could not serve it now.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode == http.StatusBadGateway || e.StatusCode == http.StatusServiceUnavailable ||
			e.StatusCode == http.StatusGatewayTimeout
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func (c *Client) sleep(ctx context.Context, attempt int) error {
	d := c.backoff << min(attempt, 6)
	d = time.Duration(rand.Int64N(int64(d) + 1)) // full jitter
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func apiError(res *http.Response) error {
	var body struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
		Field  string `json:"field"`
	}
	_ = json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&body)
	return &Error{StatusCode: res.StatusCode, Code: body.Error, Detail: body.Detail, Field: body.Field}
}
