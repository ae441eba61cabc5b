// Package service is what every effectline component is built from besides
// its own settings: the [Base] it logs, traces, counts and tells time
// with, and the [Loop] its periodic work runs on (the outbox relay's
// polling, the executor's due-step poller, the reconciler's sweeper).
//
// A component's Config embeds Base, so the process (cmd/effectline/app)
// builds one and hands the same one to every component.
package service

import (
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Base is what a component logs, traces and counts with, and its clock and
// randomness. Every field has a default: the zero Base is ready to use
// after WithDefaults.
type Base struct {
	// Logger receives the component's logs. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider default to the OpenTelemetry
	// globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Now and Rand are for tests: the clock (default time.Now) and a
	// uniform float in [0, 1) (default math/rand/v2's Float64).
	Now  func() time.Time
	Rand func() float64
}

// WithDefaults returns b with every unset field at its default.
func (b Base) WithDefaults() Base {
	if b.Logger == nil {
		b.Logger = slog.Default()
	}
	if b.TracerProvider == nil {
		b.TracerProvider = otel.GetTracerProvider()
	}
	if b.MeterProvider == nil {
		b.MeterProvider = otel.GetMeterProvider()
	}
	if b.Now == nil {
		b.Now = time.Now
	}
	if b.Rand == nil {
		b.Rand = rand.Float64
	}
	return b
}

// Instruments returns the tracer and the meter of one instrumentation scope,
// by convention the component's import path.
func (b Base) Instruments(scope string) (trace.Tracer, metric.Meter) {
	b = b.WithDefaults()
	return b.TracerProvider.Tracer(scope), b.MeterProvider.Meter(scope)
}
