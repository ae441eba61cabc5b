package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// client talks to a running effectline API over HTTP, and only over HTTP:
// the operator's tool works against any version of the server that keeps
// the API, and never reaches into its database.
type client struct {
	base  *url.URL
	token string
	hc    *http.Client
	// streams is for event streams, which last as long as the operation
	// takes, so hc's timeout on the whole request does not fit them.
	streams *http.Client
}

// maxErrorBody bounds how much of an error answer is read and shown.
const maxErrorBody = 8 << 10

// requestTimeout bounds one request. A list pages through many requests,
// each under its own timeout.
const requestTimeout = 30 * time.Second

func newClient(rawURL, token string) (*client, error) {
	u, err := url.Parse(strings.TrimRight(rawURL, "/"))
	if err != nil {
		// The value is not shown: it may hold credentials.
		return nil, fmt.Errorf("%s is not a URL (want one like %s)", EnvAPIURL, DefaultAPIURL)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s=%q: want a URL like %s", EnvAPIURL, u.Redacted(), DefaultAPIURL)
	}
	return &client{base: u, token: token, hc: &http.Client{Timeout: requestTimeout}, streams: &http.Client{}}, nil
}

// APIError is an answer of the API with a status of 400 or more. Code,
// Field and Detail are the members of the API's error body; Body is the
// answer itself when it was not one.
type APIError struct {
	Method string
	Path   string
	Status int
	Code   string
	Field  string
	Detail string
	Body   string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.Path, e.Status, http.StatusText(e.Status))
	switch {
	case e.Code != "":
		b.WriteString(": " + e.Code)
		if e.Field != "" {
			b.WriteString(" (" + e.Field + ")")
		}
		if e.Detail != "" {
			b.WriteString(": " + e.Detail)
		}
	case e.Body != "":
		b.WriteString(": " + e.Body)
	}
	switch e.Status {
	case http.StatusUnauthorized:
		b.WriteString(" (check " + EnvAPIToken + ")")
	case http.StatusForbidden:
		b.WriteString(" (the principal of " + EnvAPIToken + " lacks the role this needs)")
	}
	return b.String()
}

// IsStatus reports whether err is an APIError with the given status.
func IsStatus(err error, status int) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == status
}

// UnreachableError says the API did not answer at all.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the effectline API at %s (set %s to the API's address): %v", e.URL, EnvAPIURL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// get fetches path with query and returns the body of a 2xx answer.
func (c *client) get(ctx context.Context, path string, query url.Values) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, query, nil)
}

// post sends body as JSON to path and returns the body of a 2xx answer.
func (c *client) post(ctx context.Context, path string, body any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.do(ctx, http.MethodPost, path, nil, b)
}

func (c *client) do(parent context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(parent, requestTimeout)
	defer cancel()
	req, err := c.newRequest(ctx, method, path, query, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(parent, c.hc, path, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return b, nil
}

// stream opens the server-sent event stream at path, resuming after the
// event id lastID when it is above 0. The answer is read as it comes, with
// no timeout on the whole: the caller closes its body, and bounds the
// silence between lines.
func (c *client) stream(ctx context.Context, path string, lastID int64) (*http.Response, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(lastID, 10))
	}
	return c.send(ctx, c.streams, path, req)
}

// newRequest builds a request of the API for path (already escaped, see
// pathKey), with the token and, for a body, its JSON content type.
func (c *client) newRequest(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Request, error) {
	u := *c.base
	// path is already escaped (pathKey): keep RawPath so a key with a
	// slash stays one segment.
	u.RawPath = c.base.EscapedPath() + path
	if p, err := url.PathUnescape(u.RawPath); err == nil {
		u.Path = p
	}
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// send sends req with hc and returns a 2xx answer, whose body the caller
// closes; any other answer is the API's error, and no answer at all an
// UnreachableError, unless parent ended first.
func (c *client) send(parent context.Context, hc *http.Client, path string, req *http.Request) (*http.Response, error) {
	resp, err := hc.Do(req)
	if err != nil {
		if parent.Err() != nil {
			// Interrupted by the operator (Ctrl-C), not a server that is away.
			return nil, parent.Err()
		}
		return nil, &UnreachableError{URL: c.base.Redacted(), Err: err}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, readAPIError(req.Method, path, resp)
	}
	return resp, nil
}

func readAPIError(method, path string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{Method: method, Path: path, Status: resp.StatusCode}
	var body struct {
		Error  string `json:"error"`
		Field  string `json:"field"`
		Detail string `json:"detail"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error != "" {
		e.Code, e.Field, e.Detail = body.Error, body.Field, body.Detail
	} else {
		e.Body = strings.TrimSpace(string(raw))
	}
	return e
}

// pathKey escapes an operation key or workflow id as one path segment.
func pathKey(key string) string { return url.PathEscape(key) }
