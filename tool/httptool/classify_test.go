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
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	type want struct {
		outcome events.Outcome
		kind    events.FailureKind
		class   string
	}
	ok := want{events.Succeeded, "", ""}
	final := func(c string) want { return want{events.Failed, events.Final, c} }
	retry := func(c string) want { return want{events.Failed, events.Retryable, c} }
	unk := func(c string) want { return want{events.Unknown, "", c} }
	tests := []struct {
		code int
		want want
	}{
		{200, ok}, {201, ok}, {202, ok}, {204, ok}, {299, ok},
		{400, final("http_400")}, {422, final("http_422")},
		{401, final("http_401")}, {403, final("http_403")},
		{404, final("http_404")}, {409, final("http_409")}, {410, final("http_410")}, {499, final("http_499")},
		{429, retry("http_429")}, {503, retry("http_503")},
		{500, unk("http_500")}, {502, unk("http_502")}, {504, unk("http_504")},
		{501, unk("http_501")}, {505, unk("http_505")}, {599, unk("http_599")},
		{301, unk("http_301")}, {304, unk("http_304")}, {101, unk("http_101")}, {600, unk("http_600")},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.code), func(t *testing.T) {
			t.Parallel()
			r := Classify(&http.Response{StatusCode: tt.code, Header: http.Header{}}, nil, true)
			got := want{r.Outcome, r.Kind, r.ErrorClass}
			if got != tt.want || r.StatusCode != tt.code {
				t.Fatalf("Classify(%d) = %+v (status %d), want %+v", tt.code, got, r.StatusCode, tt.want)
			}
			if (r.Outcome == events.Succeeded) != (r.Err == nil) {
				t.Fatalf("Classify(%d): Err = %v", tt.code, r.Err)
			}
		})
	}
}

func TestClassifyRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"-5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
		{"99999999999999", 365 * 24 * time.Hour, true},
	}
	for _, tt := range tests {
		got, ok := parseRetryAfter(tt.header, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseRetryAfter(%q) = (%v, %v), want (%v, %v)", tt.header, got, ok, tt.want, tt.ok)
		}
	}
	for _, code := range []int{429, 503} {
		r := classifyStatus(&http.Response{StatusCode: code, Header: http.Header{"Retry-After": {"7"}}}, now)
		if r.Outcome != events.Failed || r.Kind != events.Retryable || r.RetryAfter != 7*time.Second {
			t.Errorf("%d with Retry-After: 7 = %+v", code, r)
		}
	}
	// Retry-After on a status that is not retryable changes nothing.
	if r := classifyStatus(&http.Response{StatusCode: 500, Header: http.Header{"Retry-After": {"7"}}}, now); r.Outcome != events.Unknown || r.RetryAfter != 0 {
		t.Errorf("500 with Retry-After = %+v", r)
	}
}

// timeoutErr is a net.Error that timed out, as a dial or read deadline gives.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassifyTransportErrors(t *testing.T) {
	t.Parallel()
	urlErr := func(err error) error { return &url.Error{Op: "Post", URL: "http://x/", Err: err} }
	dial := func(err error) error { return urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: err}) }
	read := func(err error) error { return urlErr(&net.OpError{Op: "read", Net: "tcp", Err: err}) }
	tests := []struct {
		name    string
		err     error
		wrote   bool
		outcome events.Outcome
		class   string
	}{
		{"dns", dial(&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}), false, events.Failed, "dns"},
		{"refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), false, events.Failed, "connection_refused"},
		{"tls unknown authority", urlErr(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), false, events.Failed, "tls_handshake"},
		{"tls record header", urlErr(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), false, events.Failed, "tls_handshake"},
		{"tls marked by trace", &handshakeError{err: errors.New("remote error: tls: bad certificate")}, false, events.Failed, "tls_handshake"},
		{"dial timeout", dial(timeoutErr{}), false, events.Failed, "timeout_before_send"},
		{"deadline before write", urlErr(context.DeadlineExceeded), false, events.Failed, "timeout_before_send"},
		{"canceled before write", urlErr(context.Canceled), false, events.Failed, "canceled_before_send"},
		{"unreachable", dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), false, events.Failed, "dial"},
		{"deadline after write", urlErr(context.DeadlineExceeded), true, events.Unknown, "timeout_after_send"},
		{"read timeout after write", read(timeoutErr{}), true, events.Unknown, "timeout_after_send"},
		{"canceled after write", urlErr(context.Canceled), true, events.Unknown, "canceled_after_send"},
		{"reset after write", read(os.NewSyscallError("read", syscall.ECONNRESET)), true, events.Unknown, "connection_reset"},
		{"eof after write", urlErr(io.EOF), true, events.Unknown, "eof"},
		{"unexpected eof after write", urlErr(io.ErrUnexpectedEOF), true, events.Unknown, "eof"},
		// Not provably unsent: part of the request may be on the wire.
		{"reset while writing", urlErr(&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}), false, events.Unknown, "connection_reset"},
		{"broken pipe while writing", urlErr(&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}), false, events.Unknown, "connection_reset"},
		{"something else", urlErr(errors.New("weird")), false, events.Unknown, "transport_error"},
		{"redirect refused", urlErr(errRedirectRefused), true, events.Unknown, "redirect_refused"},
		{"replay refused", urlErr(errReplayRefused), true, events.Unknown, "connection_lost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := Classify(nil, tt.err, tt.wrote)
			if r.Outcome != tt.outcome || r.ErrorClass != tt.class || r.Err == nil {
				t.Fatalf("Classify(%v, wrote=%v) = %s/%s, want %s/%s", tt.err, tt.wrote, r.Outcome, r.ErrorClass, tt.outcome, tt.class)
			}
			if r.Outcome == events.Failed && r.Kind != events.Retryable {
				t.Fatalf("a never-sent failure must be retryable, got %s", r.Kind)
			}
		})
	}
	if r := Classify(nil, nil, false); r.Outcome != events.Unknown {
		t.Fatalf("no response and no error = %+v", r)
	}
}

func TestWithBody(t *testing.T) {
	t.Parallel()
	ok := tool.Result{Outcome: events.Succeeded, StatusCode: 200}
	if r := withBody(ok, []byte(`{"id":"ch_1","n":2}`), nil, 100, "id"); r.Outcome != events.Succeeded || r.DownstreamID != "ch_1" || string(r.Body) != `{"id":"ch_1","n":2}` {
		t.Errorf("json body = %+v", r)
	}
	if r := withBody(ok, []byte(`{"ref":42}`), nil, 100, "ref"); r.DownstreamID != "42" {
		t.Errorf("numeric id = %q", r.DownstreamID)
	}
	if r := withBody(ok, []byte("plain <text>"), nil, 100, "id"); string(r.Body) != `"plain \u003ctext\u003e"` {
		t.Errorf("text body = %s", r.Body)
	}
	if r := withBody(ok, nil, nil, 100, "id"); r.Body != nil || r.Outcome != events.Succeeded {
		t.Errorf("empty body = %+v", r)
	}
	if r := withBody(ok, make([]byte, 101), nil, 100, "id"); r.Outcome != events.Unknown || r.ErrorClass != "response_too_large" || r.StatusCode != 200 {
		t.Errorf("oversized 2xx = %+v", r)
	}
	if r := withBody(ok, []byte(`{"id":`), io.ErrUnexpectedEOF, 100, "id"); r.Outcome != events.Unknown || r.ErrorClass != "eof" {
		t.Errorf("truncated 2xx = %+v", r)
	}
	bad := Classify(&http.Response{StatusCode: 400, Header: http.Header{}}, nil, true)
	if r := withBody(bad, make([]byte, 101), nil, 100, "id"); r.Outcome != events.Failed || r.Kind != events.Final || r.Body != nil {
		t.Errorf("oversized 400 = %+v", r)
	}
	if r := withBody(bad, []byte(`{"error":"amount"}`), nil, 100, "id"); string(r.Body) != `{"error":"amount"}` || r.DownstreamID != "" {
		t.Errorf("400 body = %+v", r)
	}
}
