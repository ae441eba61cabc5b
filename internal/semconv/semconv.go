// Package semconv holds the span attribute keys of effectline's traces
// (contract §8, docs/observability.md): one place, so that every component
// names an operation's key, tool and class the same way and one query in a
// tracing backend finds an operation's spans across the API, the relay, the
// executor, the reconciler and the projector. The OpenTelemetry keys it
// repeats (http.*, messaging.*) are the semantic conventions' own names.
package semconv

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/effectline/effectline/events"
)

// Keys of an operation, on every span about one.
const (
	OperationKey = attribute.Key("effectline.operation_key")
	Tool         = attribute.Key("effectline.tool")
	EffectClass  = attribute.Key("effectline.effect_class")
	Attempt      = attribute.Key("effectline.attempt")
	Status       = attribute.Key("effectline.status")
	Phase        = attribute.Key("effectline.phase")
	EventType    = attribute.Key("effectline.event_type")
	Seq          = attribute.Key("effectline.seq")
)

// Keys of a step's span (executor).
const (
	Outcome       = attribute.Key("effectline.outcome")
	ErrorClass    = attribute.Key("effectline.error_class")
	BackoffWaited = attribute.Key("effectline.backoff_waited_ms")
	Rule          = attribute.Key("effectline.rule")
	DownstreamKey = attribute.Key("effectline.downstream_key")
	CheckVerdict  = attribute.Key("effectline.check.verdict")
)

// Keys of reconciliation, escalation and decision spans (reconciler).
const (
	ReconcileAnswer  = attribute.Key("effectline.reconcile_answer")
	ReconcileAsks    = attribute.Key("effectline.reconcile_asks")
	EscalationReason = attribute.Key("effectline.escalation_reason")
	ProposedAction   = attribute.Key("effectline.proposed_action")
	DecisionAction   = attribute.Key("effectline.decision_action")
	Approver         = attribute.Key("effectline.approver")
	WebhookSource    = attribute.Key("effectline.webhook_source")
	WebhookResult    = attribute.Key("effectline.webhook_result")
)

// Keys of the API's spans.
const (
	Principal = attribute.Key("effectline.principal")
)

// Keys of the projector's spans.
const (
	ProjectionOutcome = attribute.Key("effectline.projection.outcome")
	WorkflowID        = attribute.Key("effectline.workflow_id")
)

// OpenTelemetry's own semantic-convention keys that effectline sets.
const (
	HTTPMethod           = attribute.Key("http.request.method")
	HTTPRoute            = attribute.Key("http.route")
	HTTPStatusCode       = attribute.Key("http.response.status_code")
	MessagingSystem      = attribute.Key("messaging.system")
	MessagingDestination = attribute.Key("messaging.destination.name")
	MessagingSystemKafka = "kafka"
)

// Operation is the attributes every span about op carries: its key, tool
// and effect class.
func Operation(op events.Operation) []attribute.KeyValue {
	return []attribute.KeyValue{
		OperationKey.String(op.Key), Tool.String(op.Tool), EffectClass.String(string(op.EffectClass)),
	}
}

// Event is the attributes of a span about one journaled event of an
// operation (the relay's publish, the projector's upsert).
func Event(env *events.Envelope) []attribute.KeyValue {
	return []attribute.KeyValue{
		OperationKey.String(env.OperationKey), EventType.String(string(env.Type)), Seq.Int64(env.Seq),
	}
}
