package workflow

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
)

// Step statuses in a workflow record.
const (
	StepPending   = "pending"
	StepRunning   = "running"
	StepCompleted = "completed"
	StepFailed    = "failed"
	StepUndoing   = "undoing"
	StepUndone    = "undone"
)

// Record is the state of one workflow run: the fold of its events.
type Record struct {
	WorkflowID string                `json:"workflow_id"`
	Workflow   string                `json:"workflow"`
	Status     events.WorkflowStatus `json:"status"`
	Input      json.RawMessage       `json:"input"`
	InputHash  string                `json:"input_hash"`
	Principal  string                `json:"principal"`
	Steps      []StepState           `json:"steps"`
	// Current is the step in force, or the one that failed.
	Current string `json:"current_step,omitempty"`
	// Awaiting is the operation the run waits on: a step's, or an undo's.
	Awaiting string `json:"awaiting,omitempty"`
	// Undo is what an unwind still has to undo, the one in force first.
	Undo       []string                      `json:"undo,omitempty"`
	Escalation *events.WorkflowEscalatedData `json:"escalation,omitempty"`
	Decisions  []events.WorkflowDecisionData `json:"decisions,omitempty"`
	Seq        int64                         `json:"seq"`
	CreatedAt  time.Time                     `json:"created_at"`
	UpdatedAt  time.Time                     `json:"updated_at"`
	Events     []events.WorkflowEnvelope     `json:"events,omitempty"`
	Operations map[string]OperationSummary   `json:"operations,omitempty"`
}

// OperationSummary is what a workflow's reader sees of one of its
// operations: enough to tell what is waiting and why.
type OperationSummary struct {
	Status         events.Status `json:"status"`
	Attempt        int           `json:"attempt"`
	LastErrorClass string        `json:"last_error_class,omitempty"`
}

// StepState is one step of a run.
type StepState struct {
	Name   string             `json:"name"`
	Tool   string             `json:"tool"`
	Effect events.EffectClass `json:"effect_class"`
	Status string             `json:"status"`
	// OperationKey is the step's operation (the latest, after a retry).
	OperationKey  string          `json:"operation_key,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	DownstreamID  string          `json:"downstream_id,omitempty"`
	DownstreamKey string          `json:"downstream_key,omitempty"`
	UndoRef       string          `json:"undo_ref,omitempty"`
	UndoKey       string          `json:"undo_operation_key,omitempty"`
	Retries       int             `json:"retries,omitempty"`
	UndoRetries   int             `json:"undo_retries,omitempty"`
}

func (r *Record) step(name string) *StepState {
	for i := range r.Steps {
		if r.Steps[i].Name == name {
			return &r.Steps[i]
		}
	}
	return nil
}

func (r *Record) stepIndex(name string) int {
	for i := range r.Steps {
		if r.Steps[i].Name == name {
			return i
		}
	}
	return -1
}

// done lists the completed steps, in order.
func (r *Record) done() []string {
	out := []string{}
	for _, s := range r.Steps {
		if s.Status == StepCompleted {
			out = append(out, s.Name)
		}
	}
	return out
}

// stepData is what templates see of the completed steps.
func (r *Record) stepData() map[string]StepData {
	out := map[string]StepData{}
	for _, s := range r.Steps {
		if s.Status != StepCompleted && s.Status != StepUndoing && s.Status != StepUndone {
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

// apply folds one event onto r. It is pure: the driver computes the next
// head with it, and a reader could rebuild every head from the journal.
func apply(r Record, e events.WorkflowEnvelope) (Record, error) {
	if e.Seq != r.Seq+1 {
		return r, fmt.Errorf("workflow %s: event seq %d after seq %d", r.WorkflowID, e.Seq, r.Seq)
	}
	next := r
	next.Steps = append([]StepState(nil), r.Steps...)
	next.Undo = append([]string(nil), r.Undo...)
	next.Seq = e.Seq
	next.UpdatedAt = e.OccurredAt
	switch e.Type {
	case events.WorkflowStarted:
		var d events.WorkflowStartedData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		next.Status, next.Input, next.InputHash, next.Principal = events.WorkflowRunning, d.Input, d.InputHash, d.Principal
		next.CreatedAt = e.OccurredAt
		next.start(d.Step, d.OperationKey)
	case events.WorkflowStepCompleted:
		var d events.WorkflowStepCompletedData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		s := next.step(d.Step)
		if s == nil {
			return r, fmt.Errorf("workflow %s: no step %q", r.WorkflowID, d.Step)
		}
		s.Status, s.Result, s.DownstreamID, s.DownstreamKey, s.UndoRef = StepCompleted, d.Result, d.DownstreamID, d.DownstreamKey, d.UndoRef
		next.Awaiting = ""
		if d.Next != "" {
			next.start(d.Next, d.NextOperationKey)
		}
	case events.WorkflowCompletedEvent:
		next.Status, next.Current, next.Awaiting = events.WorkflowCompleted, "", ""
	case events.WorkflowUnwindingEvent:
		var d events.WorkflowUnwindingData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		next.Status, next.Escalation = events.WorkflowUnwinding, nil
		if s := next.step(d.Step); s != nil && s.Status == StepRunning {
			s.Status = StepFailed
		}
		next.Undo = d.Undo
		next.Awaiting = d.OperationKey
		if len(d.Undo) > 0 {
			s := next.step(d.Undo[0])
			if s.UndoKey != "" {
				s.UndoRetries++
			}
			s.Status, s.UndoKey = StepUndoing, d.OperationKey
		}
	case events.WorkflowStepUndone:
		var d events.WorkflowStepUndoneData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		if s := next.step(d.Step); s != nil {
			s.Status = StepUndone
		}
		if len(next.Undo) > 0 {
			next.Undo = next.Undo[1:]
		}
		next.Awaiting = ""
		if d.Next != "" {
			s := next.step(d.Next)
			s.Status, s.UndoKey = StepUndoing, d.NextOperationKey
			next.Awaiting = d.NextOperationKey
		}
	case events.WorkflowUnwoundEvent:
		next.Status, next.Awaiting, next.Undo = events.WorkflowUnwound, "", nil
	case events.WorkflowEscalatedEvent:
		var d events.WorkflowEscalatedData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		next.Status, next.Awaiting, next.Escalation = events.WorkflowEscalated, "", &d
		if s := next.step(d.Step); s != nil && s.Status == StepRunning {
			s.Status = StepFailed
		}
		if !d.Undo {
			next.Current = d.Step
		}
	case events.WorkflowDecisionRecorded:
		var d events.WorkflowDecisionData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return r, err
		}
		next.Decisions = append(append([]events.WorkflowDecisionData(nil), r.Decisions...), d)
		switch d.Action {
		case events.WorkflowAbandon:
			next.Status, next.Awaiting = events.WorkflowAbandoned, ""
		case events.WorkflowRetryStep:
			esc := r.Escalation
			next.Escalation = nil
			if esc != nil && esc.Undo {
				s := next.step(esc.Step)
				s.Status, s.UndoKey, s.UndoRetries = StepUndoing, d.OperationKey, s.UndoRetries+1
				next.Status = events.WorkflowUnwinding
			} else if esc != nil {
				s := next.step(esc.Step)
				s.Retries++
				next.Status = events.WorkflowRunning
				next.start(esc.Step, d.OperationKey)
			}
			next.Awaiting = d.OperationKey
		}
	default:
		return r, fmt.Errorf("workflow %s: unknown event type %q", r.WorkflowID, e.Type)
	}
	return next, nil
}

func (r *Record) start(step, key string) {
	if s := r.step(step); s != nil {
		s.Status, s.OperationKey = StepRunning, key
	}
	r.Current, r.Awaiting = step, key
}

// newRecord is the record of a run before its first event.
func newRecord(d *Def, id string) Record {
	r := Record{WorkflowID: id, Workflow: d.Name}
	for _, s := range d.Steps {
		r.Steps = append(r.Steps, StepState{Name: s.Name, Tool: s.Tool, Effect: s.Effect, Status: StepPending})
	}
	return r
}
