package projector

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names. The lag is the age of an event when the read model caught up
// with it, which is what a reader of the operations API experiences as
// staleness; consumer lag in messages is the broker's to report.
const (
	MetricLag    = "effectline.projection.lag"
	MetricEvents = "effectline.projection.events"
	// MetricBatch is the number of events per projection transaction: how
	// well the group commit amortizes a commit across partitions.
	MetricBatch = "effectline.projection.batch"
	// MetricRewinds counts the times the projector read its partitions
	// again from their committed offsets because rows it had committed
	// asynchronously may have been lost (its database connection broke).
	MetricRewinds = "effectline.projection.rewinds"
)

// Outcome attribute values of MetricEvents.
const (
	// OutcomeApplied: a delivered event was folded into its row.
	OutcomeApplied = "applied"
	// OutcomeSkipped: a delivered event was already in its row (seq ≤ last_seq).
	OutcomeSkipped = "skipped"
	// OutcomeGapFilled: an event missing from the delivery order was loaded
	// from the event store and folded in before the delivered one.
	OutcomeGapFilled = "gap_filled"
	// OutcomeRejected: a valid event that cannot apply to its operation (it is
	// not the event store's, or the database refused its row) was acked and dropped.
	OutcomeRejected = "rejected"
)

// Stream attribute values: which read model an event was projected into.
const (
	// StreamOperations: an event of effectline.outcomes, into operation_state.
	StreamOperations = "operations"
	// StreamWorkflows: an event of effectline.workflows, into workflow_state.
	StreamWorkflows = "workflows"
)

// lagBuckets spans a healthy projector (milliseconds) to one replaying a
// backlog (minutes); the SDK default tops out at 10s, which a replay exceeds.
var lagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

type metrics struct {
	lag     metric.Float64Histogram
	events  metric.Int64Counter
	batch   metric.Int64Histogram
	rewinds metric.Int64Counter
}

// streamMetrics are the instruments of one stream, with its options
// precomputed as slices, so counting allocates nothing per event (a
// variadic call with single options would allocate the slice each time).
type streamMetrics struct {
	*metrics
	// by holds the options of each outcome.
	by     map[string][]metric.AddOption
	record []metric.RecordOption
}

// stream returns the instruments of the stream named name (Stream*).
func (m *metrics) stream(name string) *streamMetrics {
	s := attribute.String("stream", name)
	by := map[string][]metric.AddOption{}
	for _, o := range []string{OutcomeApplied, OutcomeSkipped, OutcomeGapFilled, OutcomeRejected} {
		by[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o), s))}
	}
	return &streamMetrics{metrics: m, by: by, record: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(s))}}
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter("github.com/effectline/effectline/projector")
	lag, err := m.Float64Histogram(MetricLag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of an event (now minus occurred_at) when its read-model row (operation_state, workflow_state) was committed."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricLag, err)
	}
	evs, err := m.Int64Counter(MetricEvents,
		metric.WithUnit("{event}"),
		metric.WithDescription("Events handled by the projector, by outcome."))
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricEvents, err)
	}
	batch, err := m.Int64Histogram(MetricBatch,
		metric.WithUnit("{event}"),
		metric.WithDescription("Events per projection transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricBatch, err)
	}
	rewinds, err := m.Int64Counter(MetricRewinds,
		metric.WithUnit("{rewind}"),
		metric.WithDescription("Times the projector read its partitions again because rows it committed asynchronously may have been lost."))
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricRewinds, err)
	}
	return &metrics{lag: lag, events: evs, batch: batch, rewinds: rewinds}, nil
}

func (m *streamMetrics) count(ctx context.Context, outcome string, n int) {
	if n > 0 {
		m.events.Add(ctx, int64(n), m.by[outcome]...)
	}
}

func (m *streamMetrics) observeLag(ctx context.Context, occurredAt, now time.Time) {
	m.lag.Record(ctx, max(now.Sub(occurredAt), 0).Seconds(), m.record...)
}

func (m *streamMetrics) observeBatch(ctx context.Context, n int) {
	m.batch.Record(ctx, int64(n), m.record...)
}
