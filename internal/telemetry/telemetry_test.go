package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/internal/telemetry"
)

// mapEnv is a Getenv over a fixed map: tests never touch the process
// environment, so they can run in parallel.
func mapEnv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// setup runs Setup with env, logging to the test log, and shuts down at
// the end.
func setup(t *testing.T, env map[string]string) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{
		ServiceName:    "effectline-test",
		ServiceVersion: "1.2.3",
		Getenv:         mapEnv(env),
		LogWriter:      tWriter{t},
		LogLevel:       "debug",
	})
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}

// tWriter sends log lines to the test's log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestSetupWithoutEnvIsNoop(t *testing.T) {
	t.Parallel()
	tel := setup(t, nil)

	ctx, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "op")
	defer span.End()
	if trace.SpanFromContext(ctx).SpanContext().IsValid() {
		t.Fatal("span context is valid: a real TracerProvider was installed without any OTEL variable")
	}
	if span.IsRecording() {
		t.Fatal("span is recording")
	}
}

// A no-op provider must still carry the agent's trace context through, so
// the traceparent written to Kafka continues the agent's trace.
func TestNoopContinuesRemoteParent(t *testing.T) {
	t.Parallel()
	tel := setup(t, nil)
	parent := remoteParent(t)

	ctx, span := tel.TracerProvider().Tracer("test").Start(trace.ContextWithRemoteSpanContext(t.Context(), parent), "op")
	defer span.End()
	if got := trace.SpanContextFromContext(ctx); got.TraceID() != parent.TraceID() || got.SpanID() != parent.SpanID() {
		t.Fatalf("span context = %v/%v, want the parent's %v/%v", got.TraceID(), got.SpanID(), parent.TraceID(), parent.SpanID())
	}
}

func TestSetupDisabled(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	for name, env := range map[string]map[string]string{
		"traces exporter none": {"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint(), "OTEL_TRACES_EXPORTER": "none"},
		"sdk disabled":         {"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint(), "OTEL_SDK_DISABLED": "TRUE"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tel := setup(t, env)
			ctx, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "op")
			span.End()
			if trace.SpanFromContext(ctx).SpanContext().IsValid() {
				t.Fatal("span context is valid: traces are not disabled")
			}
		})
	}
}

func TestSetupExportsSpans(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{
		ServiceName:    "effectline-test",
		ServiceVersion: "1.2.3",
		Getenv:         mapEnv(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint()}),
		LogWriter:      io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}

	tracer := tel.TracerProvider().Tracer("github.com/effectline/effectline/test")
	ctx, parent := tracer.Start(t.Context(), "relay publish", trace.WithSpanKind(trace.SpanKindProducer))
	_, child := tracer.Start(ctx, "attempt", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("effectline.tool", "pay"), attribute.Int("effectline.attempt", 2)))
	child.SetStatus(codes.Error, "unknown outcome: timeout")
	child.End()
	parent.End()

	// Shutdown flushes the batch: no waiting needed afterwards.
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	spans := recv.Spans()
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2: %+v", len(spans), spans)
	}
	byName := map[string]telemetry.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	p, c := byName["relay publish"], byName["attempt"]
	for _, s := range spans {
		if s.Service != "effectline-test" {
			t.Errorf("span %q: service = %q, want effectline-test", s.Name, s.Service)
		}
		if s.TraceID != parent.SpanContext().TraceID().String() {
			t.Errorf("span %q: trace id = %s, want %s", s.Name, s.TraceID, parent.SpanContext().TraceID())
		}
	}
	if p.ParentSpanID != "" || p.Kind != "producer" {
		t.Errorf("parent span = %+v, want a root producer span", p)
	}
	if c.ParentSpanID != p.SpanID || c.Kind != "client" {
		t.Errorf("child span: parent %q kind %q, want parent %q kind client", c.ParentSpanID, c.Kind, p.SpanID)
	}
	if c.Attributes["effectline.tool"] != "pay" || c.Attributes["effectline.attempt"] != "2" {
		t.Errorf("child attributes = %v", c.Attributes)
	}
	if c.StatusCode != "Error" || c.StatusMessage != "unknown outcome: timeout" {
		t.Errorf("child status = %q %q", c.StatusCode, c.StatusMessage)
	}
	if c.Scope != "github.com/effectline/effectline/test" {
		t.Errorf("scope = %q", c.Scope)
	}
	if c.Start.IsZero() || c.End.Before(c.Start) {
		t.Errorf("child times = %v..%v", c.Start, c.End)
	}
}

func TestServiceNameAndTracesEndpointFromEnv(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	tel := setup(t, map[string]string{
		// The per-signal endpoint wins and is used as it is; the base one
		// points at a port nothing listens on.
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": recv.Endpoint() + "/v1/traces",
		"OTEL_EXPORTER_OTLP_COMPRESSION":     "gzip",
		"OTEL_EXPORTER_OTLP_HEADERS":         "authorization=Bearer%20abc",
		"OTEL_SERVICE_NAME":                  "renamed",
		"OTEL_RESOURCE_ATTRIBUTES":           "service.name=ignored,deployment.environment.name=test",
		"OTEL_BSP_SCHEDULE_DELAY":            "10",
	})
	_, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "op")
	span.End()
	// No Shutdown: the 10ms schedule delay flushes on its own.
	spans := recv.WaitFor(t, func(s []telemetry.Span) bool { return len(s) > 0 }, 10*time.Second)
	if spans[0].Service != "renamed" {
		t.Fatalf("service = %q, want OTEL_SERVICE_NAME's renamed", spans[0].Service)
	}
}

func TestSetupRejectsBadEnv(t *testing.T) {
	t.Parallel()
	for name, env := range map[string]map[string]string{
		"endpoint without scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
		"grpc":                    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		"zipkin":                  {"OTEL_TRACES_EXPORTER": "zipkin"},
		"otlp metrics":            {"OTEL_METRICS_EXPORTER": "otlp"},
		"sampler":                 {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
		"sampler arg":             {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
		"resource attributes":     {"OTEL_RESOURCE_ATTRIBUTES": "novalue"},
		"headers":                 {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "authorization"},
		"user info":               {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://u:pw-123@c/v1/traces"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := telemetry.Setup(t.Context(), telemetry.Config{Getenv: mapEnv(env), LogWriter: io.Discard})
			if err == nil {
				t.Fatal("Setup succeeded, want an error")
			}
			if strings.Contains(err.Error(), "pw-123") {
				t.Fatalf("error echoes a password: %v", err)
			}
			t.Log(err)
		})
	}
	if _, err := telemetry.Setup(t.Context(), telemetry.Config{LogLevel: "loud", LogWriter: io.Discard}); err == nil {
		t.Fatal("Setup accepted log level loud")
	}
}

// Errors about headers must not echo them: they carry credentials.
func TestSetupErrorDoesNotEchoHeaders(t *testing.T) {
	t.Parallel()
	_, err := telemetry.Setup(t.Context(), telemetry.Config{LogWriter: io.Discard, Getenv: mapEnv(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
		"OTEL_EXPORTER_OTLP_HEADERS":  "x-api-key=s3cr3t,broken%zz",
	})})
	if err == nil {
		t.Fatal("Setup succeeded, want an error")
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error echoes the header value: %v", err)
	}
}

func TestPropagatorIsW3C(t *testing.T) {
	t.Parallel()
	setup(t, nil)
	fields := otel.GetTextMapPropagator().Fields()
	for _, want := range []string{"traceparent", "tracestate", "baggage"} {
		if !slices.Contains(fields, want) {
			t.Errorf("global propagator fields %v lack %s", fields, want)
		}
	}
}

func TestMetricsHandler(t *testing.T) {
	t.Parallel()
	tel := setup(t, nil)

	m := tel.MeterProvider().Meter("test")
	counter, err := m.Int64Counter("effectline.test", metric.WithDescription("A test counter."))
	if err != nil {
		t.Fatal(err)
	}
	counter.Add(t.Context(), 3, metric.WithAttributes(attribute.String("tool", "pay")))
	hist, err := m.Float64Histogram("effectline.test.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	hist.Record(t.Context(), 0.2)

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	for _, re := range []string{
		`(?m)^effectline_test_total\{[^}]*tool="pay"[^}]*\} 3$`,
		`(?m)^effectline_test_duration_seconds_bucket\{`,
		`(?m)^go_goroutines `,
		`(?m)^process_cpu_seconds_total `,
		`(?m)^target_info\{[^}]*service_name="effectline-test"`,
	} {
		if !regexp.MustCompile(re).MatchString(body) {
			t.Errorf("metrics lack %s", re)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}

func remoteParent(t *testing.T) trace.SpanContext {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}
