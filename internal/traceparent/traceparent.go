// Package traceparent converts between a context's span and the W3C
// traceparent string effectline stores with every event, so that work
// resumed from the database (the relay, the poller, the reconciler, the
// approval gate) continues the operation's trace.
//
// The stored form is always W3C trace context, whatever propagator the
// process configured: it is a column of the journal, read back by other
// processes and other versions. What travels in Kafka headers is the global
// OpenTelemetry propagator's business (internal/kafka).
package traceparent

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

const header = "traceparent"

// ContextWith returns ctx carrying the remote span context of tp, so spans
// started from it continue that trace. An empty or invalid tp leaves ctx as
// it is.
func ContextWith(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{header: tp})
}

// FromContext returns the traceparent of the span in ctx, or "".
func FromContext(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c[header]
}
