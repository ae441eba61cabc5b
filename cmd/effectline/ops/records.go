package ops

import (
	"encoding/json"
	"time"
)

// Operation is the part of the API's operation record this tool shows.
// Fields the server adds later are kept whole in --json output, which
// passes the server's record through rather than this struct.
type Operation struct {
	OperationKey   string          `json:"operation_key"`
	Tool           string          `json:"tool"`
	EffectClass    string          `json:"effect_class"`
	PayloadHash    string          `json:"payload_hash"`
	Principal      string          `json:"principal"`
	Status         string          `json:"status"`
	Attempt        int             `json:"attempt"`
	LeaseUntil     *time.Time      `json:"lease_until"`
	Result         json.RawMessage `json:"result"`
	DownstreamID   string          `json:"downstream_id"`
	UndoRef        string          `json:"undo_ref"`
	LastErrorClass string          `json:"last_error_class"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	Seq            int64           `json:"seq"`
	Outcome        *Outcome        `json:"outcome"`
	Escalation     *Escalation     `json:"escalation"`
	Events         []Event         `json:"events"`
}

// Outcome is what the agent is told about the operation, when the server
// reports it.
type Outcome struct {
	State     string `json:"state"`
	Retryable bool   `json:"retryable"`
	Reason    string `json:"reason"`
	Next      string `json:"next"`
}

// Escalation is the evidence an approver decides on.
type Escalation struct {
	Reason         string          `json:"reason"`
	Request        json.RawMessage `json:"request"`
	Downstream     json.RawMessage `json:"downstream"`
	ProposedAction string          `json:"proposed_action"`
	Detail         string          `json:"detail"`
}

// Event is one journaled event of an operation, in the envelope the API
// answers (arguments already redacted by the server).
type Event struct {
	EventID      string          `json:"event_id"`
	Type         string          `json:"type"`
	OperationKey string          `json:"operation_key"`
	Seq          int64           `json:"seq"`
	OccurredAt   time.Time       `json:"occurred_at"`
	Tool         string          `json:"tool"`
	EffectClass  string          `json:"effect_class"`
	Attempt      int             `json:"attempt,omitempty"`
	Data         json.RawMessage `json:"data"`

	// raw is the event as the server sent it, for --json.
	raw json.RawMessage
}

// settled reports whether nothing more happens to an operation in this
// status without a person: it ended (completed, failed, compensated), or
// it waits for a decision (needs_reconciliation, escalated). A watch ends
// there. The outcome, when the server gives one, says the same in the
// agent's terms: anything but pending.
func (o Operation) settled() bool {
	if o.Outcome != nil && o.Outcome.State != "" {
		return o.Outcome.State != "pending"
	}
	switch o.Status {
	case "completed", "failed", "compensated", "needs_reconciliation", "escalated":
		return true
	}
	return false
}

// Workflow is the part of a workflow record (GET /v1/workflows/{id}) this
// tool shows: what it runs, where it stands, and its steps.
type Workflow struct {
	WorkflowID string         `json:"workflow_id"`
	Workflow   string         `json:"workflow"`
	Status     string         `json:"status"`
	Principal  string         `json:"principal"`
	Current    string         `json:"current_step"`
	Awaiting   string         `json:"awaiting"`
	Steps      []WorkflowStep `json:"steps"`
	CreatedAt  time.Time      `json:"created_at"`
	UpdatedAt  time.Time      `json:"updated_at"`
}

// WorkflowStep is one step of a workflow record.
type WorkflowStep struct {
	Name         string `json:"name"`
	Tool         string `json:"tool"`
	EffectClass  string `json:"effect_class"`
	Status       string `json:"status"`
	OperationKey string `json:"operation_key"`
	DownstreamID string `json:"downstream_id"`
}

// workflowPage is GET /v1/workflows.
type workflowPage struct {
	Workflows []Workflow `json:"workflows"`
}
