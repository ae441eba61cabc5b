package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// maxConflicts bounds how often one step is re-decided after losing an
// append race; each loss means another writer moved the operation on, so a
// few rounds always settle it.
const maxConflicts = 8

// stepKind is what the executor does next with an operation.
type stepKind int

const (
	stepNone       stepKind = iota // nothing due, or not the executor's to do
	stepJournal                    // append events and stop (rejection, approval gate)
	stepAttempt                    // claim an attempt and call the tool
	stepCompensate                 // claim a compensation and call the undo
)

type step struct {
	kind   stepKind
	events []events.Envelope
	tool   tool.Tool
	rule   string // which rule applied, for the log and the trace
}

// plan decides the next step of op at now. It does no I/O. immediate is set
// when the intent message itself triggered the decision: a first attempt
// then runs at once instead of waiting for the poller's pickup grace.
func (e *Executor) plan(op events.Operation, now time.Time, immediate bool) (step, error) {
	if op.Status != events.StatusPending {
		return step{kind: stepNone}, nil
	}
	due := op.DueAt == nil || !op.DueAt.After(now)
	first := op.Attempt == 0 && op.Phase == events.PhaseAttempt && !op.Approved
	if !due && !(immediate && first) {
		return step{kind: stepNone}, nil
	}
	t, known := e.tools.Get(op.Tool)

	if op.Phase == events.PhaseCompensation {
		if _, ok := t.(tool.Compensator); !known || !ok {
			return e.journal(op, now, "compensation_unavailable",
				startCompensation(op, e.cfg.Worker, now, now),
				compensationFailed(op, tool.Result{Outcome: events.Failed, ErrorClass: "compensation_unavailable",
					Err: fmt.Errorf("tool %q has no compensation", op.Tool)}))
		}
		claim := startCompensation(op, e.cfg.Worker, now, now.Add(e.cfg.Lease))
		evs, err := events.Following(op, now, claim)
		return step{kind: stepCompensate, events: evs, tool: t, rule: "compensable: undo before retry"}, err
	}

	// Checked again at execution time: the registry or the principal's
	// rights may have changed since the intent was accepted, and an intent
	// produced straight to Kafka was never checked at all.
	var reject error
	var class string
	switch {
	case !known:
		class, reject = "unknown_tool", fmt.Errorf("tool %q is not registered", op.Tool)
	case len(op.Args) == 0:
		// The fold of a public copy of an intent (events.PublicIntent, the
		// one on the outcomes topic) has no args: its args were redacted.
		class, reject = "redacted_intent", errors.New("the intent is the redacted copy published outside the intents topic")
	case t.Spec().Effect != op.EffectClass:
		class, reject = "effect_class_mismatch", fmt.Errorf("intent says %s, tool %q is %s", op.EffectClass, op.Tool, t.Spec().Effect)
	default:
		if err := t.Spec().Authorize(op.Principal); err != nil {
			class, reject = "forbidden", err
		} else if err := t.Spec().ValidateArgs(op.Args); err != nil {
			class, reject = "invalid_args", err
		}
	}
	if reject != nil {
		return e.journal(op, now, "rejected before sending: "+class,
			startAttempt(op, e.cfg.Worker, now, now),
			attemptFailed(op, tool.Result{Outcome: events.Failed, Kind: events.Final, ErrorClass: class, Err: reject}, nil))
	}
	if gate := approvalGate(op, t); gate != nil {
		return e.journal(op, now, "requires approval before the first attempt", *gate)
	}
	claim := startAttempt(op, e.cfg.Worker, now, now.Add(e.cfg.Lease))
	evs, err := events.Following(op, now, claim)
	return step{kind: stepAttempt, events: evs, tool: t, rule: ruleFor(op)}, err
}

func ruleFor(op events.Operation) string {
	switch {
	case op.Attempt == 0:
		return "first attempt"
	case op.Compensations > 0 && op.DownstreamKey != events.DownstreamKeyFor(op.Key, op.Compensations):
		return "retry under a new downstream key after the undo"
	default:
		return "retry within the caps (" + string(op.EffectClass) + ")"
	}
}

func (e *Executor) journal(op events.Operation, now time.Time, rule string, specs ...events.Spec) (step, error) {
	evs, err := events.Following(op, now, specs...)
	return step{kind: stepJournal, events: evs, rule: rule}, err
}

func startAttempt(op events.Operation, worker string, now, leaseUntil time.Time) events.Spec {
	var waited int64
	if op.LastOutcomeAt != nil {
		waited = now.Sub(*op.LastOutcomeAt).Milliseconds()
	}
	return events.Spec{Type: events.AttemptStarted, Attempt: op.Attempt + 1, Data: &events.AttemptStartedData{
		DownstreamKey:   events.DownstreamKeyFor(op.Key, op.Compensations),
		Worker:          worker,
		LeaseUntil:      leaseUntil.UTC(),
		BackoffWaitedMS: waited,
	}}
}

func startCompensation(op events.Operation, worker string, now, leaseUntil time.Time) events.Spec {
	return events.Spec{Type: events.CompensationStarted, Attempt: op.Attempt, Data: &events.CompensationStartedData{
		DownstreamKey: op.DownstreamKey,
		DownstreamID:  op.DownstreamID,
		Worker:        worker,
		LeaseUntil:    leaseUntil.UTC(),
	}}
}

// advanceKey loads an operation and advances it; the poller's entry point.
func (e *Executor) advanceKey(ctx context.Context, key string) error {
	op, err := e.store.Load(ctx, key)
	if err != nil {
		return err
	}
	tp, err := e.store.Traceparent(ctx, key)
	if err != nil {
		return err
	}
	return e.advance(traceparent.ContextWith(ctx, tp), op, advanceDue)
}

// advanceMode says what triggered an advance.
type advanceMode struct {
	// immediate: the intent message itself; a first attempt runs at once
	// instead of waiting for the poller's pickup grace.
	immediate bool
	// intentEventID: op is the fold of this intent message alone, not read
	// from the store; the claim commits only if the journaled intent is this
	// event, and a conflict returns errNotThisIntent instead of reloading.
	intentEventID string
}

var (
	advanceDue       = advanceMode{}
	advanceImmediate = advanceMode{immediate: true}
)

func advanceFromIntent(eventID string) advanceMode {
	return advanceMode{immediate: true, intentEventID: eventID}
}

// errNotThisIntent: a step decided from an intent message conflicted; the
// journal holds more than that intent, or another one, or none yet.
var errNotThisIntent = errors.New("the journaled operation is not at this intent")

// advance starts the next step of op if one is due. The claim is an append
// conditioned on op.Seq: if another executor (or the reconciler, or an
// approver) moved the operation first, the append conflicts, and the
// executor reloads and decides again from what the winner wrote. Two
// executors therefore never run the same step, however the intent was
// delivered.
func (e *Executor) advance(ctx context.Context, op events.Operation, mode advanceMode) error {
	if !e.claimOp(op.Key) {
		return nil // this process is already working on it
	}
	launched := false
	defer func() {
		if !launched {
			e.releaseOp(op.Key)
		}
	}()
	for range maxConflicts {
		now := e.cfg.Now()
		st, err := e.plan(op, now, mode.immediate)
		if err != nil {
			return fmt.Errorf("planning %s: %w", op.Key, err)
		}
		if st.kind == stepNone {
			return nil
		}
		if st.kind != stepJournal {
			// Take a call slot before claiming, so a claimed step never
			// waits for a slot while its lease runs.
			select {
			case e.slots <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var span trace.Span
		spanCtx := ctx
		if st.kind != stepJournal {
			spanCtx, span = e.tel.startStep(ctx, op, st)
		}
		next, err := e.committer.Append(ctx, store.Append{
			Base: op, Events: st.events, Traceparent: traceparent.FromContext(spanCtx), TopicPrefix: e.cfg.Kafka.TopicPrefix,
			IntentEventID: mode.intentEventID,
			// A claim's event can wait for the outcome's to be published.
			Unhurried: st.kind != stepJournal,
		})
		if err != nil {
			if span != nil {
				span.End()
				<-e.slots
			}
			if !store.IsConflict(err) {
				return fmt.Errorf("claiming the next step of %s: %w", op.Key, err)
			}
			if mode.intentEventID != "" {
				return errNotThisIntent
			}
			if op, err = e.store.Load(ctx, op.Key); err != nil {
				return err
			}
			continue
		}
		e.logStep(ctx, next, st)
		e.tel.recordJournal(ctx, next, st)
		if st.kind == stepJournal {
			return nil
		}
		launched = true
		e.calls.Add(1)
		go func() {
			defer e.calls.Done()
			defer func() { <-e.slots }()
			defer e.releaseOp(next.Key)
			// The call runs on the executor's own context, not the Kafka
			// message's: the message is acknowledged once the claim is
			// journaled, and the call must survive that.
			callCtx := trace.ContextWithSpan(e.callCtx, span)
			if st.kind == stepCompensate {
				e.runCompensation(callCtx, span, next, st.tool)
			} else {
				e.runAttempt(callCtx, span, next, st.tool)
			}
		}()
		return nil
	}
	return fmt.Errorf("advancing %s: %w", op.Key, errTooManyConflicts)
}

var errTooManyConflicts = errors.New("lost the append race too many times")

func (e *Executor) logStep(ctx context.Context, op events.Operation, st step) {
	e.log.DebugContext(ctx, "step journaled",
		"operation_key", op.Key, "tool", op.Tool, "status", op.Status, "attempt", op.Attempt, "rule", st.rule)
}
