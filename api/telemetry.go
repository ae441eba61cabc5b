package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/semconv"
)

const instrumentation = "github.com/effectline/effectline/api"

// traceContext is the W3C propagator. It is fixed, not the global one: the
// traceparent an intent is stored with is part of the contract (contract §8),
// whatever propagators the process is configured with.
var traceContext = propagation.TraceContext{}

type telemetry struct {
	tracer   trace.Tracer
	requests metric.Int64Counter
	duration metric.Float64Histogram
	intents  metric.Int64Counter
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	m := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation)}
	if err := metrics.Counters(m,
		metrics.Counter{Into: &t.requests, Name: "effectline.http.requests",
			Description: "HTTP API requests answered, by method, route and status code."},
		metrics.Counter{Into: &t.intents, Name: "effectline.http.intents",
			Description: "Intents received over HTTP, by tool and result (recorded, duplicate, completed, conflict)."},
	); err != nil {
		return nil, err
	}
	var err error
	if t.duration, err = m.Float64Histogram("http.server.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP API requests, by method, route and status code."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return nil, err
	}
	return t, nil
}

// record counts one answered request. route is the matched pattern's path
// ("/v1/operations/{key}"), never the raw path, so the label set stays
// bounded; "" for requests no route matched.
func (t *telemetry) record(ctx context.Context, method, route string, status int, took time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	attrs := []attribute.KeyValue{semconv.HTTPMethod.String(method), semconv.HTTPStatusCode.Int(status)}
	if route != "" {
		attrs = append(attrs, semconv.HTTPRoute.String(route))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	t.requests.Add(ctx, 1, set)
	t.duration.Record(ctx, took.Seconds(), set)
}

func (t *telemetry) intent(ctx context.Context, tool, result string) {
	t.intents.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", tool), attribute.String("result", result)))
}

// instrument wraps a route's handler: a server span continuing the caller's
// W3C trace context, the request deadline, panic recovery, and the request
// metrics.
func (s *Server) instrument(method, route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m := method
		if m == "" {
			m = r.Method
		}
		ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tel.tracer.Start(ctx, m+" "+route,
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPMethod.String(r.Method), semconv.HTTPRoute.String(route)))
		defer span.End()
		ctx, cancel := context.WithTimeout(ctx, s.timeoutFor(route, r))
		defer cancel()

		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v) // net/http's own signal to drop the connection
				}
				s.log.ErrorContext(ctx, "http handler panicked", slog.String("route", route),
					slog.String("panic", fmt.Sprint(v)))
				span.SetStatus(codes.Error, "panic")
				if rec.status == 0 {
					writeError(rec, http.StatusInternalServerError, codeInternal, "internal error")
				}
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			span.SetAttributes(semconv.HTTPStatusCode.Int(status))
			if status >= 500 {
				span.SetStatus(codes.Error, strconv.Itoa(status))
			}
			s.tel.record(ctx, r.Method, route, status, time.Since(start))
			if status >= 500 {
				s.log.WarnContext(ctx, "http request failed", slog.String("method", r.Method),
					slog.String("route", route), slog.Int("status_code", status),
					slog.Duration("duration", time.Since(start)))
			} else {
				s.log.DebugContext(ctx, "http request", slog.String("method", r.Method),
					slog.String("route", route), slog.Int("status_code", status),
					slog.Duration("duration", time.Since(start)))
			}
		}()
		next.ServeHTTP(rec, r.WithContext(ctx))
	})
}

func setSpanPrincipal(ctx context.Context, name string) {
	trace.SpanFromContext(ctx).SetAttributes(semconv.Principal.String(name))
}

// statusRecorder remembers the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush, deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
