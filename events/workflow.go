package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The workflow vocabulary: a workflow is a declared saga whose steps are
// operations. Its own events form one stream per workflow id, journaled
// beside the operations' and published to the workflows topic.

// TopicWorkflows is the suffix of the topic workflow events go to.
const TopicWorkflows = "workflows"

// WorkflowStatus is the state of one workflow run.
type WorkflowStatus string

const (
	// WorkflowRunning: a step is in force (its operation not settled yet).
	WorkflowRunning WorkflowStatus = "running"
	// WorkflowCompleted: every step completed.
	WorkflowCompleted WorkflowStatus = "completed"
	// WorkflowUnwinding: completed steps are being undone, last first.
	WorkflowUnwinding WorkflowStatus = "unwinding"
	// WorkflowUnwound: every undoable completed step was undone.
	WorkflowUnwound WorkflowStatus = "unwound"
	// WorkflowEscalated: waiting for an approver's decision.
	WorkflowEscalated WorkflowStatus = "escalated"
	// WorkflowAbandoned: an approver gave it up; nothing more runs.
	WorkflowAbandoned WorkflowStatus = "abandoned"
)

// WorkflowStatuses lists every workflow status.
func WorkflowStatuses() []WorkflowStatus {
	return []WorkflowStatus{WorkflowRunning, WorkflowCompleted, WorkflowUnwinding,
		WorkflowUnwound, WorkflowEscalated, WorkflowAbandoned}
}

// Valid reports whether s is one of WorkflowStatuses.
func (s WorkflowStatus) Valid() bool {
	for _, v := range WorkflowStatuses() {
		if s == v {
			return true
		}
	}
	return false
}

// Active reports whether the workflow waits on one of its operations.
func (s WorkflowStatus) Active() bool { return s == WorkflowRunning || s == WorkflowUnwinding }

// Terminal reports whether nothing more happens to the workflow.
func (s WorkflowStatus) Terminal() bool {
	return s == WorkflowCompleted || s == WorkflowUnwound || s == WorkflowAbandoned
}

// WorkflowType is a workflow event type name.
type WorkflowType string

const (
	WorkflowStarted          WorkflowType = "workflow.started"
	WorkflowStepCompleted    WorkflowType = "workflow.step_completed"
	WorkflowCompletedEvent   WorkflowType = "workflow.completed"
	WorkflowUnwindingEvent   WorkflowType = "workflow.unwinding"
	WorkflowUnwoundEvent     WorkflowType = "workflow.unwound"
	WorkflowEscalatedEvent   WorkflowType = "workflow.escalated"
	WorkflowDecisionRecorded WorkflowType = "workflow.decision_recorded"
	// WorkflowStepUndone extends the list: one completed step's undo
	// settled during an unwind. The next undo is recorded in the same
	// transaction, which is what keeps the unwind in reverse order across a
	// crash.
	WorkflowStepUndone WorkflowType = "workflow.step_undone"
)

// WorkflowTypes lists every workflow event type.
func WorkflowTypes() []WorkflowType {
	return []WorkflowType{WorkflowStarted, WorkflowStepCompleted, WorkflowCompletedEvent,
		WorkflowUnwindingEvent, WorkflowUnwoundEvent, WorkflowEscalatedEvent,
		WorkflowDecisionRecorded, WorkflowStepUndone}
}

// WorkflowAction is a decision an approver records on an escalated workflow.
type WorkflowAction string

const (
	// WorkflowRetryStep runs the failed step again under a new operation key.
	WorkflowRetryStep WorkflowAction = "retry_step"
	// WorkflowUnwind undoes the completed steps: undo_with for irreversible
	// ones that name it, compensate for compensable ones, last first.
	WorkflowUnwind WorkflowAction = "unwind"
	// WorkflowAbandon ends the workflow as it stands.
	WorkflowAbandon WorkflowAction = "abandon"
)

// WorkflowActions lists every workflow decision.
func WorkflowActions() []WorkflowAction {
	return []WorkflowAction{WorkflowRetryStep, WorkflowUnwind, WorkflowAbandon}
}

// ParseWorkflowAction returns the action named s.
func ParseWorkflowAction(s string) (WorkflowAction, error) {
	for _, a := range WorkflowActions() {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown action %q (want retry_step, unwind or abandon)", s)
}

// WorkflowEnvelope is the JSON shape of every workflow event. Seq orders one
// workflow's events; (workflow_id, seq) is unique.
type WorkflowEnvelope struct {
	EventID    string          `json:"event_id"`
	Type       WorkflowType    `json:"type"`
	WorkflowID string          `json:"workflow_id"`
	Workflow   string          `json:"workflow"`
	Seq        int64           `json:"seq"`
	OccurredAt time.Time       `json:"occurred_at"`
	Data       json.RawMessage `json:"data"`
}

// NewWorkflowEvent builds an envelope with a fresh event id.
func NewWorkflowEvent(t WorkflowType, id, workflow string, seq int64, data any, at time.Time) (WorkflowEnvelope, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return WorkflowEnvelope{}, fmt.Errorf("encoding %s data: %w", t, err)
	}
	return WorkflowEnvelope{EventID: NewID(), Type: t, WorkflowID: id, Workflow: workflow,
		Seq: seq, OccurredAt: at.UTC(), Data: raw}, nil
}

// WorkflowStartedData is the data of workflow.started.
type WorkflowStartedData struct {
	Input     json.RawMessage `json:"input"`
	InputHash string          `json:"input_hash"`
	Principal string          `json:"principal"`
	// Step and OperationKey name the first step, whose intent the same
	// transaction recorded.
	Step         string `json:"step"`
	OperationKey string `json:"operation_key"`
	// Steps declares the run's steps as the tools file had them at the
	// start (an extension: runs started before it name their steps only
	// in later events), so a consumer folds the record from the events
	// alone, whatever the tools file says later.
	Steps []WorkflowStepDecl `json:"steps,omitempty"`
}

// WorkflowStepCompletedData is the data of workflow.step_completed.
type WorkflowStepCompletedData struct {
	Step         string          `json:"step"`
	OperationKey string          `json:"operation_key"`
	Result       json.RawMessage `json:"result,omitempty"`
	DownstreamID string          `json:"downstream_id,omitempty"`
	// DownstreamKey and UndoRef are what an undo of the step needs.
	DownstreamKey string `json:"downstream_key,omitempty"`
	UndoRef       string `json:"undo_ref,omitempty"`
	// Next and NextOperationKey name the step whose intent the same
	// transaction recorded; absent after the last step.
	Next             string `json:"next,omitempty"`
	NextOperationKey string `json:"next_operation_key,omitempty"`
}

// WorkflowUnwindingData is the data of workflow.unwinding.
type WorkflowUnwindingData struct {
	// Step is the step whose end started the unwind (absent for an
	// approver's unwind decision, which names no step).
	Step   string `json:"step,omitempty"`
	Reason string `json:"reason"`
	// Undo lists the steps to undo, in the order they will be undone.
	Undo []string `json:"undo"`
	// OperationKey is the first undo's operation, recorded in the same
	// transaction; absent when there is nothing to undo.
	OperationKey string `json:"operation_key,omitempty"`
}

// WorkflowStepUndoneData is the data of workflow.step_undone.
type WorkflowStepUndoneData struct {
	Step         string `json:"step"`
	OperationKey string `json:"operation_key"`
	// Next and NextOperationKey name the next undo, recorded in the same
	// transaction; absent after the last one.
	Next             string `json:"next,omitempty"`
	NextOperationKey string `json:"next_operation_key,omitempty"`
}

// WorkflowEscalatedData is the data of workflow.escalated: the evidence an
// approver needs.
type WorkflowEscalatedData struct {
	Step         string `json:"step"`
	OperationKey string `json:"operation_key,omitempty"`
	// OperationStatus is how the step's operation ended.
	OperationStatus Status `json:"operation_status,omitempty"`
	Reason          string `json:"reason"`
	// StepsDone lists the steps completed so far, in order.
	StepsDone []string `json:"steps_done"`
	// Undo is true when the step that failed was an undo.
	Undo bool `json:"undo,omitempty"`
}

// WorkflowDecisionData is the data of workflow.decision_recorded.
type WorkflowDecisionData struct {
	Action   WorkflowAction `json:"action"`
	Note     string         `json:"note,omitempty"`
	Approver string         `json:"approver"`
	// OperationKey is the operation the decision recorded an intent for
	// (the retried step, or the first undo), in the same transaction.
	OperationKey string `json:"operation_key,omitempty"`
}

// WorkflowCompletedData is the data of workflow.completed.
type WorkflowCompletedData struct {
	Steps []string `json:"steps"`
}

// WorkflowUnwoundData is the data of workflow.unwound.
type WorkflowUnwoundData struct {
	// Undone lists the steps undone, in the order they were.
	Undone []string `json:"undone"`
}

// StepWorkflowID returns the workflow run a step's or an undo's operation
// key names, "wf:<workflow id>/<step>[~undo]". Neither a workflow id nor a
// step name holds a '/', so the id is everything up to the first one. An
// agent's own keys of that shape (outbox.OperationKey) parse too, naming a
// run the engine may not have.
func StepWorkflowID(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "wf:")
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "/")
	if !ok || id == "" {
		return "", false
	}
	return id, true
}
