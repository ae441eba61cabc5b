package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
)

// NotWaitingError says which state the operation was in.
type NotWaitingError struct {
	OperationKey string
	Status       events.Status
}

func (e *NotWaitingError) Error() string {
	return fmt.Sprintf("operation %s is %s, not waiting for a decision", e.OperationKey, e.Status)
}

func (e *NotWaitingError) Unwrap() error { return events.ErrNotWaiting }

// InvalidDecisionError says why a decision was refused.
type InvalidDecisionError struct {
	OperationKey string
	Action       events.Action
	Reason       string
}

func (e *InvalidDecisionError) Error() string {
	return fmt.Sprintf("decision %q on operation %s: %s", e.Action, e.OperationKey, e.Reason)
}

func (e *InvalidDecisionError) Unwrap() error { return events.ErrInvalidDecision }

// MaxNoteBytes caps a decision's note: it is journaled in an event and shown
// in the approval UI.
const MaxNoteBytes = 4096

// DecideOption adjusts Decide.
type DecideOption func(*decideOptions)

type decideOptions struct {
	topicPrefix string
	tp          trace.TracerProvider
	mp          metric.MeterProvider
	// tools, seenID and seenResult: see WithTools and WithSeenDownstream.
	tools      Tools
	seenID     string
	seenResult json.RawMessage
}

// WithTopicPrefix sets the topic prefix of the decision's outbox rows; it
// must match the deployment's kafka.Config.TopicPrefix. Default "effectline.".
func WithTopicPrefix(prefix string) DecideOption {
	return func(o *decideOptions) { o.topicPrefix = prefix }
}

// WithTelemetry sets the tracer and meter providers; nil means the global
// ones.
func WithTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) DecideOption {
	return func(o *decideOptions) { o.tp, o.mp = tp, mp }
}

// Decider is Decide bound to a store and its options, for callers that take
// decisions through a method: it is the HTTP API's Decider as it is.
type Decider struct {
	store *store.Store
	opts  []DecideOption
}

// NewDecider returns a Decider on st.
func NewDecider(st *store.Store, opts ...DecideOption) *Decider {
	return &Decider{store: st, opts: opts}
}

// Decide is the package's Decide at the current time.
func (d *Decider) Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error) {
	return Decide(ctx, d.store, key, action, note, approver, time.Now(), d.opts...)
}

// DecideSeen is Decide with what the approver saw downstream, for a
// record_success (see WithSeenDownstream).
func (d *Decider) DecideSeen(ctx context.Context, key string, action events.Action, note, approver, downstreamID string, result json.RawMessage) (events.Operation, error) {
	opts := append(slices.Clip(d.opts), WithSeenDownstream(downstreamID, result))
	return Decide(ctx, d.store, key, action, note, approver, time.Now(), opts...)
}

// Decide records an approver's decision on an operation waiting for one
// (escalated or needs_reconciliation) and returns the record it produced:
//
//   - record_success: completed (the approver saw the effect downstream);
//   - retry: pending, due now, approved: the executor's due-time poller runs
//     the next attempt (the first one, for a tool that requires approval);
//   - compensate: pending compensation, due now: the executor runs the undo,
//     then retries under a new downstream key within the caps;
//   - abandon: failed.
//
// It refuses with a *NotWaitingError (errors.Is events.ErrNotWaiting) when the
// operation is not waiting, and with an *InvalidDecisionError (errors.Is
// events.ErrInvalidDecision) for an unknown action, an empty approver, a note over
// MaxNoteBytes, or compensate on a non-compensable effect or before any
// attempt. An unknown key wraps store.ErrNotFound.
//
// With WithTools, the tool's approval rule applies: a principal refused by
// not_requester gets events.ErrRequesterCannotDecide, the same approver's
// second retry in the approval gate is invalid, and before a retry or an
// abandon of an operation whose outcome is unknown the downstream is asked
// again; if it shows the effect, Decide journals that
// (reconciliation.resolved, found) instead of the decision and returns the
// completed record with events.ErrEffectFound.
//
// The decision is an append from the record it was checked against. If
// anything else wrote first — a webhook that settled the operation, a late
// success, another approver — the append conflicts, Decide reloads and
// checks again, so two approvers clicking at once record one decision and
// the other gets events.ErrNotWaiting.
func Decide(ctx context.Context, st *store.Store, key string, action events.Action, note, approver string, now time.Time, opts ...DecideOption) (events.Operation, error) {
	o := decideOptions{topicPrefix: events.DefaultTopicPrefix}
	for _, opt := range opts {
		opt(&o)
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	invalid := func(reason string) (events.Operation, error) {
		return events.Operation{}, &InvalidDecisionError{OperationKey: key, Action: action, Reason: reason}
	}
	if _, err := events.ParseAction(string(action)); err != nil {
		return invalid(err.Error())
	}
	if approver == "" {
		return invalid("the approver's identity is required")
	}
	if len(note) > MaxNoteBytes || !utf8.ValidString(note) {
		return invalid(fmt.Sprintf("the note must be valid UTF-8 of at most %d bytes", MaxNoteBytes))
	}
	if (o.seenID != "" || len(o.seenResult) > 0) && action != events.ActionRecordSuccess {
		return invalid("downstream_id and result go only with record_success")
	}
	if len(o.seenResult) > 0 && !json.Valid(o.seenResult) {
		return invalid("result must be JSON")
	}
	decisions, err := o.mp.Meter(instrumentation).Int64Counter("effectline.decisions",
		metric.WithDescription(decisionsHelp))
	if err != nil {
		return events.Operation{}, err
	}
	settled, err := metrics.OperationDuration(o.mp.Meter(instrumentation))
	if err != nil {
		return events.Operation{}, err
	}

	if tp, err := st.Traceparent(ctx, key); err == nil {
		ctx = traceparent.ContextWith(ctx, tp)
	}
	ctx, span := o.tp.Tracer(instrumentation).Start(ctx, "decision", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(semconv.OperationKey.String(key), semconv.DecisionAction.String(string(action)), semconv.Approver.String(approver)))
	var retErr error
	defer func() { endSpan(span, retErr) }()

	for range maxConflicts {
		op, err := st.Load(ctx, key)
		if err != nil {
			retErr = err
			return events.Operation{}, err
		}
		span.SetAttributes(semconv.Tool.String(op.Tool), semconv.EffectClass.String(string(op.EffectClass)), semconv.Attempt.Int(op.Attempt))
		if !op.Status.AwaitingDecision() {
			retErr = &NotWaitingError{OperationKey: key, Status: op.Status}
			return op, retErr
		}
		if action == events.ActionCompensate {
			switch {
			case op.EffectClass != events.Compensable:
				_, retErr = invalid(fmt.Sprintf("tool %q is %s; only a compensable effect has an undo", op.Tool, op.EffectClass))
				return op, retErr
			case op.Attempt == 0:
				_, retErr = invalid("there is nothing to undo before the first attempt")
				return op, retErr
			}
		}
		if err := o.gate(op, action, approver); err != nil {
			retErr = err
			return op, err
		}
		if found := o.recheck(ctx, op, action); found != nil {
			// The effect shows now: record it, and refuse the decision that
			// was made without knowing.
			evs, err := events.Following(op, now, events.Spec{Type: events.ReconciliationResolved, Data: found})
			if err != nil {
				retErr = err
				return op, err
			}
			next, err := st.Append(ctx, store.Append{
				Base: op, Events: evs, Traceparent: traceparent.FromContext(ctx), TopicPrefix: o.topicPrefix,
			})
			if store.IsConflict(err) {
				continue
			}
			if err != nil {
				retErr = fmt.Errorf("recording what the downstream shows for %s: %w", key, err)
				return op, retErr
			}
			metrics.RecordSettled(ctx, settled, next)
			retErr = fmt.Errorf("%w: %s was not carried out on %s, which is now recorded completed", events.ErrEffectFound, action, key)
			return next, retErr
		}
		d := &events.DecisionData{Action: action, Note: note, Approver: approver,
			DownstreamID: o.seenID, Result: o.seenResult}
		if action == events.ActionRetry {
			at := now.UTC()
			d.RetryAt = &at
		}
		evs, err := events.Following(op, now, events.Spec{Type: events.DecisionRecorded, Data: d})
		if err != nil {
			retErr = err
			return op, err
		}
		next, err := st.Append(ctx, store.Append{
			Base: op, Events: evs, Traceparent: traceparent.FromContext(ctx), TopicPrefix: o.topicPrefix,
		})
		if store.IsConflict(err) {
			continue
		}
		if err != nil {
			retErr = fmt.Errorf("recording the decision on %s: %w", key, err)
			return op, retErr
		}
		decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("tool", op.Tool), attribute.String("action", string(action))))
		metrics.RecordSettled(ctx, settled, next)
		return next, nil
	}
	retErr = fmt.Errorf("recording the decision on %s: lost the append race too many times", key)
	return events.Operation{}, retErr
}
