package reconciler

import (
	"context"

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

const instrumentation = "github.com/effectline/effectline/reconciler"

const decisionsHelp = "Approver decisions recorded, by tool and action."

type telemetry struct {
	tracer          trace.Tracer
	reconciliations metric.Int64Counter
	escalations     metric.Int64Counter
	leasesExpired   metric.Int64Counter
	webhooks        metric.Int64Counter
	e2e             metric.Float64Histogram
}

func newTelemetry(base service.Base) (*telemetry, error) {
	tracer, m := base.Instruments(instrumentation)
	t := &telemetry{tracer: tracer}
	if err := metrics.Counters(m,
		metrics.Counter{Into: &t.reconciliations, Name: "effectline.reconciliations",
			Description: "Answers to \"did it happen?\", by tool and answer (found, absent, cannot_tell, cannot_ask)."},
		metrics.Counter{Into: &t.escalations, Name: "effectline.escalations",
			Description: "Operations handed to the approval gate, by tool and reason."},
		metrics.Counter{Into: &t.leasesExpired, Name: "effectline.leases_expired",
			Description: "Steps declared Unknown because their worker stopped renewing the lease, by tool."},
		metrics.Counter{Into: &t.webhooks, Name: "effectline.webhooks",
			Description: "Inbound callbacks, by source and result."},
	); err != nil {
		return nil, err
	}
	var err error
	if t.e2e, err = metrics.OperationDuration(m); err != nil {
		return nil, err
	}
	return t, nil
}

func opAttrs(op events.Operation) []attribute.KeyValue {
	return append(semconv.Operation(op), semconv.Attempt.Int(op.Attempt))
}

// startReconciliation opens the span of one ask: a client call to the
// downstream, in the operation's trace.
func (t *telemetry) startReconciliation(ctx context.Context, op events.Operation) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "reconciliation", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(opAttrs(op), semconv.Phase.String(string(op.Phase)))...))
}

func (t *telemetry) reconciled(ctx context.Context, span trace.Span, op events.Operation, ans tool.Reconciliation, asks int) {
	span.SetAttributes(semconv.ReconcileAnswer.String(string(ans.Answer)), semconv.ReconcileAsks.Int(asks))
	if ans.ErrorClass != "" {
		span.SetAttributes(semconv.ErrorClass.String(ans.ErrorClass))
	}
	if ans.Answer != tool.Found && ans.Answer != tool.Absent {
		span.SetStatus(codes.Error, string(ans.Answer))
	}
	t.reconciliations.Add(ctx, 1, metric.WithAttributes(
		attribute.String("tool", op.Tool), attribute.String("answer", string(ans.Answer))))
}

func (t *telemetry) startEscalation(ctx context.Context, op events.Operation, esc *events.EscalationData) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "escalation", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(opAttrs(op), semconv.EscalationReason.String(esc.Reason),
			semconv.ProposedAction.String(string(esc.ProposedAction)))...))
}

func (t *telemetry) escalated(ctx context.Context, op events.Operation, esc *events.EscalationData) {
	t.escalations.Add(ctx, 1, metric.WithAttributes(
		attribute.String("tool", op.Tool), attribute.String("reason", esc.Reason)))
}

func (t *telemetry) startLeaseExpiry(ctx context.Context, op events.Operation) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "lease_expiry", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(opAttrs(op), semconv.Phase.String(string(op.Phase)))...))
}

func (t *telemetry) leaseExpired(ctx context.Context, op events.Operation) {
	t.leasesExpired.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", op.Tool)))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
