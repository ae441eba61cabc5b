package reconciler

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/tool"
)

const instrumentation = "github.com/effectline/effectline/reconciler"

const decisionsHelp = "Approver decisions recorded, by tool and action."

// Span attribute keys (DESIGN §8).
var (
	attrOperationKey = attribute.Key("effectline.operation_key")
	attrTool         = attribute.Key("effectline.tool")
	attrEffectClass  = attribute.Key("effectline.effect_class")
	attrAttempt      = attribute.Key("effectline.attempt")
	attrAnswer       = attribute.Key("effectline.reconcile_answer")
	attrAsks         = attribute.Key("effectline.reconcile_asks")
	attrErrorClass   = attribute.Key("effectline.error_class")
	attrReason       = attribute.Key("effectline.escalation_reason")
	attrProposed     = attribute.Key("effectline.proposed_action")
	attrAction       = attribute.Key("effectline.decision_action")
	attrApprover     = attribute.Key("effectline.approver")
	attrSource       = attribute.Key("effectline.webhook_source")
	attrPhase        = attribute.Key("effectline.phase")
)

type telemetry struct {
	tracer          trace.Tracer
	reconciliations metric.Int64Counter
	escalations     metric.Int64Counter
	leasesExpired   metric.Int64Counter
	malformedMsgs   metric.Int64Counter
	webhooks        metric.Int64Counter
	e2e             metric.Float64Histogram
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	m := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation)}
	var err error
	if t.reconciliations, err = m.Int64Counter("effectline.reconciliations",
		metric.WithDescription("Answers to \"did it happen?\", by tool and answer (found, absent, cannot_tell, cannot_ask).")); err != nil {
		return nil, err
	}
	if t.escalations, err = m.Int64Counter("effectline.escalations",
		metric.WithDescription("Operations handed to the approval gate, by tool and reason.")); err != nil {
		return nil, err
	}
	if t.leasesExpired, err = m.Int64Counter("effectline.leases_expired",
		metric.WithDescription("Steps declared Unknown because their worker stopped renewing the lease, by tool.")); err != nil {
		return nil, err
	}
	if t.malformedMsgs, err = m.Int64Counter("effectline.reconciler.malformed_messages",
		metric.WithDescription("Messages on the outcomes topic that were not valid events.")); err != nil {
		return nil, err
	}
	if t.webhooks, err = m.Int64Counter("effectline.webhooks",
		metric.WithDescription("Inbound callbacks, by source and result.")); err != nil {
		return nil, err
	}
	if t.e2e, err = newOperationDuration(m); err != nil {
		return nil, err
	}
	return t, nil
}

// newOperationDuration is the end-to-end latency histogram, for the
// operations the reconciler, a webhook or an approver brings to a terminal
// state. The executor records the ones it settles in an instrument of the
// same name, description, unit and buckets (executor/telemetry.go), so
// /metrics serves one family, effectline_operation_duration_seconds, with
// each package's series told apart by otel_scope_name.
func newOperationDuration(m metric.Meter) (metric.Float64Histogram, error) {
	return m.Float64Histogram("effectline.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("From the intent to a terminal state."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
}

// recordSettled records the end-to-end latency of an operation that an
// append of this package made terminal.
func recordSettled(ctx context.Context, h metric.Float64Histogram, next events.Operation) {
	if !next.Status.Terminal() {
		return
	}
	h.Record(ctx, max(next.UpdatedAt.Sub(next.CreatedAt), 0).Seconds(), metric.WithAttributes(
		attribute.String("tool", next.Tool), attribute.String("status", string(next.Status))))
}

func opAttrs(op events.Operation) []attribute.KeyValue {
	return []attribute.KeyValue{
		attrOperationKey.String(op.Key), attrTool.String(op.Tool),
		attrEffectClass.String(string(op.EffectClass)), attrAttempt.Int(op.Attempt),
	}
}

// startReconciliation opens the span of one ask: a client call to the
// downstream, in the operation's trace.
func (t *telemetry) startReconciliation(ctx context.Context, op events.Operation) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "reconciliation", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(opAttrs(op), attrPhase.String(string(op.Phase)))...))
}

func (t *telemetry) reconciled(ctx context.Context, span trace.Span, op events.Operation, ans tool.Reconciliation, asks int) {
	span.SetAttributes(attrAnswer.String(string(ans.Answer)), attrAsks.Int(asks))
	if ans.ErrorClass != "" {
		span.SetAttributes(attrErrorClass.String(ans.ErrorClass))
	}
	if ans.Answer != tool.Found && ans.Answer != tool.Absent {
		span.SetStatus(codes.Error, string(ans.Answer))
	}
	t.reconciliations.Add(ctx, 1, metric.WithAttributes(
		attribute.String("tool", op.Tool), attribute.String("answer", string(ans.Answer))))
}

func (t *telemetry) startEscalation(ctx context.Context, op events.Operation, esc *events.EscalationData) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "escalation", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(opAttrs(op), attrReason.String(esc.Reason),
			attrProposed.String(string(esc.ProposedAction)))...))
}

func (t *telemetry) escalated(ctx context.Context, op events.Operation, esc *events.EscalationData) {
	t.escalations.Add(ctx, 1, metric.WithAttributes(
		attribute.String("tool", op.Tool), attribute.String("reason", esc.Reason)))
}

func (t *telemetry) startLeaseExpiry(ctx context.Context, op events.Operation) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "lease_expiry", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(opAttrs(op), attrPhase.String(string(op.Phase)))...))
}

func (t *telemetry) leaseExpired(ctx context.Context, op events.Operation) {
	t.leasesExpired.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", op.Tool)))
}

func (t *telemetry) malformed(ctx context.Context) { t.malformedMsgs.Add(ctx, 1) }

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
