package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/effectline/effectline/events"
)

func TestOutcomeOfEveryStatusAndPhase(t *testing.T) {
	rejection := &events.Failure{Kind: events.Final, StatusCode: 422,
		Response: json.RawMessage(`{"error":"amount exceeds order total"}`)}
	cases := []struct {
		name      string
		op        events.Operation
		state     events.State
		retryable bool
		next      events.AgentStep
		reason    []string // substrings the reason must contain
		result    string
	}{
		{"pending fresh", events.Operation{Status: events.StatusPending, Phase: events.PhaseAttempt},
			events.StatePending, false, events.StepWait, nil, "null"},
		{"pending retry after a retryable failure", events.Operation{Status: events.StatusPending, Phase: events.PhaseAttempt,
			LastErrorClass: "http_503", LastFailure: &events.Failure{Kind: events.Retryable, StatusCode: 503}},
			events.StatePending, false, events.StepWait, []string{"http_503", "downstream answered 503", "retry scheduled"}, "null"},
		{"pending compensation", events.Operation{Status: events.StatusPending, Phase: events.PhaseCompensation, LastErrorClass: "timeout"},
			events.StatePending, false, events.StepWait, []string{"timeout"}, "null"},
		{"in progress attempt", events.Operation{Status: events.StatusInProgress, Phase: events.PhaseAttempt},
			events.StatePending, false, events.StepWait, nil, "null"},
		{"in progress compensation", events.Operation{Status: events.StatusInProgress, Phase: events.PhaseCompensation},
			events.StatePending, false, events.StepWait, nil, "null"},
		{"completed", events.Operation{Status: events.StatusCompleted, Phase: events.PhaseAttempt, Result: json.RawMessage(`{"id":"ch_1"}`)},
			events.StateSucceeded, false, events.StepDone, nil, `{"id":"ch_1"}`},
		{"completed without a body", events.Operation{Status: events.StatusCompleted, Phase: events.PhaseAttempt},
			events.StateSucceeded, false, events.StepDone, nil, "null"},
		{"failed 422 with the downstream's answer", events.Operation{Status: events.StatusFailed, Phase: events.PhaseAttempt,
			LastErrorClass: "http_422", LastFailure: rejection},
			events.StateFailed, false, events.StepFixArgs, []string{"http_422", "downstream answered 422", "amount exceeds order total"}, "null"},
		{"failed 400", events.Operation{Status: events.StatusFailed, LastErrorClass: "http_400",
			LastFailure: &events.Failure{Kind: events.Final, StatusCode: 400}},
			events.StateFailed, false, events.StepFixArgs, []string{"http_400"}, "null"},
		{"failed invalid args", events.Operation{Status: events.StatusFailed, LastErrorClass: "invalid_args",
			LastFailure: &events.Failure{Kind: events.Final}},
			events.StateFailed, false, events.StepFixArgs, []string{"invalid_args"}, "null"},
		{"failed 403", events.Operation{Status: events.StatusFailed, LastErrorClass: "http_403",
			LastFailure: &events.Failure{Kind: events.Final, StatusCode: 403}},
			events.StateFailed, false, events.StepAskHuman, []string{"http_403"}, "null"},
		{"failed retryable, caps spent", events.Operation{Status: events.StatusFailed, LastErrorClass: "connection_refused",
			LastFailure: &events.Failure{Kind: events.Retryable}},
			events.StateFailed, true, events.StepDone, []string{"connection_refused"}, "null"},
		{"abandoned", events.Operation{Status: events.StatusFailed, LastErrorClass: "abandoned"},
			events.StateFailed, false, events.StepDone, []string{"abandoned"}, "null"},
		{"compensated", events.Operation{Status: events.StatusCompensated, LastErrorClass: "timeout"},
			events.StateFailed, true, events.StepDone, []string{"compensated", "undone"}, "null"},
		{"needs reconciliation", events.Operation{Status: events.StatusNeedsReconciliation, Phase: events.PhaseAttempt, LastErrorClass: "timeout_after_send"},
			events.StateUnknown, false, events.StepAskHuman, []string{"timeout_after_send", "may have happened", "do not retry"}, "null"},
		{"needs reconciliation after a failed undo", events.Operation{Status: events.StatusNeedsReconciliation, Phase: events.PhaseCompensation, LastErrorClass: "undo_timeout"},
			events.StateUnknown, false, events.StepAskHuman, []string{"undo_timeout", "do not retry"}, "null"},
		{"escalated", events.Operation{Status: events.StatusEscalated, LastErrorClass: "http_502",
			Escalation: &events.EscalationData{Reason: "unknown_outcome"}},
			events.StateUnknown, false, events.StepAskHuman, []string{"unknown_outcome", "a human was asked", "do not retry"}, "null"},
	}
	seen := map[events.Status]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seen[c.op.Status] = true
			o := events.OutcomeOf(c.op)
			if o.State != c.state || o.Retryable != c.retryable || o.Next != c.next {
				t.Errorf("OutcomeOf = {state %s retryable %t next %s}, want {%s %t %s}",
					o.State, o.Retryable, o.Next, c.state, c.retryable, c.next)
			}
			for _, want := range c.reason {
				if !strings.Contains(o.Reason, want) {
					t.Errorf("reason %q does not say %q", o.Reason, want)
				}
			}
			if string(o.Result) != c.result {
				t.Errorf("result = %s, want %s", o.Result, c.result)
			}
			if o.State.Settled() == (c.state == events.StatePending) {
				t.Errorf("Settled() = %t for %s", o.State.Settled(), o.State)
			}
			if _, err := json.Marshal(o); err != nil {
				t.Errorf("the outcome does not marshal: %v", err)
			}
		})
	}
	for _, s := range events.Statuses() {
		if !seen[s] {
			t.Errorf("no case for status %s", s)
		}
	}
}

// The fold keeps a rejection's answer for the outcome, and drops it once a
// later outcome is the news.
func TestFoldKeepsTheDownstreamsAnswer(t *testing.T) {
	answer := json.RawMessage(`{"error":"amount exceeds order total"}`)
	failed := step{events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422",
		StatusCode: 422, Response: answer}}
	op := foldSteps(t, events.Irreversible, []step{intentStep(), startedStep(1, testKey), failed})
	o := events.OutcomeOf(op)
	if o.State != events.StateFailed || o.Next != events.StepFixArgs || !strings.Contains(o.Reason, string(answer)) {
		t.Fatalf("outcome of a 422 = %+v", o)
	}

	retry := step{events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Retryable, ErrorClass: "http_503",
		StatusCode: 503, RetryAt: &retryAt, Response: json.RawMessage(`"busy"`)}}
	op = foldSteps(t, events.Idempotent, []step{intentStep(), startedStep(1, testKey), retry, startedStep(2, testKey), succeededStep(2)})
	if op.LastFailure != nil {
		t.Errorf("a success left the earlier failure on the record: %+v", op.LastFailure)
	}
	if o := events.OutcomeOf(op); o.State != events.StateSucceeded || o.Reason != "" {
		t.Errorf("outcome after a retried success = %+v", o)
	}
}

func TestCapResponse(t *testing.T) {
	small := json.RawMessage(`{"error":"no"}`)
	if got := events.CapResponse(small); string(got) != string(small) {
		t.Errorf("CapResponse changed a small answer: %s", got)
	}
	big, _ := json.Marshal(map[string]string{"error": strings.Repeat("é\"<", 3000)})
	got := events.CapResponse(big)
	if len(got) > events.MaxResponseBytes {
		t.Fatalf("capped answer is %d bytes", len(got))
	}
	var s string
	if err := json.Unmarshal(got, &s); err != nil || !utf8.ValidString(s) || !strings.HasSuffix(s, "(truncated)") {
		t.Errorf("capped answer is not a truncated JSON string: %v %q", err, got[:64])
	}
	if !strings.HasPrefix(s, `{"error":"é`) {
		t.Errorf("capped answer does not begin like the answer: %q", s[:32])
	}
}
