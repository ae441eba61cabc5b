package kafka_test

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// The trace context crosses Kafka through the global propagator; these
// tests set the one the effectline binary sets (internal/telemetry).
func init() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}
