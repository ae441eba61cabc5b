package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

func wfEvent(t *testing.T, typ events.WorkflowType, id string, seq int64, data any) events.WorkflowEnvelope {
	t.Helper()
	e, err := events.NewWorkflowEvent(typ, id, "order", seq, data, time.Date(2026, 12, 1, 9, 0, int(seq), 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// A run journaled before workflow.started declared its steps folds too:
// its steps appear as its events name them, and no event about an unknown
// step fails or panics.
func TestApplyWorkflowWithoutDeclaredSteps(t *testing.T) {
	t.Parallel()
	evs := []events.WorkflowEnvelope{
		wfEvent(t, events.WorkflowStarted, "w", 1, events.WorkflowStartedData{Input: json.RawMessage(`{}`), InputHash: "h",
			Principal: "p", Step: "reserve", OperationKey: "wf:w/reserve"}),
		wfEvent(t, events.WorkflowStepCompleted, "w", 2, events.WorkflowStepCompletedData{Step: "reserve", OperationKey: "wf:w/reserve",
			Next: "charge", NextOperationKey: "wf:w/charge"}),
		wfEvent(t, events.WorkflowUnwindingEvent, "w", 3, events.WorkflowUnwindingData{Step: "charge", Reason: "failed",
			Undo: []string{"reserve"}, OperationKey: "wf:w/reserve~undo"}),
		wfEvent(t, events.WorkflowStepUndone, "w", 4, events.WorkflowStepUndoneData{Step: "reserve", OperationKey: "wf:w/reserve~undo"}),
		wfEvent(t, events.WorkflowUnwoundEvent, "w", 5, events.WorkflowUnwoundData{Undone: []string{"reserve"}}),
	}
	var w events.Workflow
	for _, e := range evs {
		next, err := events.ApplyWorkflow(w, e)
		if err != nil {
			t.Fatalf("seq %d: %v", e.Seq, err)
		}
		w = next
	}
	if w.Status != events.WorkflowUnwound || len(w.Steps) != 2 || w.Steps[0].Status != events.StepUndone || w.Steps[1].Status != events.StepFailed {
		t.Errorf("record = %+v", w)
	}
}

func TestApplyWorkflowRefusesWhatDoesNotFollow(t *testing.T) {
	t.Parallel()
	started := wfEvent(t, events.WorkflowStarted, "w", 1, events.WorkflowStartedData{Input: json.RawMessage(`{}`), Principal: "p",
		Steps: []events.WorkflowStepDecl{{Name: "a", Tool: "t", Effect: events.Idempotent}}, Step: "a", OperationKey: "wf:w/a"})
	w, err := events.ApplyWorkflow(events.Workflow{}, started)
	if err != nil || w.Seq != 1 || len(w.Steps) != 1 || w.Steps[0].Status != events.StepRunning || w.Awaiting != "wf:w/a" {
		t.Fatalf("after workflow.started: %+v, %v", w, err)
	}
	for name, e := range map[string]events.WorkflowEnvelope{
		"a seq that does not follow": wfEvent(t, events.WorkflowCompletedEvent, "w", 3, events.WorkflowCompletedData{}),
		"another run's event":        wfEvent(t, events.WorkflowCompletedEvent, "v", 2, events.WorkflowCompletedData{}),
		"a second start":             wfEvent(t, events.WorkflowStarted, "w", 2, events.WorkflowStartedData{}),
		"data of another shape":      {Type: events.WorkflowEscalatedEvent, WorkflowID: "w", Seq: 2, Data: json.RawMessage(`{"steps_done":"x"}`)},
		"an unknown type":            {Type: "workflow.paused", WorkflowID: "w", Seq: 2, Data: json.RawMessage(`{}`)},
	} {
		if next, err := events.ApplyWorkflow(w, e); err == nil {
			t.Errorf("%s folded: %+v", name, next)
		}
	}
}

func TestDecodeWorkflow(t *testing.T) {
	t.Parallel()
	good := `{"event_id":"e","type":"workflow.completed","workflow_id":"w","workflow":"order","seq":2,"occurred_at":"2026-12-01T09:00:00Z","data":{"steps":[]},"extra":1}`
	if e, err := events.DecodeWorkflow([]byte(good)); err != nil || e.WorkflowID != "w" || e.Seq != 2 {
		t.Errorf("DecodeWorkflow(good) = %+v, %v", e, err)
	}
	for _, bad := range []string{`not json`, `{"type":"workflow.completed","seq":2,"data":{}}`,
		`{"type":"workflow.completed","workflow_id":"w","seq":0,"data":{}}`,
		`{"type":"workflow.later","workflow_id":"w","seq":1,"data":{}}`,
		`{"type":"workflow.completed","workflow_id":"w","seq":1,"data":[]}`} {
		if _, err := events.DecodeWorkflow([]byte(bad)); !events.IsInvalidEvent(err) {
			t.Errorf("DecodeWorkflow(%s) = %v; want an invalid event", bad, err)
		}
	}
}

func TestStepWorkflowID(t *testing.T) {
	for key, want := range map[string]string{"wf:w1/charge": "w1", "wf:w1/charge~undo": "w1", "wf:/x": "", "wf:w1": "", "order-1": ""} {
		got, ok := events.StepWorkflowID(key)
		if got != want || ok != (want != "") {
			t.Errorf("StepWorkflowID(%q) = %q, %t; want %q", key, got, ok, want)
		}
	}
}
