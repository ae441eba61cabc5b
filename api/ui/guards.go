package ui

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// What an approver needs that a status alone does not say: why an
// operation waits in the approval gate and what approving runs; that for an
// irreversible effect of unknown outcome the first thing to do is look
// downstream, so a retry takes a note and a ticked box; and the latest of
// everything the downstream said, whoever asked.

// unknownIrreversible reports whether op is an irreversible effect whose
// outcome nobody knows: a retry could double it.
func unknownIrreversible(op events.Operation) bool {
	if op.EffectClass != events.Irreversible || op.Attempt == 0 || !op.Status.AwaitingDecision() {
		return false
	}
	if op.Escalation == nil {
		return true // needs_reconciliation: nobody has an answer yet
	}
	switch op.Escalation.Reason {
	case events.ReasonApprovalRequired, "absent_downstream":
		return false // nothing was sent yet, or the downstream showed no effect
	}
	return true
}

// guardForm adjusts a decision form for op: no button is proposed where the
// proposal is "check the downstream", and retry then needs a note and a
// confirmation (uiDecide enforces both).
func guardForm(f *uiDecideForm, op events.Operation) {
	if f == nil || !unknownIrreversible(op) {
		return
	}
	f.CheckFirst = true
	for i := range f.Buttons {
		f.Buttons[i].Proposed = false
		if f.Buttons[i].Action == events.ActionRetry {
			f.Buttons[i].Label = "Retry anyway"
		}
	}
}

// retryRefusal says why a retry posted from the UI is not sent to the
// Decider, or "" when it may be.
func retryRefusal(op events.Operation, note string, confirmed bool) string {
	if !unknownIrreversible(op) {
		return ""
	}
	switch {
	case note == "":
		return "a retry of an irreversible effect whose outcome is unknown needs a note saying what you checked downstream"
	case !confirmed:
		return "tick the box confirming that the downstream shows no effect: a retry of an effect that happened doubles it"
	}
	return ""
}

// gateText says why an approval_required operation waits and what will run
// once it is approved.
func gateText(op events.Operation) (why, willRun string) {
	e := op.Escalation
	if e == nil || e.Reason != events.ReasonApprovalRequired {
		return "", ""
	}
	n := max(e.Approvers, 1)
	why = "The tool's approval rule holds this call before anything is sent."
	if n > 1 {
		why = fmt.Sprintf("The tool's approval rule holds this call before anything is sent: %d distinct approvers must decide retry, %d so far.",
			n, len(op.Approvals))
	}
	willRun = fmt.Sprintf("Approving (retry) sends the first attempt: %s, a %s effect, with the request below, under downstream key %s.",
		op.Tool, op.EffectClass, events.DownstreamKeyFor(op.Key, op.Compensations))
	return why, willRun
}

// latestEvidence picks, from the redacted history, the newest thing the
// downstream said: an escalation's evidence, a reconciliation's answer, a
// precondition's answer, or what an approver recorded with record_success.
func latestEvidence(evs []uiEvent) (shown, when, source string) {
	for i := len(evs) - 1; i >= 0; i-- {
		e := evs[i]
		if e.Data == "" {
			continue
		}
		var d map[string]json.RawMessage
		if json.Unmarshal([]byte(e.Data), &d) != nil {
			continue
		}
		var pick json.RawMessage
		switch events.Type(e.Type) {
		case events.OperationEscalated:
			pick = d["downstream"]
		case events.ReconciliationResolved:
			pick = json.RawMessage(e.Data)
		case events.AttemptSucceeded, events.AttemptFailed, events.AttemptUnknown:
			pick = d["precondition"]
		case events.DecisionRecorded:
			if d["result"] != nil || d["downstream_id"] != nil {
				pick = json.RawMessage(e.Data)
			}
		}
		if len(pick) > 0 && string(pick) != "null" {
			return prettyJSON(pick), e.When, fmt.Sprintf("#%d %s", e.Seq, e.Type)
		}
	}
	return "", "", ""
}

// askTimeout bounds the downstream question a page asks: the approver is
// waiting for the page.
const askTimeout = 3 * time.Second

// askedNow is what the downstream answered when the page was opened.
type askedNow struct {
	Answer string // found, absent or cannot_tell
	When   string
	Body   string
	Error  string
}

// askDownstream asks the tool's reconcile, as the page is opened, whether the
// effect of an operation of unknown outcome happened, so the approver sees
// what the downstream shows now and not only what it showed when the
// operation was escalated. Nothing is journaled: a page view changes
// nothing, and a decision asks again before it is carried out. nil when
// there is nothing to ask (no attempt, no reconcile request).
func askDownstream(ctx context.Context, op events.Operation, t tool.Tool, args json.RawMessage) *askedNow {
	if t == nil || op.Attempt == 0 || !op.Status.AwaitingDecision() || !t.Spec().CanReconcile {
		return nil
	}
	rec, ok := t.(tool.Reconciler)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	ans := rec.Reconcile(ctx, tool.Call{
		OperationKey:  op.Key,
		DownstreamKey: cmp.Or(op.DownstreamKey, events.DownstreamKeyFor(op.Key, op.Compensations)),
		DownstreamID:  op.DownstreamID,
		UndoRef:       op.UndoRef,
		Principal:     op.Principal,
		Attempt:       op.Attempt,
		Args:          args,
	})
	a := &askedNow{Answer: string(ans.Answer), When: stamp(time.Now())}
	if len(ans.Body) > 0 {
		a.Body = prettyJSON(t.Spec().RedactEcho(args, ans.Body))
	}
	if ans.Answer == tool.CannotTell {
		a.Error = ans.ErrorClass
	}
	return a
}
