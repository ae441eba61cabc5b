package reconciler

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Escalation reasons (EscalationData.Reason) the reconciler writes.
const (
	// ReasonAbsentDownstream: the downstream provably has no effect for the
	// key, and the class or the caps forbid an automatic retry.
	ReasonAbsentDownstream = "absent_downstream"
	// ReasonCannotTell: the downstream was asked MaxAsks times and never
	// gave an answer.
	ReasonCannotTell = "cannot_tell"
	// ReasonCannotAsk: the tool has no reconcile request (or is no longer
	// registered), so nobody can ask.
	ReasonCannotAsk = "cannot_ask"
	// ReasonCompensationFailed: the undo failed or its outcome is unknown,
	// and the downstream still shows the effect.
	ReasonCompensationFailed = "compensation_failed"
)

// SourceReconcile is ReconciliationResolvedData.Source for an answer of the
// tool's reconcile request.
const SourceReconcile = "reconcile"

// answerCannotAsk extends tool.Answer for a tool nobody can ask.
const answerCannotAsk tool.Answer = "cannot_ask"

// verdict is what one answer means for an operation.
type verdict struct {
	// reask: no events; ask again after a backoff.
	reask bool
	specs []events.Spec
	// escalation is set when specs escalate, for the span and the metric.
	escalation *events.EscalationData
	// rule names the rule that applied, for the log and the trace.
	rule string
}

// question is what an answer is about: a reloaded record that still asks
// the same question may reuse the answer after a lost append race.
type question struct {
	attempt       int
	phase         events.Phase
	downstreamKey string
}

func questionOf(op events.Operation) question {
	return question{attempt: op.Attempt, phase: op.Phase, downstreamKey: op.DownstreamKey}
}

// plan decides what an answer to "did it happen?" means for op, an operation
// in needs_reconciliation. It does no I/O. spec is nil when the tool is no
// longer registered. asks counts the answers so far, this one included.
//
// After an unknown attempt (phase attempt):
//
//	found        → reconciliation.resolved{found}: the operation completes with
//	               the downstream's record as its result; no new attempt.
//	absent       → idempotent or compensable with attempts and deadline left:
//	               reconciliation.resolved{found:false, retry_at:now}, and the
//	               executor's due-time poller runs the retry. Otherwise
//	               (irreversible, or the caps are spent) resolved{found:false}
//	               and operation.escalated{absent_downstream, retry} in the same
//	               append: nothing happened, so a retry is safe, but only a
//	               human may grant one the policy does not.
//	cannot tell  → ask again with backoff; after MaxAsks answers, escalate
//	               {cannot_tell} with the proposal of proposeUnknown.
//	cannot ask   → escalate {cannot_ask} at once, same proposal.
//
// After a failed or unknown undo (phase compensation):
//
//	found        → the effect still stands: escalate {compensation_failed,
//	               compensate}.
//	absent       → the undo happened, or the effect never did. A retry is only
//	               safe under a new downstream key: a receiver that keeps keys
//	               replays the stored answer of the undone effect for the old
//	               one, and the operation would "complete" with nothing in
//	               place. The fold advances the key only on
//	               compensation.succeeded, so reconciliation.resolved{retry_at}
//	               is written only if it would give a new key (retryNeedsNewKey);
//	               otherwise escalate {absent_downstream, compensate}: running
//	               the undo again is a no-op for an absent effect and leads to
//	               the retry under a new key (or to compensated, caps spent).
//	cannot tell,
//	cannot ask   → as above, proposing compensate.
func plan(op events.Operation, spec *tool.Spec, ans tool.Reconciliation, asks, maxAsks int, now time.Time) verdict {
	if ans.Answer == tool.CannotTell && asks < maxAsks {
		return verdict{reask: true, rule: fmt.Sprintf("cannot tell (ask %d of %d): ask again", asks, maxAsks)}
	}
	if op.Phase == events.PhaseCompensation {
		return planCompensation(op, spec, ans, asks, now)
	}
	return planAttempt(op, spec, ans, asks, now)
}

func planAttempt(op events.Operation, spec *tool.Spec, ans tool.Reconciliation, asks int, now time.Time) verdict {
	switch ans.Answer {
	case tool.Found:
		ans.Body = downstreamBody(op, spec, ans.Body)
		return verdict{rule: "found: record success", specs: []events.Spec{resolved(op, ans, true, nil)}}
	case tool.Absent:
		if retryAllowed(op, spec, now) {
			return verdict{rule: "absent: retry within the caps (" + string(op.EffectClass) + ")",
				specs: []events.Spec{resolved(op, ans, false, &now)}}
		}
		esc := &events.EscalationData{
			Reason:         ReasonAbsentDownstream,
			Request:        requestEvidence(op, spec),
			Downstream:     downstreamEvidence(op, spec, ans, asks),
			ProposedAction: events.ActionRetry,
			Detail:         absentDetail(op, spec),
		}
		return verdict{rule: "absent: escalate", escalation: esc,
			specs: []events.Spec{resolved(op, ans, false, nil), escalated(esc)}}
	}
	action, detail := proposeUnknown(op, ans)
	esc := &events.EscalationData{
		Reason:         ReasonCannotTell,
		Request:        requestEvidence(op, spec),
		Downstream:     downstreamEvidence(op, spec, ans, asks),
		ProposedAction: action,
		Detail:         detail,
	}
	if ans.Answer == answerCannotAsk {
		esc.Reason = ReasonCannotAsk
	}
	return verdict{rule: esc.Reason + ": escalate", escalation: esc, specs: []events.Spec{escalated(esc)}}
}

func planCompensation(op events.Operation, spec *tool.Spec, ans tool.Reconciliation, asks int, now time.Time) verdict {
	esc := &events.EscalationData{
		Request:        requestEvidence(op, spec),
		Downstream:     downstreamEvidence(op, spec, ans, asks),
		ProposedAction: events.ActionCompensate,
	}
	switch ans.Answer {
	case tool.Found:
		esc.Reason = ReasonCompensationFailed
		esc.Detail = fmt.Sprintf("The undo of attempt %d did not go through (%s) and the downstream still shows the effect "+
			"for key %s. Compensate runs the undo again; record_success keeps the effect as the operation's result.",
			op.Attempt, orDefault(op.LastErrorClass, "unknown"), op.DownstreamKey)
	case tool.Absent:
		if retryAllowed(op, spec, now) {
			if ev := resolved(op, ans, false, &now); retryNeedsNewKey(op, ev, now) {
				return verdict{rule: "undo unconfirmed, effect absent: retry under a new key", specs: []events.Spec{ev}}
			}
		}
		esc.Reason = ReasonAbsentDownstream
		esc.Detail = fmt.Sprintf("The outcome of the undo of attempt %d is unknown (%s), and the downstream shows no live effect "+
			"for key %s: the undo happened or the effect never did. A retry under the same key could be answered with the "+
			"undone effect's stored result; compensate runs the undo again (a no-op now) and then retries under a new key "+
			"within the caps.", op.Attempt, orDefault(op.LastErrorClass, "unknown"), op.DownstreamKey)
	default:
		esc.Reason = ReasonCannotTell
		if ans.Answer == answerCannotAsk {
			esc.Reason = ReasonCannotAsk
		}
		esc.Detail = fmt.Sprintf("The undo of attempt %d did not go through (%s) and the downstream cannot say whether the "+
			"effect for key %s still stands. Compensate runs the undo again, which succeeds whether or not the effect exists.",
			op.Attempt, orDefault(op.LastErrorClass, "unknown"), op.DownstreamKey)
	}
	return verdict{rule: esc.Reason + " after a failed undo: escalate", escalation: esc, specs: []events.Spec{escalated(esc)}}
}

// retryAllowed reports whether the class and the caps allow another
// attempt without a human: idempotent and compensable effects, with
// attempts and deadline left. Irreversible effects never retry on their own.
func retryAllowed(op events.Operation, spec *tool.Spec, now time.Time) bool {
	if spec == nil || (op.EffectClass != events.Idempotent && op.EffectClass != events.Compensable) {
		return false
	}
	caps := spec.Caps.WithDefaults()
	if op.Attempt >= caps.MaxAttempts {
		return false
	}
	return op.FirstAttemptAt == nil || !now.After(op.FirstAttemptAt.Add(caps.Deadline))
}

// retryNeedsNewKey reports whether the resolution ev, applied to op, would
// send the next attempt under a downstream key other than the one whose undo
// may have run.
func retryNeedsNewKey(op events.Operation, ev events.Spec, now time.Time) bool {
	evs, err := events.Following(op, now, ev)
	if err != nil {
		return false
	}
	next, err := events.Apply(op, evs[0])
	if err != nil {
		return false
	}
	return events.DownstreamKeyFor(next.Key, next.Compensations) != op.DownstreamKey
}

// proposeUnknown is the proposed action when nobody could say whether the
// attempt happened. The rule never proposes abandon: marking failed an effect
// that may have happened is exactly the collapse of Unknown into Failed that
// contract §2 forbids, so only a human who checked may choose it.
//
//   - idempotent: retry. The retry carries the same downstream key, which the
//     receiver deduplicates, so it is safe whether or not the first landed.
//   - compensable: compensate. The undo succeeds whether or not the effect
//     exists, and the retry that follows goes out under a new key.
//   - irreversible: record_success only with evidence that it happened — the
//     downstream named an id for the key even though it could not give a
//     clean answer, or the record holds a downstream id for this attempt
//     (from a late report that could not settle it). Otherwise retry, with a
//     detail that spells out the risk: no automatic action is right here,
//     and the approver must check the downstream before choosing.
func proposeUnknown(op events.Operation, ans tool.Reconciliation) (events.Action, string) {
	why := "the downstream could not say whether it happened"
	if ans.Answer == answerCannotAsk {
		why = "the tool has no reconcile request, so nobody could ask whether it happened"
	}
	switch op.EffectClass {
	case events.Idempotent:
		return events.ActionRetry, fmt.Sprintf("Attempt %d's outcome is unknown and %s. The effect is idempotent: a retry "+
			"under the same key %s is deduplicated by the receiver.", op.Attempt, why, op.DownstreamKey)
	case events.Compensable:
		if op.Attempt > 0 {
			return events.ActionCompensate, fmt.Sprintf("Attempt %d's outcome is unknown and %s. Compensate runs the undo "+
				"(a no-op if nothing happened), then retries under a new key.", op.Attempt, why)
		}
	}
	if id := firstNonEmpty(ans.DownstreamID, op.DownstreamID); id != "" {
		return events.ActionRecordSuccess, fmt.Sprintf("Attempt %d's outcome is unknown and %s, but the downstream knows "+
			"the effect as %s: it most likely happened. Confirm it there, then record success.", op.Attempt, why, id)
	}
	return events.ActionRetry, fmt.Sprintf("Attempt %d's outcome is unknown and %s. This effect is irreversible: a retry "+
		"may do it twice. The retry reuses key %s, which protects only if the downstream honors it. Check the "+
		"downstream first: record_success if it shows the effect, retry only if it provably does not.",
		op.Attempt, why, op.DownstreamKey)
}

func absentDetail(op events.Operation, spec *tool.Spec) string {
	if spec == nil {
		return fmt.Sprintf("The downstream shows no effect for key %s, but tool %q is no longer registered, so no retry "+
			"policy applies.", op.DownstreamKey, op.Tool)
	}
	if op.EffectClass == events.Irreversible {
		return fmt.Sprintf("The downstream shows no effect for key %s: attempt %d did not happen. The effect is "+
			"irreversible, so it is never retried without a decision; retry is safe now.", op.DownstreamKey, op.Attempt)
	}
	return fmt.Sprintf("The downstream shows no effect for key %s, and the retry caps are spent (%d attempts). "+
		"Retry grants one more attempt.", op.DownstreamKey, op.Attempt)
}

func resolved(op events.Operation, ans tool.Reconciliation, found bool, retryAt *time.Time) events.Spec {
	d := &events.ReconciliationResolvedData{Found: found, Source: SourceReconcile}
	if found {
		d.Result = validJSON(ans.Body)
		d.DownstreamID = firstNonEmpty(ans.DownstreamID, op.DownstreamID)
	}
	if retryAt != nil {
		t := retryAt.UTC()
		d.RetryAt = &t
	}
	return events.Spec{Type: events.ReconciliationResolved, Data: d}
}

func escalated(esc *events.EscalationData) events.Spec {
	return events.Spec{Type: events.OperationEscalated, Data: esc}
}

// validJSON returns b if it is a JSON value, else b as a JSON string (nil
// for nothing), so a stored result always encodes.
func validJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
