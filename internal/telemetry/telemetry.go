// Package telemetry sets up OpenTelemetry for the effectline binary: traces
// exported with OTLP/HTTP, metrics served in the Prometheus format, and a
// JSON slog logger that carries trace ids and redacts credentials.
//
// Only cmd calls Setup: components take an optional
// TracerProvider and MeterProvider and default to the otel globals, which
// Setup installs. Configuration comes from the standard OTEL_* variables,
// read through Config.Getenv. With none set nothing is exported and the
// TracerProvider is a no-op, so an unobserved deployment pays nothing for
// spans; trace context from the agent still flows through, because a no-op
// span carries its parent's span context (and so its traceparent) along.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// DefaultServiceName is the service.name when neither Config.ServiceName
// nor OTEL_SERVICE_NAME says otherwise.
const DefaultServiceName = "effectline"

// Config is what cmd passes to Setup.
type Config struct {
	// ServiceName is the resource's service.name; OTEL_SERVICE_NAME
	// overrides it. Default DefaultServiceName.
	ServiceName string
	// ServiceVersion is the resource's service.version.
	ServiceVersion string
	// Getenv reads the OTEL_* variables; cmd passes os.Getenv. Nil means an
	// empty environment: nothing is exported.
	Getenv func(string) string
	// LogWriter receives the JSON log lines. Default os.Stderr.
	LogWriter io.Writer
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
}

// WithDefaults returns c with the zero fields filled in.
func (c Config) WithDefaults() Config {
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.Getenv == nil {
		c.Getenv = func(string) string { return "" }
	}
	if c.LogWriter == nil {
		c.LogWriter = os.Stderr
	}
	return c
}

// Telemetry holds the providers Setup built. Shutdown flushes them.
type Telemetry struct {
	tp      trace.TracerProvider
	mp      metric.MeterProvider
	metrics http.Handler
	logger  *slog.Logger

	// shutdown runs once; its error is kept for later callers.
	shutdowns    []func(context.Context) error
	shutdownOnce sync.Once
	shutdownErr  error
}

// Setup builds the logger, the TracerProvider and the MeterProvider from cfg
// and the OTEL_* variables, and installs the providers and the W3C
// TraceContext + Baggage propagator as the otel globals. It does not connect
// anywhere: an unreachable collector shows up later as logged export errors,
// never as a failed start. The caller must call Shutdown to flush spans.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	cfg = cfg.WithDefaults()
	e := env(cfg.Getenv)

	level, err := parseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	logger := slog.New(newLogHandler(slog.NewJSONHandler(cfg.LogWriter, &slog.HandlerOptions{Level: level})))

	traces, err := traceExportFromEnv(e)
	if err != nil {
		return nil, fmt.Errorf("configuring traces: %w", err)
	}
	metricsOn, err := metricsEnabledFromEnv(e)
	if err != nil {
		return nil, fmt.Errorf("configuring metrics: %w", err)
	}
	res, err := newResource(ctx, cfg, e)
	if err != nil {
		return nil, err
	}

	t := &Telemetry{logger: logger}
	// Export failures surface through the otel error handler; by default it
	// writes plain text to the standard logger. Route them into the JSON log
	// so they are seen and parsed like everything else.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("opentelemetry error", slog.String("error", err.Error()))
	}))

	if traces.enabled {
		exp, err := otlptracehttp.New(ctx, traces.exporter...)
		if err != nil {
			return nil, fmt.Errorf("creating OTLP trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{
			sdktrace.WithResource(res),
			sdktrace.WithBatcher(exp, traces.processor...),
		}, traces.provider...)...)
		t.tp = tp
		t.shutdowns = append(t.shutdowns, func(ctx context.Context) error {
			if err := tp.Shutdown(ctx); err != nil {
				return fmt.Errorf("flushing spans: %w", err)
			}
			return nil
		})
	} else {
		t.tp = tracenoop.NewTracerProvider()
	}

	// The registry is our own, not prometheus.DefaultRegisterer: what
	// /metrics serves is exactly what is registered here, and tests (or a
	// second Setup) never collide on duplicate registration.
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, t.abort(ctx, fmt.Errorf("registering Go collector: %w", err))
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, t.abort(ctx, fmt.Errorf("registering process collector: %w", err))
	}
	if metricsOn {
		// The default translation (underscores, unit and _total suffixes)
		// turns the counter effectline.attempts into
		// effectline_attempts_total and the histogram
		// effectline.call.duration (unit s) into
		// effectline_call_duration_seconds.
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, t.abort(ctx, fmt.Errorf("creating Prometheus exporter: %w", err))
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(exp))
		t.mp = mp
		t.shutdowns = append(t.shutdowns, func(ctx context.Context) error {
			if err := mp.Shutdown(ctx); err != nil {
				return fmt.Errorf("shutting down meter provider: %w", err)
			}
			return nil
		})
	} else {
		t.mp = metricnoop.NewMeterProvider()
	}
	t.metrics = promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A collector that fails should cost its own series, not the
		// whole scrape.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promErrorLog{logger},
	}))

	otel.SetTracerProvider(t.tp)
	otel.SetMeterProvider(t.mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))

	logger.Debug("telemetry configured",
		slog.Bool("traces_exported", traces.enabled), slog.Bool("metrics_enabled", metricsOn))
	return t, nil
}

// newResource describes this process: service.name (OTEL_SERVICE_NAME, then
// OTEL_RESOURCE_ATTRIBUTES, then Config.ServiceName), service.version, the
// SDK, the host and the pid. Not resource.WithProcess: it would publish the
// command line, which can hold secrets.
func newResource(ctx context.Context, cfg Config, e env) (*resource.Resource, error) {
	fromEnv, err := resourceAttributesFromEnv(e)
	if err != nil {
		return nil, fmt.Errorf("configuring resource: %w", err)
	}
	attrs := []resource.Option{
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithProcessRuntimeName(),
		resource.WithProcessRuntimeVersion(),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)),
	}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(cfg.ServiceVersion)))
	}
	// Later options win on conflicting keys.
	attrs = append(attrs, resource.WithAttributes(fromEnv...))
	if name := e.get(envServiceName); name != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceName(name)))
	}
	res, err := resource.New(ctx, attrs...)
	if err != nil {
		// resource.New returns a usable resource with a partial error when a
		// detector (say, the host name) fails; a missing host name is not
		// worth refusing to start over.
		if res == nil || !errors.Is(err, resource.ErrPartialResource) {
			return nil, fmt.Errorf("building resource: %w", err)
		}
	}
	return res, nil
}

// abort releases what Setup built before failing.
func (t *Telemetry) abort(ctx context.Context, err error) error {
	if serr := t.Shutdown(context.WithoutCancel(ctx)); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// TracerProvider is the provider to pass to components (and the otel
// global): a no-op when traces are not exported.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tp }

// MeterProvider is the provider to pass to components (and the otel
// global), read by the Prometheus exporter behind MetricsHandler.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.mp }

// MetricsHandler serves the metrics in the Prometheus text or OpenMetrics
// format: the OTel instruments, Go runtime and process metrics. Mount it on
// an internal port: the metrics are not secret, but they are not public.
func (t *Telemetry) MetricsHandler() http.Handler { return t.metrics }

// Logger is the JSON logger: pass it to components and use the ...Context
// methods, so lines carry the trace_id and span_id of the span in ctx.
func (t *Telemetry) Logger() *slog.Logger { return t.logger }

// Shutdown flushes buffered spans to the collector and stops the providers.
// Call it once the components have stopped, with a context that bounds how
// long the flush may take. Later calls return the first call's result.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.shutdownOnce.Do(func() {
		var errs []error
		for _, fn := range t.shutdowns {
			errs = append(errs, fn(ctx))
		}
		t.shutdownErr = errors.Join(errs...)
	})
	return t.shutdownErr
}

// promErrorLog sends promhttp's collection errors to the JSON log.
type promErrorLog struct{ logger *slog.Logger }

func (l promErrorLog) Println(v ...any) {
	l.logger.Warn("metrics collection error", slog.String("error", fmt.Sprint(v...)))
}
