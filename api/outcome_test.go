package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// A settled operation's resubmission answers 200 with its record, whatever
// it settled as, and the record's outcome carries the downstream's answer.
func TestSettledResubmissionAnswers200WithTheOutcome(t *testing.T) {
	f := setup(t)
	cases := []struct {
		key   string
		after []ev
		state events.State
		next  events.AgentStep
		says  string
	}{
		{"order-1/charge", []ev{{events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422",
			StatusCode: 422, Response: json.RawMessage(`{"error":"amount exceeds order total"}`)}}},
			events.StateFailed, events.StepFixArgs, "amount exceeds order total"},
		{"order-2/charge", []ev{{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile}}},
			events.StateUnknown, events.StepAskHuman, "do not retry"},
		{"order-3/charge", []ev{{events.AttemptSucceeded, 1, events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"ch_3"}`)}}},
			events.StateSucceeded, events.StepDone, ""},
	}
	for _, c := range cases {
		wantStatus(t, f.post(t, billingToken, c.key, "payments.charge", chargeArgs), http.StatusAccepted)
		op := load(t, f.store, c.key)
		op = journal(t, f.store, op, c.key, "payments.charge", events.Irreversible,
			ev{events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: c.key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)}})
		journal(t, f.store, op, c.key, "payments.charge", events.Irreversible, c.after...)

		r := f.post(t, billingToken, c.key, "payments.charge", chargeArgs)
		wantStatus(t, r, http.StatusOK)
		var rec struct {
			OperationKey string                  `json:"operation_key"`
			Outcome      events.OperationOutcome `json:"outcome"`
		}
		if err := json.Unmarshal(r.body, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.OperationKey != c.key || rec.Outcome.State != c.state || rec.Outcome.Next != c.next ||
			!strings.Contains(rec.Outcome.Reason, c.says) {
			t.Errorf("%s: 200 record's outcome = %+v, want state %s next %s saying %q", c.key, rec.Outcome, c.state, c.next, c.says)
		}
		g := f.do(t, http.MethodGet, operationHref(c.key), billingToken, "")
		wantStatus(t, g, http.StatusOK)
		if !strings.Contains(string(g.body), `"outcome":{"state":"`+string(c.state)+`"`) {
			t.Errorf("GET record of %s lacks its outcome: %s", c.key, g.body)
		}
	}
}
