package events

import (
	"encoding/json"
	"fmt"
	"time"
)

// The workflow run's record and the one fold of its events. The workflow
// component computes every transition's next head with ApplyWorkflow, and
// the projector folds the same events, from the workflows topic or the
// journal, into the read model with it; so a run's head and its row in
// workflow_state at seq N are the same record.

// StepStatus is the state of one step in a workflow record.
type StepStatus string

const (
	StepPending   StepStatus = "pending"
	StepRunning   StepStatus = "running"
	StepCompleted StepStatus = "completed"
	StepFailed    StepStatus = "failed"
	StepUndoing   StepStatus = "undoing"
	StepUndone    StepStatus = "undone"
)

// StepStatuses lists every step status.
func StepStatuses() []StepStatus {
	return []StepStatus{StepPending, StepRunning, StepCompleted, StepFailed, StepUndoing, StepUndone}
}

// Workflow is the state of one workflow run: the fold of its events.
type Workflow struct {
	WorkflowID string          `json:"workflow_id"`
	Workflow   string          `json:"workflow"`
	Status     WorkflowStatus  `json:"status"`
	Input      json.RawMessage `json:"input"`
	InputHash  string          `json:"input_hash"`
	Principal  string          `json:"principal"`
	Steps      []WorkflowStep  `json:"steps"`
	// Current is the step in force, or the one that failed.
	Current string `json:"current_step,omitempty"`
	// Awaiting is the operation the run waits on: a step's, or an undo's.
	Awaiting string `json:"awaiting,omitempty"`
	// Undo is what an unwind still has to undo, the one in force first.
	Undo       []string               `json:"undo,omitempty"`
	Escalation *WorkflowEscalatedData `json:"escalation,omitempty"`
	Decisions  []WorkflowDecisionData `json:"decisions,omitempty"`
	Seq        int64                  `json:"seq"`
	CreatedAt  time.Time              `json:"created_at"`
	UpdatedAt  time.Time              `json:"updated_at"`
	// Events and Operations are filled by a read of one run (the history
	// and a summary of its operations); they are not part of the fold and
	// are never stored with the record.
	Events     []WorkflowEnvelope           `json:"events,omitempty"`
	Operations map[string]WorkflowOperation `json:"operations,omitempty"`
	// Pruned marks a record read from the tombstone of a run pruned after
	// its retention: only the id, workflow, status, input hash, principal,
	// seq and times are left (UpdatedAt is when it settled). Never set by
	// the fold, never stored.
	Pruned bool `json:"pruned,omitempty"`
}

// WorkflowOperation is what a workflow's reader sees of one of its
// operations: enough to tell what is waiting and why.
type WorkflowOperation struct {
	Status         Status `json:"status"`
	Attempt        int    `json:"attempt"`
	LastErrorClass string `json:"last_error_class,omitempty"`
	// Pruned: the operation was pruned to its tombstone after its tool's
	// dedup window; Status is how it ended.
	Pruned bool `json:"pruned,omitempty"`
}

// WorkflowStep is one step of a run.
type WorkflowStep struct {
	Name   string      `json:"name"`
	Tool   string      `json:"tool"`
	Effect EffectClass `json:"effect_class"`
	Status StepStatus  `json:"status"`
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

// WorkflowStepDecl is a step as workflow.started declares it: the run's
// plan as the tools file had it when the run started.
type WorkflowStepDecl struct {
	Name   string      `json:"name"`
	Tool   string      `json:"tool"`
	Effect EffectClass `json:"effect_class"`
}

// Step returns the step named name, or nil.
func (w *Workflow) Step(name string) *WorkflowStep {
	if i := w.StepIndex(name); i >= 0 {
		return &w.Steps[i]
	}
	return nil
}

// StepIndex returns the index of the step named name, or -1.
func (w *Workflow) StepIndex(name string) int {
	for i := range w.Steps {
		if w.Steps[i].Name == name {
			return i
		}
	}
	return -1
}

// Done lists the completed steps, in order.
func (w *Workflow) Done() []string {
	out := []string{}
	for _, s := range w.Steps {
		if s.Status == StepCompleted {
			out = append(out, s.Name)
		}
	}
	return out
}

// stepNamed returns the step named name, adding it at the end when the
// record does not list it. A run journaled before workflow.started carried
// its steps (its record begins with none) gets its steps as its events
// name them; for every other run the step is there, and a fold never
// fails, or dereferences nothing, on a name it does not know.
func (w *Workflow) stepNamed(name string) *WorkflowStep {
	if s := w.Step(name); s != nil {
		return s
	}
	w.Steps = append(w.Steps, WorkflowStep{Name: name, Status: StepPending})
	return &w.Steps[len(w.Steps)-1]
}

func (w *Workflow) start(step, key string) {
	if step != "" {
		s := w.stepNamed(step)
		s.Status, s.OperationKey = StepRunning, key
	}
	w.Current, w.Awaiting = step, key
}

// ApplyWorkflow folds one event onto w, which must be at the event's seq
// minus one (the empty record for seq 1), and returns the next record. It
// is pure: w is not changed. Every writer of a run's record goes through it:
// the workflow component's transitions, and the projector's live fold and
// rebuild.
func ApplyWorkflow(w Workflow, e WorkflowEnvelope) (Workflow, error) {
	if e.Seq != w.Seq+1 {
		return w, fmt.Errorf("workflow %s: event seq %d after seq %d", e.WorkflowID, e.Seq, w.Seq)
	}
	if w.Seq > 0 && e.WorkflowID != w.WorkflowID {
		return w, fmt.Errorf("workflow %s: event of workflow %s", w.WorkflowID, e.WorkflowID)
	}
	next := w
	next.Steps = append([]WorkflowStep(nil), w.Steps...)
	next.Undo = append([]string(nil), w.Undo...)
	next.Events, next.Operations = nil, nil
	next.Seq = e.Seq
	next.UpdatedAt = e.OccurredAt
	decode := func(v any) error {
		if err := json.Unmarshal(e.Data, v); err != nil {
			return fmt.Errorf("workflow %s seq %d: %s data: %w", e.WorkflowID, e.Seq, e.Type, err)
		}
		return nil
	}
	switch e.Type {
	case WorkflowStarted:
		if w.Seq != 0 {
			return w, fmt.Errorf("workflow %s: %s at seq %d", e.WorkflowID, e.Type, e.Seq)
		}
		var d WorkflowStartedData
		if err := decode(&d); err != nil {
			return w, err
		}
		next.WorkflowID, next.Workflow = e.WorkflowID, e.Workflow
		next.Status, next.Input, next.InputHash, next.Principal = WorkflowRunning, d.Input, d.InputHash, d.Principal
		next.CreatedAt = e.OccurredAt
		if len(d.Steps) > 0 {
			next.Steps = make([]WorkflowStep, len(d.Steps))
			for i, s := range d.Steps {
				next.Steps[i] = WorkflowStep{Name: s.Name, Tool: s.Tool, Effect: s.Effect, Status: StepPending}
			}
		}
		next.start(d.Step, d.OperationKey)
	case WorkflowStepCompleted:
		var d WorkflowStepCompletedData
		if err := decode(&d); err != nil {
			return w, err
		}
		s := next.stepNamed(d.Step)
		s.Status, s.Result, s.DownstreamID, s.DownstreamKey, s.UndoRef = StepCompleted, d.Result, d.DownstreamID, d.DownstreamKey, d.UndoRef
		next.Awaiting = ""
		if d.Next != "" {
			next.start(d.Next, d.NextOperationKey)
		}
	case WorkflowCompletedEvent:
		next.Status, next.Current, next.Awaiting = WorkflowCompleted, "", ""
	case WorkflowUnwindingEvent:
		var d WorkflowUnwindingData
		if err := decode(&d); err != nil {
			return w, err
		}
		next.Status, next.Escalation = WorkflowUnwinding, nil
		if s := next.Step(d.Step); s != nil && s.Status == StepRunning {
			s.Status = StepFailed
		}
		next.Undo = d.Undo
		next.Awaiting = d.OperationKey
		if len(d.Undo) > 0 {
			s := next.stepNamed(d.Undo[0])
			if s.UndoKey != "" {
				s.UndoRetries++
			}
			s.Status, s.UndoKey = StepUndoing, d.OperationKey
		}
	case WorkflowStepUndone:
		var d WorkflowStepUndoneData
		if err := decode(&d); err != nil {
			return w, err
		}
		if s := next.Step(d.Step); s != nil {
			s.Status = StepUndone
		}
		if len(next.Undo) > 0 {
			next.Undo = next.Undo[1:]
		}
		next.Awaiting = ""
		if d.Next != "" {
			s := next.stepNamed(d.Next)
			s.Status, s.UndoKey = StepUndoing, d.NextOperationKey
			next.Awaiting = d.NextOperationKey
		}
	case WorkflowUnwoundEvent:
		next.Status, next.Awaiting, next.Undo = WorkflowUnwound, "", nil
	case WorkflowEscalatedEvent:
		var d WorkflowEscalatedData
		if err := decode(&d); err != nil {
			return w, err
		}
		next.Status, next.Awaiting, next.Escalation = WorkflowEscalated, "", &d
		if s := next.Step(d.Step); s != nil && s.Status == StepRunning {
			s.Status = StepFailed
		}
		if !d.Undo {
			next.Current = d.Step
		}
	case WorkflowDecisionRecorded:
		var d WorkflowDecisionData
		if err := decode(&d); err != nil {
			return w, err
		}
		next.Decisions = append(append([]WorkflowDecisionData(nil), w.Decisions...), d)
		switch d.Action {
		case WorkflowAbandon:
			next.Status, next.Awaiting = WorkflowAbandoned, ""
		case WorkflowRetryStep:
			esc := w.Escalation
			next.Escalation = nil
			if esc != nil && esc.Undo {
				s := next.stepNamed(esc.Step)
				s.Status, s.UndoKey, s.UndoRetries = StepUndoing, d.OperationKey, s.UndoRetries+1
				next.Status = WorkflowUnwinding
			} else if esc != nil {
				next.stepNamed(esc.Step).Retries++
				next.Status = WorkflowRunning
				next.start(esc.Step, d.OperationKey)
			}
			next.Awaiting = d.OperationKey
		}
	default:
		return w, fmt.Errorf("workflow %s: unknown event type %q", e.WorkflowID, e.Type)
	}
	return next, nil
}

// DecodeWorkflow reads a workflow event envelope, as the workflows topic
// carries it, and checks what a fold relies on: a known type, a workflow id,
// a seq from 1 and data that is a JSON object. Members it does not know are
// ignored (the envelope is extended by adding members).
func DecodeWorkflow(raw []byte) (WorkflowEnvelope, error) {
	var e WorkflowEnvelope
	if err := json.Unmarshal(raw, &e); err != nil {
		return WorkflowEnvelope{}, invalid("", "not a workflow event envelope: %v", err)
	}
	switch {
	case e.WorkflowID == "":
		return WorkflowEnvelope{}, invalid("workflow_id", "missing")
	case e.Seq < 1:
		return WorkflowEnvelope{}, invalid("seq", "must be at least 1")
	case !knownWorkflowType(e.Type):
		return WorkflowEnvelope{}, invalid("type", "unknown workflow event type %q", e.Type)
	case len(e.Data) == 0 || e.Data[0] != '{':
		return WorkflowEnvelope{}, invalid("data", "must be a JSON object")
	}
	return e, nil
}

func knownWorkflowType(t WorkflowType) bool {
	for _, v := range WorkflowTypes() {
		if t == v {
			return true
		}
	}
	return false
}

// JournaledWorkflowEvent is a workflow event as the journal holds it: the
// envelope and the trace context it was recorded in (the run's, for every
// event of a run).
type JournaledWorkflowEvent struct {
	WorkflowEnvelope
	Traceparent string
}
