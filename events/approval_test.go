package events_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/effectline/effectline/events"
)

// TestFoldCountsDistinctApprovers: in the approval gate, the fold lets the
// first attempt run only after as many distinct approvers as the escalation
// asks for decided retry; a repeated approver does not count twice.
func TestFoldCountsDistinctApprovers(t *testing.T) {
	t.Parallel()
	gate := events.EscalationData{Reason: events.ReasonApprovalRequired, Request: json.RawMessage(`{}`),
		ProposedAction: events.ActionRetry, Approvers: 2}
	retryBy := func(who string) step {
		return step{events.DecisionRecorded, 0, events.DecisionData{Action: events.ActionRetry, Approver: who, RetryAt: &retryAt}}
	}
	waiting := hist(hPending0, []step{{events.OperationEscalated, 0, gate}, retryBy("alice"), retryBy("alice")})
	op := foldSteps(t, events.Irreversible, waiting)
	if op.Status != events.StatusEscalated || op.Approved || !slices.Equal(op.Approvals, []string{"alice"}) || op.Escalation == nil {
		t.Fatalf("after alice twice: %s approved=%v approvals=%v escalation=%v", op.Status, op.Approved, op.Approvals, op.Escalation)
	}
	op = foldSteps(t, events.Irreversible, hist(waiting, []step{retryBy("bob")}))
	if op.Status != events.StatusPending || !op.Approved || !slices.Equal(op.Approvals, []string{"alice", "bob"}) {
		t.Fatalf("after bob: %s approved=%v approvals=%v", op.Status, op.Approved, op.Approvals)
	}
	// An escalation that names no count needs one approver, as before.
	op = foldSteps(t, events.Irreversible, hist(hEscalated0, []step{decisionStep(events.ActionRetry, &retryAt)}))
	if op.Status != events.StatusPending || !op.Approved {
		t.Fatalf("one approver: %s approved=%v", op.Status, op.Approved)
	}
}

// TestRecordSuccessCarriesWhatWasSeen: record_success may bring the
// downstream id and the result the approver saw.
func TestRecordSuccessCarriesWhatWasSeen(t *testing.T) {
	t.Parallel()
	d := events.DecisionData{Action: events.ActionRecordSuccess, Approver: "alice",
		DownstreamID: "ch_9", Result: json.RawMessage(`{"id":"ch_9"}`)}
	op := foldSteps(t, events.Irreversible, hist(hEscalated, []step{{events.DecisionRecorded, 0, d}}))
	if op.Status != events.StatusCompleted || op.DownstreamID != "ch_9" || string(op.Result) != `{"id":"ch_9"}` {
		t.Fatalf("record_success: %s %q %s", op.Status, op.DownstreamID, op.Result)
	}
}
