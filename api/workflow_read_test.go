package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/workflow"
)

// startedWorkflows holds one run that Start reports as existing.
type startedWorkflows struct{ fakeWorkflows }

func (f *startedWorkflows) Start(_ context.Context, in workflow.Start) (events.Workflow, bool, error) {
	rec, err := f.Get(context.Background(), in.WorkflowID)
	return rec, false, err
}

// runsOf pages recs as the read model would: narrowed to the filter's
// principal and status, newest first as given.
type runsOf []events.Workflow

func (rs runsOf) ListWorkflows(_ context.Context, f events.WorkflowFilter) (events.WorkflowPage, error) {
	p := events.WorkflowPage{Items: []events.Workflow{}}
	for _, r := range rs {
		if (f.Principal == "" || r.Principal == f.Principal) && (f.Status == "" || r.Status == f.Status) {
			p.Items = append(p.Items, r)
		}
	}
	return p, nil
}

// A workflow run is read like an operation: its principal, approvers and
// readers see it, with its input and results redacted; another principal
// finds nothing, and its start under the same id is key_in_use.
func TestWorkflowsAreScopedAndRedacted(t *testing.T) {
	t.Parallel()
	const card = "4111111111111111"
	rec := running("ord-8", "wf:ord-8/charge")
	rec.Input = json.RawMessage(`{"order_id":"ord-8","card_number":"` + card + `"}`)
	rec.Steps = []events.WorkflowStep{{Name: "charge", Tool: "payments.charge", Status: events.StepCompleted,
		Result: json.RawMessage(`{"id":"ch_8","note":"charged ` + card + `"}`)}}
	rec.Events = []events.WorkflowEnvelope{{Type: events.WorkflowStarted, WorkflowID: "ord-8", Seq: 1,
		Data: json.RawMessage(`{"input":{"card_number":"` + card + `"}}`)}}
	wf := &startedWorkflows{fakeWorkflows{rec: rec}}
	f := setup(t, func(c *Config, d *Deps) {
		d.Workflows, d.WorkflowRuns = wf, runsOf{rec}
		c.Tokens[anotherToken] = "another-agent"
	})

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

// GET /v1/workflows lists from the read model with the status, the read
// rule's principal and the page applied by the query: a principal whose
// runs are older than a page of another's still gets full pages of its
// own, and follows the cursor through all of them. (The list used to take
// the newest runs first and drop the others' after, so such a principal
// got an empty page.)
func TestWorkflowListFiltersBeforeTheLimit(t *testing.T) {
	t.Parallel()
	const card = "4111111111111111"
	var pool *pgxpool.Pool
	f := setup(t, func(c *Config, d *Deps) {
		pool = d.Store.Pool()
		d.Workflows, d.WorkflowRuns = &fakeWorkflows{}, projector.NewReader(pool)
		c.Tokens[anotherToken] = "another-agent"
	})
	at := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)
	add := func(id, principal string, status events.WorkflowStatus) {
		at = at.Add(time.Second)
		rec := events.Workflow{WorkflowID: id, Workflow: "order", Status: status, Principal: principal, Seq: 3,
			Input: json.RawMessage(`{"card_number":"` + card + `"}`), CreatedAt: at, UpdatedAt: at}
		raw, _ := json.Marshal(rec)
		if _, err := pool.Exec(t.Context(), `INSERT INTO workflow_state (workflow_id, workflow, status, principal, seq, record, created_at, updated_at)
			VALUES ($1, 'order', $2, $3, 3, $4, $5, $5)`, id, string(status), principal, raw, at); err != nil {
			t.Fatal(err)
		}
	}
	// billing-agent's runs are the oldest; another principal's fill the
	// newest pages, in every status.
	for i := range 3 {
		add(fmt.Sprintf("billing-%d", i), "billing-agent", events.WorkflowEscalated)
	}
	add("billing-done", "billing-agent", events.WorkflowCompleted)
	for i := range 6 {
		add(fmt.Sprintf("other-%d", i), "another-agent", events.WorkflowEscalated)
		add(fmt.Sprintf("other-done-%d", i), "another-agent", events.WorkflowCompleted)
	}

	pages := func(token, query string) (ids []string, sizes []int) {
		t.Helper()
		path := "/v1/workflows?" + query
		for range 50 {
			r := f.do(t, http.MethodGet, path, token, "")
			wantStatus(t, r, http.StatusOK)
			if strings.Contains(string(r.body), card) {
				t.Errorf("the list shows the card number: %s", r.body)
			}
			var page struct {
				Workflows  []events.Workflow `json:"workflows"`
				NextCursor string            `json:"next_cursor"`
			}
			if err := json.Unmarshal(r.body, &page); err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, len(page.Workflows))
			for _, w := range page.Workflows {
				ids = append(ids, w.WorkflowID)
			}
			if page.NextCursor == "" {
				return ids, sizes
			}
			path = "/v1/workflows?" + query + "&cursor=" + url.QueryEscape(page.NextCursor)
		}
		t.Fatalf("%s: paging does not end", query)
		return nil, nil
	}
	ids, sizes := pages(billingToken, "status=escalated&limit=2")
	if want := []string{"billing-2", "billing-1", "billing-0"}; !slices.Equal(ids, want) || !slices.Equal(sizes, []int{2, 1}) {
		t.Errorf("billing-agent's escalated runs: %v in pages of %v; want %v in pages of [2 1]", ids, sizes, want)
	}
	if ids, _ := pages(billingToken, "limit=3"); len(ids) != 4 || ids[0] != "billing-done" {
		t.Errorf("billing-agent's runs: %v; want its 4, newest first", ids)
	}
	if ids, _ := pages(supportToken, "limit=5"); len(ids) != 0 {
		t.Errorf("a principal with no runs lists %v", ids)
	}
	if ids, sizes := pages(opsToken, "status=escalated&limit=4"); len(ids) != 9 || !slices.Equal(sizes, []int{4, 4, 1}) {
		t.Errorf("the approver's escalated runs: %v in pages of %v; want 9 in pages of [4 4 1]", ids, sizes)
	}
	wantError(t, f.do(t, http.MethodGet, "/v1/workflows?cursor=bogus", opsToken, ""), http.StatusBadRequest, codeInvalidRequest, "cursor")
	wantError(t, f.do(t, http.MethodGet, "/v1/workflows?status=asleep", opsToken, ""), http.StatusBadRequest, codeInvalidRequest, "status")
	wantError(t, f.do(t, http.MethodGet, "/v1/workflows?limit=501", opsToken, ""), http.StatusBadRequest, codeInvalidRequest, "limit")
}
