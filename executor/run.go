package executor

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/policy"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// runAttempt calls the tool for the claimed attempt of op and journals the
// outcome. op is the record as the claim left it.
func (e *Executor) runAttempt(ctx context.Context, span trace.Span, op events.Operation, t tool.Tool) {
	stop := e.heartbeat(ctx, op)
	started := e.cfg.Now()
	e.crashPoint(PointBeforeCall)
	call := tool.CallOf(op)
	g := e.guard(ctx, op, t, call)
	var res tool.Result
	if g.blocked != nil {
		res = *g.blocked
	} else {
		res = t.Invoke(ctx, call)
	}
	stop()
	e.crashPoint(PointAfterResponse)
	// The result is journaled, stored in the record and returned to every
	// duplicate: a downstream that echoes the request (a charge answering
	// with the card number) must not carry sensitive args into it.
	res.Body = tool.Scrub(t.Spec(), op.Args, res.Body)
	now := e.cfg.Now()
	if res.Outcome == events.Failed {
		// A rejection's body is journaled for the agent to read: redacted
		// like evidence (it may echo the args) and capped.
		res.Body = events.CapResponse(t.Spec().RedactEcho(op.Args, res.Body))
	}
	spec := withEvidence(outcomeSpec(op, res, t.Spec().Caps, now, e.cfg.Rand), g.evidence)
	next := e.record(ctx, op, spec)
	e.crashPoint(PointAfterJournal)
	e.tel.endAttempt(ctx, span, op, res, now.Sub(started))
	e.afterOutcome(ctx, next)
}

// outcomeSpec turns a classified result into the outcome event, deciding the
// next step per effect class (contract §2).
func outcomeSpec(op events.Operation, res tool.Result, caps policy.Caps, now time.Time, rnd func() float64) events.Spec {
	first := now
	if op.FirstAttemptAt != nil {
		first = *op.FirstAttemptAt
	}
	switch res.Outcome {
	case events.Succeeded:
		return events.Spec{Type: events.AttemptSucceeded, Attempt: op.Attempt, Data: &events.AttemptSucceededData{
			StatusCode: res.StatusCode, Result: res.Body, DownstreamID: res.DownstreamID, UndoRef: res.UndoRef,
		}}
	case events.Failed:
		retryAt := policy.AfterFailure(res.Kind, caps, op.Attempt, first, now, res.RetryAfter, rnd)
		return attemptFailed(op, res, retryAt)
	default:
		next, retryAt := policy.AfterUnknown(op.EffectClass, caps, op.Attempt, first, now, res.RetryAfter, rnd)
		return events.Spec{Type: events.AttemptUnknown, Attempt: op.Attempt, Data: &events.AttemptUnknownData{
			ErrorClass: orDefault(res.ErrorClass, "unknown"), Error: errText(res.Err), StatusCode: res.StatusCode,
			Next: next, RetryAt: retryAt,
		}}
	}
}

func attemptFailed(op events.Operation, res tool.Result, retryAt *time.Time) events.Spec {
	kind := res.Kind
	if kind == "" {
		kind = events.Final
	}
	if kind == events.Final {
		retryAt = nil
	}
	return events.Spec{Type: events.AttemptFailed, Attempt: max(op.Attempt, 1), Data: &events.AttemptFailedData{
		Kind: kind, ErrorClass: orDefault(res.ErrorClass, "failed"), Error: errText(res.Err),
		StatusCode: res.StatusCode, RetryAt: retryAt, Response: res.Body,
	}}
}

// runCompensation calls the undo of the claimed compensation of op.
func (e *Executor) runCompensation(ctx context.Context, span trace.Span, op events.Operation, t tool.Tool) {
	stop := e.heartbeat(ctx, op)
	started := e.cfg.Now()
	res := t.(tool.Compensator).Compensate(ctx, tool.CallOf(op))
	stop()
	now := e.cfg.Now()
	var spec events.Spec
	if res.Outcome == events.Succeeded {
		first := now
		if op.FirstAttemptAt != nil {
			first = *op.FirstAttemptAt
		}
		spec = events.Spec{Type: events.CompensationSucceeded, Attempt: op.Attempt, Data: &events.CompensationSucceededData{
			StatusCode: res.StatusCode,
			RetryAt:    policy.AfterCompensation(t.Spec().Caps, op.Attempt, first, now, e.cfg.Rand),
		}}
	} else {
		spec = compensationFailed(op, res)
	}
	next := e.record(ctx, op, spec)
	e.tel.endAttempt(ctx, span, op, res, now.Sub(started))
	e.afterOutcome(ctx, next)
}

func compensationFailed(op events.Operation, res tool.Result) events.Spec {
	outcome := res.Outcome
	if outcome != events.Failed {
		outcome = events.Unknown
	}
	return events.Spec{Type: events.CompensationFailed, Attempt: max(op.Attempt, 1), Data: &events.CompensationFailedData{
		Outcome: outcome, ErrorClass: orDefault(res.ErrorClass, "compensation_failed"),
		Error: errText(res.Err), StatusCode: res.StatusCode,
	}}
}

// record journals the outcome of the step claimed at claimed.Seq. If the
// operation moved on meanwhile (this worker's lease expired and the sweep
// declared the attempt Unknown, say), the outcome is journaled anyway on top
// of the newer state, marked late: the fold keeps it as evidence and cannot
// let it overwrite a newer attempt, but an effect that happened is never
// dropped. Journaling outlives the call's context: the effect already
// happened or not, and the journal must say so.
func (e *Executor) record(ctx context.Context, claimed events.Operation, spec events.Spec) events.Operation {
	ctx = context.WithoutCancel(ctx)
	base := claimed
	backoff := 50 * time.Millisecond
	deadline := e.cfg.Now().Add(10 * time.Minute)
	for {
		now := e.cfg.Now()
		evs, err := events.Following(base, now, spec)
		if err == nil {
			var next events.Operation
			next, err = e.committer.Append(ctx, store.Append{
				Base: base, Events: evs, Traceparent: traceparent.FromContext(ctx), TopicPrefix: e.cfg.Kafka.TopicPrefix,
			})
			if err == nil {
				return next
			}
		}
		switch {
		case store.IsConflict(err):
			cur, lerr := e.store.Load(ctx, claimed.Key)
			if _, pruned := store.AsPruned(lerr); pruned {
				// Settled and pruned while this call ran longer than the
				// tool's dedup window: the journal that could keep the
				// outcome as evidence is gone.
				e.log.ErrorContext(ctx, "outcome of a pruned operation could not be journaled", "operation_key", claimed.Key,
					"event_type", spec.Type, "attempt", spec.Attempt)
				return base
			}
			if lerr != nil {
				err = lerr
				break
			}
			base = cur
			spec = asLate(spec)
			continue
		case errors.Is(err, events.ErrIllegalTransition):
			// The newer state does not accept even evidence of this kind;
			// keep the outcome in the log rather than lose it silently.
			e.log.ErrorContext(ctx, "outcome could not be journaled", "operation_key", claimed.Key,
				"event_type", spec.Type, "attempt", spec.Attempt, "error", err)
			return base
		}
		if e.cfg.Now().After(deadline) {
			e.log.ErrorContext(ctx, "giving up journaling an outcome; the lease sweep will reconcile it",
				"operation_key", claimed.Key, "event_type", spec.Type, "error", err)
			return base
		}
		e.log.WarnContext(ctx, "journaling an outcome failed, retrying", "operation_key", claimed.Key, "error", err)
		time.Sleep(backoff)
		backoff = min(backoff*2, 5*time.Second)
	}
}

// asLate marks an outcome as reported by a worker that lost its lease, and
// strips the scheduling decision it carried: the newer state decides.
func asLate(s events.Spec) events.Spec {
	switch d := s.Data.(type) {
	case *events.AttemptSucceededData:
		c := *d
		c.Late = true
		s.Data = &c
	case *events.AttemptFailedData:
		c := *d
		c.Late, c.RetryAt = true, nil
		s.Data = &c
	case *events.AttemptUnknownData:
		c := *d
		c.Late, c.RetryAt, c.Next = true, nil, events.NextReconcile
		s.Data = &c
	case *events.CompensationSucceededData:
		c := *d
		c.RetryAt = nil
		s.Data = &c
	}
	return s
}

// heartbeat renews the lease of a long call until stop is called.
func (e *Executor) heartbeat(ctx context.Context, op events.Operation) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(e.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ok, err := e.store.ExtendLease(ctx, op.Key, op.Seq, e.cfg.Now().Add(e.cfg.Lease))
				if err != nil {
					e.log.WarnContext(ctx, "renewing a lease failed", "operation_key", op.Key, "error", err)
				} else if !ok {
					e.log.WarnContext(ctx, "lease lost during a call; its outcome will be journaled as late evidence",
						"operation_key", op.Key, "attempt", op.Attempt)
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// afterOutcome schedules the next step in this process when it is due soon;
// the poller is the safety net if this process dies first.
func (e *Executor) afterOutcome(ctx context.Context, op events.Operation) {
	metrics.RecordSettled(ctx, e.tel.e2e, op)
	if op.Status != events.StatusPending || op.DueAt == nil {
		return
	}
	d := op.DueAt.Sub(e.cfg.Now())
	if d > 2*e.cfg.PollInterval+time.Second {
		return
	}
	key := op.Key
	time.AfterFunc(max(d, 0), func() {
		select {
		case e.kicks <- key:
		default: // the poller will find it
		}
	})
}

func requestEvidence(op events.Operation, t tool.Tool) json.RawMessage {
	req := map[string]any{
		"operation_key": op.Key,
		"tool":          op.Tool,
		"principal":     op.Principal,
		"args":          tool.Scrub(t.Spec(), op.Args, op.Args),
	}
	b, _ := json.Marshal(req)
	return b
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// queryString matches the query of a URL quoted in an error message: a URL
// template may put args into the query, and net/http quotes the whole URL
// in its errors, which are journaled as evidence.
var queryString = regexp.MustCompile(`\?[^\s"']*`)

func errText(err error) string {
	if err == nil {
		return ""
	}
	s := queryString.ReplaceAllString(err.Error(), "?…")
	if len(s) > 500 {
		s = s[:500]
	}
	return s
}
