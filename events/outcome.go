package events

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// State is what an agent learns about its operation: one of three settled
// answers, or not yet. It is coarser than Status on purpose: an agent
// chooses its next step from it without knowing the executor's phases.
type State string

const (
	// StatePending: not settled; waiting longer may give an answer.
	StatePending State = "pending"
	// StateSucceeded: the effect happened (completed).
	StateSucceeded State = "succeeded"
	// StateFailed: confirmed that no effect stands (failed, compensated,
	// abandoned).
	StateFailed State = "failed"
	// StateUnknown: the effect may have happened (needs_reconciliation,
	// escalated). Never to be read as failed.
	StateUnknown State = "unknown"
)

// Settled reports whether the state is an answer rather than "not yet".
// Unknown is settled: it will not turn into an answer by the agent waiting
// a little longer, only by reconciliation or a human.
func (s State) Settled() bool { return s != StatePending && s != "" }

// AgentStep is what the outcome advises the agent to do next.
type AgentStep string

const (
	// StepWait: nothing settled yet; wait (or ask again) for the outcome.
	StepWait AgentStep = "wait"
	// StepDone: nothing more will happen to this operation.
	StepDone AgentStep = "done"
	// StepFixArgs: the downstream refused the args; a corrected request
	// under a new operation key may succeed.
	StepFixArgs AgentStep = "fix_args"
	// StepAskHuman: the agent cannot resolve this alone; never retry it.
	StepAskHuman AgentStep = "ask_human"
)

// Failure is the confirmed failure of an attempt as the record keeps it.
type Failure struct {
	Kind       FailureKind     `json:"kind"`
	StatusCode int             `json:"status_code,omitempty"`
	Response   json.RawMessage `json:"response,omitempty"`
}

// OperationOutcome is the agent's view of an operation: its State, whether
// a new attempt could change a failure, why, what to do next, and the
// stored result of a success.
type OperationOutcome struct {
	State     State           `json:"state"`
	Retryable bool            `json:"retryable"`
	Reason    string          `json:"reason"`
	Next      AgentStep       `json:"next"`
	Result    json.RawMessage `json:"result"`
}

// OutcomeOf derives the outcome from the folded record alone, so every
// reader (API, MCP, client) tells the same story for the same record.
func OutcomeOf(op Operation) OperationOutcome {
	switch op.Status {
	case StatusCompleted:
		res := op.Result
		if len(res) == 0 {
			res = json.RawMessage("null")
		}
		return OperationOutcome{State: StateSucceeded, Next: StepDone, Result: res}
	case StatusFailed:
		return failedOutcome(op)
	case StatusCompensated:
		return OperationOutcome{State: StateFailed, Retryable: true, Next: StepDone, Result: null(),
			Reason: join("compensated", "every attempt that may have taken effect was undone and the retries are spent", op.LastErrorClass)}
	case StatusNeedsReconciliation:
		return OperationOutcome{State: StateUnknown, Next: StepAskHuman, Result: null(),
			Reason: join(orWord(op.LastErrorClass, "unknown"), "the effect may have happened; effectline is finding out, do not retry")}
	case StatusEscalated:
		why := orWord(op.LastErrorClass, "unknown")
		if op.Escalation != nil && op.Escalation.Reason != "" {
			why = op.Escalation.Reason
		}
		return OperationOutcome{State: StateUnknown, Next: StepAskHuman, Result: null(),
			Reason: join(why, "the effect may have happened; a human was asked, do not retry")}
	}
	// pending, in_progress, or an empty record.
	o := OperationOutcome{State: StatePending, Next: StepWait, Result: null()}
	if op.LastErrorClass != "" {
		o.Reason = join(op.LastErrorClass, "retry scheduled")
		if f := op.LastFailure; f != nil {
			o.Reason = join(op.LastErrorClass, downstreamSaid(f), "retry scheduled")
		}
	}
	return o
}

func failedOutcome(op Operation) OperationOutcome {
	o := OperationOutcome{State: StateFailed, Next: StepDone, Result: null()}
	if op.LastErrorClass == "abandoned" {
		o.Reason = "abandoned: a human decided the effect must not happen"
		return o
	}
	f := op.LastFailure
	if f == nil {
		o.Reason = orWord(op.LastErrorClass, "failed")
		return o
	}
	o.Reason = join(orWord(op.LastErrorClass, "failed"), downstreamSaid(f))
	switch {
	case f.Kind == Retryable:
		// The downstream never took the request on, and the retries are
		// spent: the same request later, under a new key, may go through.
		o.Retryable = true
	case f.StatusCode == 400 || f.StatusCode == 404 || f.StatusCode == 409 || f.StatusCode == 422 ||
		op.LastErrorClass == "invalid_args":
		o.Next = StepFixArgs
	default:
		// 401/403, a misconfigured tool: no change of args helps.
		o.Next = StepAskHuman
	}
	return o
}

// downstreamSaid renders the downstream's answer to a rejection, or "".
func downstreamSaid(f *Failure) string {
	var b strings.Builder
	if f.StatusCode != 0 {
		b.WriteString("downstream answered ")
		b.WriteString(strconv.Itoa(f.StatusCode))
	}
	if len(f.Response) > 0 && string(f.Response) != "null" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.Write(f.Response)
	}
	return b.String()
}

func join(parts ...string) string {
	var nonEmpty []string
	for _, p := range parts {
		if p != "" {
			nonEmpty = append(nonEmpty, p)
		}
	}
	return strings.Join(nonEmpty, "; ")
}

func orWord(s, word string) string {
	if s == "" {
		return word
	}
	return s
}

func null() json.RawMessage { return json.RawMessage("null") }

// CapResponse returns a downstream's answer as it may be journaled: body
// itself when it is at most MaxResponseBytes, else its text cut to fit (at
// a rune boundary) as a JSON string, so an oversized answer still shows
// how it began.
func CapResponse(body json.RawMessage) json.RawMessage {
	if len(body) <= MaxResponseBytes {
		return body
	}
	const marker = "…(truncated)"
	for cut := MaxResponseBytes - len(marker); cut > 0; cut -= 512 {
		for cut > 0 && !utf8.RuneStart(body[cut]) {
			cut--
		}
		// JSON escapes can make the quoted text longer than its bytes.
		if s, err := json.Marshal(string(body[:cut]) + marker); err == nil && len(s) <= MaxResponseBytes {
			return s
		}
	}
	return json.RawMessage(`"(truncated)"`)
}
