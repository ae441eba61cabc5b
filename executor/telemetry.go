package executor

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/tool"
)

const instrumentation = "github.com/effectline/effectline/executor"

type telemetry struct {
	tracer    trace.Tracer
	attempts  metric.Int64Counter
	unknowns  metric.Int64Counter
	journaled metric.Int64Counter
	intents   metric.Int64Counter
	pruned    metric.Int64Counter
	e2e       metric.Float64Histogram
	callTime  metric.Float64Histogram
}

func newTelemetry(base service.Base) (*telemetry, error) {
	tracer, m := base.Instruments(instrumentation)
	t := &telemetry{tracer: tracer}
	if err := metrics.Counters(m,
		metrics.Counter{Into: &t.attempts, Name: "effectline.attempts",
			Description: "Tool calls finished, by tool, effect class and outcome."},
		metrics.Counter{Into: &t.unknowns, Name: "effectline.unknowns",
			Description: "Calls whose outcome is unknown: the effect may have happened."},
		metrics.Counter{Into: &t.journaled, Name: "effectline.executor.steps",
			Description: "Steps the executor journaled, by kind."},
		metrics.Counter{Into: &t.intents, Name: "effectline.executor.intents_from_kafka",
			Description: "Intents produced straight to Kafka and journaled by the executor."},
		metrics.Counter{Into: &t.pruned, Name: "effectline.executor.pruned_intents",
			Description: "Intent messages for pruned operations, by result (duplicate, payload_conflict); none runs."},
	); err != nil {
		return nil, err
	}
	var err error
	if t.e2e, err = metrics.OperationDuration(m); err != nil {
		return nil, err
	}
	if t.callTime, err = m.Float64Histogram("effectline.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of tool calls."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return nil, err
	}
	return t, nil
}

// startStep opens the span of one attempt or compensation: a child of the
// operation's trace, ended when its outcome is journaled.
func (t *telemetry) startStep(ctx context.Context, op events.Operation, st step) (context.Context, trace.Span) {
	name := "attempt"
	if st.kind == stepCompensate {
		name = "compensation"
	}
	attrs := append(semconv.Operation(op), semconv.Attempt.Int(st.events[0].Attempt), semconv.Rule.String(st.rule))
	if d, err := st.events[0].DecodeData(); err == nil {
		switch d := d.(type) {
		case *events.AttemptStartedData:
			attrs = append(attrs, semconv.BackoffWaited.Int64(d.BackoffWaitedMS), semconv.DownstreamKey.String(d.DownstreamKey))
		case *events.CompensationStartedData:
			attrs = append(attrs, semconv.DownstreamKey.String(d.DownstreamKey))
		}
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

func (t *telemetry) endAttempt(ctx context.Context, span trace.Span, op events.Operation, res tool.Result, took time.Duration) {
	outcome := string(res.Outcome)
	span.SetAttributes(semconv.Outcome.String(outcome), semconv.ErrorClass.String(res.ErrorClass))
	if res.StatusCode != 0 {
		span.SetAttributes(semconv.HTTPStatusCode.Int(res.StatusCode))
	}
	switch res.Outcome {
	case events.Succeeded:
		span.SetStatus(codes.Ok, "")
	case events.Failed:
		span.SetStatus(codes.Error, "failed: "+res.ErrorClass)
	default:
		span.SetStatus(codes.Error, "unknown outcome: "+res.ErrorClass)
	}
	span.End()
	set := metric.WithAttributes(attribute.String("tool", op.Tool),
		attribute.String("effect_class", string(op.EffectClass)), attribute.String("outcome", outcome))
	t.attempts.Add(ctx, 1, set)
	t.callTime.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("tool", op.Tool)))
	if res.Outcome == events.Unknown {
		t.unknowns.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", op.Tool),
			attribute.String("error_class", res.ErrorClass)))
	}
}

func (t *telemetry) recordJournal(ctx context.Context, op events.Operation, st step) {
	kind := map[stepKind]string{stepJournal: "journal", stepAttempt: "attempt", stepCompensate: "compensation"}[st.kind]
	t.journaled.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind)))
	if op.Status.Terminal() {
		metrics.RecordSettled(ctx, t.e2e, op)
	}
}

func (t *telemetry) intentJournaled(ctx context.Context) { t.intents.Add(ctx, 1) }
