// Package metrics holds the instruments that several components record
// into, so each is defined once: same name, unit and buckets wherever an
// operation can end.
package metrics

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/events"
)

// OperationDuration is the end-to-end latency histogram: from the intent to a
// terminal state. The executor, the reconciler, decisions and webhooks each
// make operations terminal, and each records here.
func OperationDuration(m metric.Meter) (metric.Float64Histogram, error) {
	return m.Float64Histogram("effectline.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("From the intent to a terminal state."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
}

// RecordSettled records op's end-to-end latency if op is terminal.
func RecordSettled(ctx context.Context, h metric.Float64Histogram, op events.Operation) {
	if !op.Status.Terminal() {
		return
	}
	h.Record(ctx, max(op.UpdatedAt.Sub(op.CreatedAt), 0).Seconds(), metric.WithAttributes(
		attribute.String("tool", op.Tool), attribute.String("status", string(op.Status))))
}
