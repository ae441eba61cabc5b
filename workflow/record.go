package workflow

import (
	"encoding/json"

	"github.com/effectline/effectline/events"
)

// stepData is what templates see of the completed steps.
func stepData(r events.Workflow) map[string]StepData {
	out := map[string]StepData{}
	for _, s := range r.Steps {
		if s.Status != events.StepCompleted && s.Status != events.StepUndoing && s.Status != events.StepUndone {
			continue
		}
		var res any
		if len(s.Result) > 0 {
			_ = json.Unmarshal(s.Result, &res)
		}
		out[s.Name] = StepData{Result: res, DownstreamID: s.DownstreamID}
	}
	return out
}

// newRecord is the record of a run before its first event.
func newRecord(d *Def, id string) events.Workflow {
	r := events.Workflow{WorkflowID: id, Workflow: d.Name}
	for _, s := range d.Steps {
		r.Steps = append(r.Steps, events.WorkflowStep{Name: s.Name, Tool: s.Tool, Effect: s.Effect, Status: events.StepPending})
	}
	return r
}

// stepDecls is the plan workflow.started journals: the steps as declared
// now, so the run's record folds from its events alone.
func stepDecls(d *Def) []events.WorkflowStepDecl {
	out := make([]events.WorkflowStepDecl, len(d.Steps))
	for i, s := range d.Steps {
		out[i] = events.WorkflowStepDecl{Name: s.Name, Tool: s.Tool, Effect: s.Effect}
	}
	return out
}
