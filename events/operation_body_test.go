package events

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestOperationBodyAndColumnsAreTheWholeRecord: the body leaves out
// exactly OmittedFromBody, and the body with those six set again is the
// operation, on the fast writer's path and on encoding/json's (approvals).
func TestOperationBodyAndColumnsAreTheWholeRecord(t *testing.T) {
	at := time.Date(2026, 12, 4, 20, 29, 41, 258750370, time.UTC)
	ptr := func(d time.Duration) *time.Time { t := at.Add(d); return &t }
	rich := Operation{
		Key: "rich-1", Tool: "payments.charge", EffectClass: Compensable, PayloadHash: "f50d36c1",
		Principal: "agent-7", Args: json.RawMessage(`{"amount":100}`), Status: StatusInProgress, Phase: PhaseCompensation, Attempt: 3,
		LeaseOwner: "worker-2", LeaseUntil: ptr(30 * time.Second), DueAt: ptr(time.Minute),
		Result: json.RawMessage(`{"id":"ch_9","amount":100}`), DownstreamID: "ch_9", UndoRef: "re_1",
		DownstreamKey: "rich-1/c1", Compensations: 1, Approved: true,
		LastErrorClass: "http_503", LastFailure: &Failure{Kind: Retryable, StatusCode: 503, Response: json.RawMessage(`{"e":"busy"}`)},
		Evidence: 2, Escalation: &EscalationData{Reason: "r", Request: json.RawMessage(`{"a":1}`), ProposedAction: ActionRetry, Approvers: 2},
		Seq: 9, FirstAttemptAt: ptr(time.Second), LastAttemptAt: ptr(2 * time.Second), LastOutcomeAt: ptr(3 * time.Second),
		CreatedAt: at, UpdatedAt: at.Add(4 * time.Second),
	}
	withApprovals := rich
	withApprovals.Approvals = []string{"alice", "bob"}
	for name, op := range map[string]Operation{"fast": rich, "approvals": withApprovals} {
		body, err := MarshalOperationBody(op)
		if err != nil {
			t.Fatal(err)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil {
			t.Fatal(err)
		}
		full, _ := MarshalOperation(op)
		var all map[string]json.RawMessage
		if err := json.Unmarshal(full, &all); err != nil {
			t.Fatal(err)
		}
		for k := range all {
			_, inBody := members[k]
			if inBody == slices.Contains(OmittedFromBody, k) {
				t.Errorf("%s: member %q in the body: %t", name, k, inBody)
			}
		}
		got, err := UnmarshalOperation(body)
		if err != nil {
			t.Fatal(err)
		}
		got.Key, got.Tool, got.EffectClass, got.PayloadHash, got.Status, got.Seq = op.Key, op.Tool, op.EffectClass, op.PayloadHash, op.Status, op.Seq
		if !reflect.DeepEqual(got, op) {
			t.Errorf("%s: body and columns give\n%+v\nwant\n%+v", name, got, op)
		}
	}
}
