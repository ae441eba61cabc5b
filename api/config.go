package api

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	DefaultAddr              = "127.0.0.1:8080"
	DefaultMaxBodyBytes      = 1 << 20
	DefaultTopicPrefix       = "effectline."
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultRequestTimeout    = 20 * time.Second
	DefaultShutdownTimeout   = 15 * time.Second
	DefaultReadyTimeout      = 2 * time.Second
)

// DevPrincipal is who every request is in open mode (Config.Open) when it
// carries no known token. It holds the approver role (contract §7).
const DevPrincipal = "dev"

// Config configures a Server. The zero value plus Tokens (or Open) is a
// working production configuration; see WithDefaults.
type Config struct {
	// Addr is where Run listens. Default 127.0.0.1:8080; a port of 0 picks a
	// free one, which Addr reports once bound.
	Addr string
	// Tokens maps a bearer token to the principal it authenticates
	// (EFFECTLINE_API_TOKENS, see ParseTokens).
	Tokens map[string]string
	// Approvers are the principals that hold the approver role
	// (EFFECTLINE_APPROVERS).
	Approvers []string
	// Readers are the principals that read every operation, as approvers
	// do, without deciding (EFFECTLINE_READERS). Any other principal reads
	// only the operations it submitted.
	Readers []string
	// Open runs the API without authentication, on purpose (`dev`, or
	// `run --insecure-open`): a request without a known token is DevPrincipal,
	// which is also an approver. A request with a known token is still its
	// principal.
	Open bool
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	// Default 1 MiB.
	MaxBodyBytes int64
	// TopicPrefix replaces "effectline." in the topics intents are
	// published to (contract §4). Default "effectline.".
	TopicPrefix string

	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are the
	// http.Server's; they keep slow or idle clients from holding
	// connections. Defaults 5s, 30s, 30s, 120s.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// RequestTimeout bounds the work of one request (its context deadline).
	// It is shorter than WriteTimeout so a slow commit is answered with a
	// 503 the client can retry, rather than a connection cut mid-response.
	// Default 20s.
	RequestTimeout time.Duration
	// ShutdownDelay is how long Run keeps serving after its context ends,
	// with /readyz already answering 503, so load balancers stop sending new
	// requests before the listener closes. Default 0.
	ShutdownDelay time.Duration
	// ShutdownTimeout bounds the wait for in-flight requests on shutdown;
	// connections still open then are closed. Default 15s.
	ShutdownTimeout time.Duration
	// ReadyTimeout bounds one readiness check (Deps.Ready). Default 2s.
	ReadyTimeout time.Duration

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider default to the OTel globals; the SDK
	// is set up by cmd only.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.TopicPrefix == "" {
		c.TopicPrefix = DefaultTopicPrefix
	}
	setDuration(&c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	setDuration(&c.ReadTimeout, DefaultReadTimeout)
	setDuration(&c.WriteTimeout, DefaultWriteTimeout)
	setDuration(&c.IdleTimeout, DefaultIdleTimeout)
	setDuration(&c.RequestTimeout, DefaultRequestTimeout)
	setDuration(&c.ShutdownTimeout, DefaultShutdownTimeout)
	setDuration(&c.ReadyTimeout, DefaultReadyTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// ErrNoTokens is returned by New for a configuration that would expose the
// API without authentication by accident.
var ErrNoTokens = errors.New("refusing to start an API without EFFECTLINE_API_TOKENS; " +
	`set EFFECTLINE_API_TOKENS="name=token,..." (and EFFECTLINE_APPROVERS="name,..."), ` +
	"or run with --insecure-open to allow it on purpose")

func (c Config) validate() error {
	if !c.Open && len(c.Tokens) == 0 {
		return ErrNoTokens
	}
	if err := checkCredentials(c); err != nil {
		return err
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("max body bytes must not be negative, got %d", c.MaxBodyBytes)
	}
	for name, d := range map[string]time.Duration{
		"read header timeout": c.ReadHeaderTimeout, "read timeout": c.ReadTimeout,
		"write timeout": c.WriteTimeout, "idle timeout": c.IdleTimeout,
		"request timeout": c.RequestTimeout, "shutdown delay": c.ShutdownDelay,
		"shutdown timeout": c.ShutdownTimeout, "ready timeout": c.ReadyTimeout,
	} {
		if d < 0 {
			return fmt.Errorf("%s must not be negative, got %s", name, d)
		}
	}
	return nil
}

// ParseTokens parses EFFECTLINE_API_TOKENS, "name=token,name=token,...",
// into a map from token to principal. Spaces around entries are ignored and
// empty entries skipped. A principal may have several tokens (rotation); a
// token may belong to one principal only. Errors never contain a token.
func ParseTokens(s string) (map[string]string, error) {
	tokens := map[string]string{}
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, token, ok := strings.Cut(entry, "=")
		name, token = strings.TrimSpace(name), strings.TrimSpace(token)
		if !ok || name == "" || token == "" {
			return nil, fmt.Errorf("api tokens: entry %d: want name=token", i+1)
		}
		if strings.ContainsAny(token, " \t") {
			return nil, fmt.Errorf("api tokens: entry %d (%s): a token must not contain spaces", i+1, name)
		}
		if prev, dup := tokens[token]; dup && prev != name {
			return nil, fmt.Errorf("api tokens: entry %d (%s): the same token is also given to %s", i+1, name, prev)
		}
		tokens[token] = name
	}
	return tokens, nil
}

// ParseApprovers parses EFFECTLINE_APPROVERS, "name,name,...".
func ParseApprovers(s string) []string {
	var out []string
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}
