package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// recheckTimeout bounds the decision-time ask: an approver is waiting.
const recheckTimeout = 10 * time.Second

// WithTools lets Decide apply the tools' approval rules (not_requester) and
// ask the downstream again before a retry or an abandon of an operation
// whose outcome is unknown. Without it neither happens.
func WithTools(t Tools) DecideOption {
	return func(o *decideOptions) { o.tools = t }
}

// WithSeenDownstream attaches to a record_success what the approver saw
// downstream: the effect's downstream id and its record (either may be
// empty). It is refused with any other action.
func WithSeenDownstream(downstreamID string, result json.RawMessage) DecideOption {
	return func(o *decideOptions) { o.seenID, o.seenResult = downstreamID, result }
}

// gate is what the tool's rules say about a decision on op, before anything
// is journaled: nil to go ahead.
func (o *decideOptions) gate(op events.Operation, action events.Action, approver string) error {
	if o.tools == nil {
		return nil
	}
	t, ok := o.tools.Get(op.Tool)
	if !ok {
		return nil
	}
	if a := t.Spec().Gate(); a != nil && a.NotRequester && approver == op.Principal {
		return fmt.Errorf("%w: %s submitted %s, and tool %q wants another approver", events.ErrRequesterCannotDecide,
			approver, op.Key, op.Tool)
	}
	if esc := op.Escalation; action == events.ActionRetry && esc != nil && esc.Reason == events.ReasonApprovalRequired &&
		slices.Contains(op.Approvals, approver) {
		return &InvalidDecisionError{OperationKey: op.Key, Action: action,
			Reason: fmt.Sprintf("%s already approved; %d distinct approvers must decide retry", approver, max(esc.Approvers, 1))}
	}
	return nil
}

// unknownOutcome reports whether op waits for a decision because nobody
// knows whether its effect happened: an attempt went out (the approval
// gate's question comes before any).
func unknownOutcome(op events.Operation) bool {
	if op.Attempt == 0 {
		return false
	}
	return op.Status == events.StatusNeedsReconciliation ||
		(op.Status == events.StatusEscalated && (op.Escalation == nil || op.Escalation.Reason != events.ReasonApprovalRequired))
}

// recheck asks the downstream again, at decision time, whether the effect
// of op happened: the approver decided on evidence that may be old, and a
// retry of an effect that happened meanwhile would double it. It returns
// the reconciliation to journal when the effect shows, or nil.
func (o *decideOptions) recheck(ctx context.Context, op events.Operation, action events.Action) *events.ReconciliationResolvedData {
	if o.tools == nil || (action != events.ActionRetry && action != events.ActionAbandon) || !unknownOutcome(op) {
		return nil
	}
	t, ok := o.tools.Get(op.Tool)
	if !ok {
		return nil
	}
	rec, ok := t.(tool.Reconciler)
	if !ok || !t.Spec().CanReconcile {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	defer cancel()
	ans := rec.Reconcile(ctx, tool.Call{
		OperationKey:  op.Key,
		DownstreamKey: firstNonEmpty(op.DownstreamKey, events.DownstreamKeyFor(op.Key, op.Compensations)),
		DownstreamID:  op.DownstreamID,
		UndoRef:       op.UndoRef,
		Principal:     op.Principal,
		Attempt:       op.Attempt,
		Args:          op.Args,
	})
	if ans.Answer != tool.Found {
		return nil // absent or cannot tell: the approver's decision stands
	}
	var body json.RawMessage
	if len(ans.Body) > 0 {
		body = downstreamBody(op, t.Spec(), ans.Body)
	}
	return &events.ReconciliationResolvedData{Found: true, Result: body, DownstreamID: ans.DownstreamID,
		Source: "reconcile"}
}
