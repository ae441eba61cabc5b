package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/workflow"
)

// startedWorkflows holds one run that Start reports as existing.
type startedWorkflows struct{ fakeWorkflows }

func (f *startedWorkflows) Start(_ context.Context, in workflow.Start) (workflow.Record, bool, error) {
	rec, err := f.Get(context.Background(), in.WorkflowID)
	return rec, false, err
}

func (f *startedWorkflows) List(context.Context, events.WorkflowStatus, int) ([]workflow.Record, error) {
	return []workflow.Record{f.rec}, nil
}

// A workflow run is read like an operation: its principal, approvers and
// readers see it, with its input and results redacted; another principal
// finds nothing, and its start under the same id is key_in_use.
func TestWorkflowsAreScopedAndRedacted(t *testing.T) {
	t.Parallel()
	const card = "4111111111111111"
	rec := running("ord-8", "wf:ord-8/charge")
	rec.Input = json.RawMessage(`{"order_id":"ord-8","card_number":"` + card + `"}`)
	rec.Steps = []workflow.StepState{{Name: "charge", Tool: "payments.charge", Status: workflow.StepCompleted,
		Result: json.RawMessage(`{"id":"ch_8","note":"charged ` + card + `"}`)}}
	rec.Events = []events.WorkflowEnvelope{{Type: events.WorkflowStarted, WorkflowID: "ord-8", Seq: 1,
		Data: json.RawMessage(`{"input":{"card_number":"` + card + `"}}`)}}
	wf := &startedWorkflows{fakeWorkflows{rec: rec}}
	f := setup(t, func(c *Config, d *Deps) { d.Workflows = wf; c.Tokens[anotherToken] = "another-agent" })

	for _, token := range []string{billingToken, opsToken} {
		r := f.do(t, http.MethodGet, workflowHref("ord-8"), token, "")
		wantStatus(t, r, http.StatusOK)
		if strings.Contains(string(r.body), card) {
			t.Errorf("GET of a workflow shows the card number: %s", r.body)
		}
		if !strings.Contains(string(r.body), "ch_8") {
			t.Errorf("GET of a workflow lost its step result: %s", r.body)
		}
	}
	wantError(t, f.do(t, http.MethodGet, workflowHref("ord-8"), anotherToken, ""), http.StatusNotFound, codeNotFound)
	if r := f.do(t, http.MethodGet, "/v1/workflows", anotherToken, ""); strings.Contains(string(r.body), "ord-8") {
		t.Errorf("another principal's list shows the run: %s", r.body)
	}
	if r := f.do(t, http.MethodGet, "/v1/workflows", billingToken, ""); !strings.Contains(string(r.body), "ord-8") || strings.Contains(string(r.body), card) {
		t.Errorf("the owner's list: %s", r.body)
	}
	body := `{"workflow_id":"ord-8","workflow":"order","input":{"order_id":"ord-8"}}`
	dup := f.do(t, http.MethodPost, "/v1/workflows", anotherToken, body)
	wantError(t, dup, http.StatusConflict, codeKeyInUse)
	if strings.Contains(string(dup.body), "ch_8") {
		t.Errorf("key_in_use tells about the run: %s", dup.body)
	}
	wantStatus(t, f.do(t, http.MethodPost, "/v1/workflows", billingToken, body), http.StatusOK)
}
