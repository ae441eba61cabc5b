package reconciler

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// maxConflicts bounds how often one decision is re-made after losing an
// append race; each loss means another writer moved the operation on.
const maxConflicts = 8

// journalTimeout bounds one append of a decision. The append runs on a
// context detached from shutdown: an answer the downstream already gave is
// worth journaling, and the committer outlives the workers.
const journalTimeout = 30 * time.Second

// reconcileJob is the pool's job: one round of "did it happen?" for key.
//
// The races it walks through, all settled by the append's Base:
//
//   - A late success of the attempt races the ask. Both are appends from the
//     same record; if the executor's attempt.succeeded lands first, this
//     append conflicts, the reload shows completed, and the round ends with
//     nothing written. If this lands first, the late success is journaled on
//     top as evidence (the fold keeps the reconciled result).
//   - A webhook resolves the operation while the downstream is asked: same as
//     above, the webhook's transaction appends from the same Base.
//   - An approver decides while the downstream is asked (needs_reconciliation
//     already awaits a decision in the approval UI): conflict, reload, and
//     the operation is no longer in needs_reconciliation — the human wins.
//   - Another replica reconciles the same operation (its consumer got the
//     message, this leader's sweep found it unresolved): both may ask, only
//     one append wins; the loser reloads and finds it settled.
func (r *Reconciler) reconcileJob(ctx context.Context, key, tp string, asks int) (int, time.Duration) {
	op, err := r.store.Load(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		r.log.WarnContext(ctx, "reconcile: no such operation", "operation_key", key)
		return 0, 0
	case err != nil:
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "reconcile: loading the operation failed", "operation_key", key, "error", err)
		}
		return asks, r.cfg.AskBackoff.Max
	}
	if op.Status != events.StatusNeedsReconciliation {
		return 0, 0 // settled already, by anyone
	}
	t, known := r.tools.Get(op.Tool)
	var spec *tool.Spec
	if known {
		spec = t.Spec()
	}
	if tp == "" {
		if stored, err := r.store.Traceparent(ctx, key); err == nil {
			tp = stored
		}
	}
	ctx = traceparent.ContextWith(ctx, tp)
	spanCtx, span := r.tel.startReconciliation(ctx, op)
	defer span.End()

	// Ask. An operation whose tool cannot be asked escalates at once.
	var ans tool.Reconciliation
	rec, canAsk := t.(tool.Reconciler)
	if !known || !canAsk || !spec.CanReconcile {
		ans = tool.Reconciliation{Answer: answerCannotAsk, ErrorClass: "no_reconcile_request"}
	} else {
		release, ok := r.toolSlot(op.Tool)
		if !ok {
			// This tool has its share of workers busy (a slow downstream):
			// leave the worker to other tools and come back shortly.
			span.SetAttributes(semconv.ReconcileAnswer.String("deferred"))
			return asks, r.cfg.AskBackoff.Base
		}
		askCtx, cancel := context.WithTimeout(spanCtx, r.cfg.AskTimeout)
		call := tool.CallOf(op)
		call.DownstreamKey = firstNonEmpty(op.DownstreamKey, events.DownstreamKeyFor(op.Key, op.Compensations))
		ans = rec.Reconcile(askCtx, call)
		cancel()
		release()
		if ctx.Err() != nil {
			// Interrupted by shutdown: the answer is an artefact of the
			// cancellation and decides nothing; the next owner asks again.
			span.SetStatus(codes.Error, "interrupted")
			return asks, 0
		}
		if ans.Answer != tool.Found && ans.Answer != tool.Absent {
			ans.Answer = tool.CannotTell // anything unrecognised is no answer
		}
	}
	asked := asks
	if ans.Answer != answerCannotAsk {
		asked++
	}
	r.tel.reconciled(ctx, span, op, ans, asked)

	jctx, cancel := context.WithTimeout(context.WithoutCancel(spanCtx), journalTimeout)
	defer cancel()
	q := questionOf(op)
	for range maxConflicts {
		now := r.cfg.Now()
		v := plan(op, spec, ans, asked, r.cfg.MaxAsks, now)
		if v.reask {
			r.log.InfoContext(ctx, "downstream cannot tell yet, asking again later", "operation_key", op.Key,
				"tool", op.Tool, "asks", asked, "max_asks", r.cfg.MaxAsks, "error_class", ans.ErrorClass)
			return asked, r.askBackoff(asked)
		}
		evs, err := events.Following(op, now, v.specs...)
		if err != nil {
			r.log.ErrorContext(ctx, "reconcile: building events failed", "operation_key", op.Key, "error", err)
			return 0, 0
		}
		appendCtx := jctx
		var escSpan trace.Span
		if v.escalation != nil {
			appendCtx, escSpan = r.tel.startEscalation(jctx, op, v.escalation)
		}
		next, err := r.committer.Append(jctx, store.Append{
			Base: op, Events: evs, Traceparent: traceparent.FromContext(appendCtx), TopicPrefix: r.cfg.Kafka.TopicPrefix,
		})
		if escSpan != nil {
			endSpan(escSpan, err)
		}
		if err == nil {
			metrics.RecordSettled(ctx, r.tel.e2e, next)
			r.log.InfoContext(ctx, "operation reconciled", "operation_key", op.Key, "tool", op.Tool,
				"answer", ans.Answer, "rule", v.rule, "status", next.Status)
			if v.escalation != nil {
				r.tel.escalated(ctx, op, v.escalation)
				r.log.WarnContext(ctx, "operation escalated to the approval gate", "operation_key", op.Key,
					"tool", op.Tool, "reason", v.escalation.Reason, "proposed_action", v.escalation.ProposedAction)
			}
			return 0, 0
		}
		if !store.IsConflict(err) {
			span.SetStatus(codes.Error, "journaling failed")
			r.log.WarnContext(ctx, "reconcile: journaling the answer failed; asking again later",
				"operation_key", op.Key, "error", err)
			return asks, r.askBackoff(asked)
		}
		// Lost the race: decide again from what the winner wrote.
		op, err = r.store.Load(jctx, key)
		if err != nil {
			return asks, r.askBackoff(asked)
		}
		if op.Status != events.StatusNeedsReconciliation {
			return 0, 0
		}
		if questionOf(op) != q {
			return 0, r.cfg.AskBackoff.Base // another question now: ask it afresh
		}
	}
	r.log.WarnContext(ctx, "reconcile: lost the append race too many times", "operation_key", key)
	return asks, r.askBackoff(asked)
}

// askBackoff is the wait before ask number asks+1: Base·2^(asks-1) capped
// at Max, with equal jitter (half fixed, half random) so re-asks of many
// operations that failed together spread out but never come back at once.
func (r *Reconciler) askBackoff(asks int) time.Duration {
	d := r.cfg.AskBackoff.Base
	for i := 1; i < asks && d < r.cfg.AskBackoff.Max; i++ {
		d *= 2
	}
	d = min(d, r.cfg.AskBackoff.Max)
	j := r.cfg.Rand()
	if j < 0 || j >= 1 {
		j = 0
	}
	return d/2 + time.Duration(j*float64(d/2))
}

// toolSlot takes one of the tool's share of the workers, so a downstream
// that stalls every ask occupies at most that share and the other tools'
// operations keep being reconciled.
func (r *Reconciler) toolSlot(name string) (release func(), ok bool) {
	r.slotsMu.Lock()
	defer r.slotsMu.Unlock()
	if r.toolBusy[name] >= r.perTool {
		return nil, false
	}
	r.toolBusy[name]++
	return func() {
		r.slotsMu.Lock()
		r.toolBusy[name]--
		if r.toolBusy[name] == 0 {
			delete(r.toolBusy, name)
		}
		r.slotsMu.Unlock()
	}, true
}
