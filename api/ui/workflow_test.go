package ui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/workflow"
)

// uiWorkflowsFile declares a workflow whose pivot (the charge) comes
// first, so a failure of the reserve after it escalates the run.
const uiWorkflowsFile = uiToolsFile + `
workflows:
  - name: gift
    steps:
      - {name: charge, tool: payments.charge, args: {amount: 500, currency: EUR}}
      - {name: reserve, tool: inventory.reserve, args: {sku: gift-box}}
`

// withWorkflows gives the server the workflow service of uiWorkflowsFile.
func withWorkflows(t *testing.T, svc **workflow.Service) option {
	return func(_ *api.Config, d *api.Deps) {
		reg := d.Tools.(*tool.Registry)
		defs, err := workflow.Parse([]byte(uiWorkflowsFile), reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := workflow.RegisterUndoTools(reg, defs); err != nil {
			t.Fatal(err)
		}
		*svc = workflow.NewService(d.Store, defs, reg, "")
		d.Workflows = *svc
		d.WorkflowRuns = caughtUpRuns{d.Store}
	}
}

// caughtUpRuns is the workflow read model as it stands once the projector
// has caught up with the journal: rebuilt from it before each list.
type caughtUpRuns struct{ st *store.Store }

func (c caughtUpRuns) ListWorkflows(ctx context.Context, f events.WorkflowFilter) (events.WorkflowPage, error) {
	if _, err := projector.Rebuild(ctx, c.st, workflow.NewJournal(c.st.Pool())); err != nil {
		return events.WorkflowPage{}, err
	}
	return projector.NewReader(c.st.Pool()).ListWorkflows(ctx, f)
}

// settleStep journals the rest of a step's operation as the executor
// would: one attempt that succeeded or failed for good.
func settleStep(t *testing.T, st *store.Store, key string, ok bool) {
	t.Helper()
	op := load(t, st, key)
	start := ev{events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "test-worker",
		LeaseUntil: time.Now().Add(time.Minute)}}
	end := ev{events.AttemptSucceeded, 1, events.AttemptSucceededData{Result: json.RawMessage(`{"id":"ch_1"}`), DownstreamID: "ch_1"}}
	if !ok {
		end = ev{events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422", StatusCode: 422}}
	}
	journal(t, st, op, key, op.Tool, op.EffectClass, start, end)
}

// escalatedWorkflow runs "gift" id to its escalation: the charge (the
// pivot) completes, the reserve after it fails for good.
func escalatedWorkflow(t *testing.T, f *fixture, svc *workflow.Service, id string) {
	t.Helper()
	ctx := context.Background()
	drv := workflow.NewDriver(svc, nil, workflow.DriverConfig{})
	if _, _, err := svc.Start(ctx, workflow.Start{WorkflowID: id, Workflow: "gift", Input: json.RawMessage(`{}`), Principal: "billing-agent"}); err != nil {
		t.Fatal(err)
	}
	settleStep(t, f.store, workflow.StepKey(id, "charge", 0), true)
	if _, err := drv.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	settleStep(t, f.store, workflow.StepKey(id, "reserve", 0), false)
	if _, err := drv.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := svc.Get(ctx, id)
	if err != nil || rec.Status != events.WorkflowEscalated {
		t.Fatalf("workflow %s: %s, %v; want escalated", id, rec.Status, err)
	}
}

func workflowForm(csrf string, action events.WorkflowAction, note string) url.Values {
	return url.Values{"csrf": {csrf}, "action": {string(action)}, "note": {note}}
}

// An escalated run is listed on the queue; its page shows the steps with
// links to their operations, why it waits, and the run's decisions, which
// an approver records with the page's CSRF token.
func TestUIWorkflowPageAndDecision(t *testing.T) {
	t.Parallel()
	var svc *workflow.Service
	f, _ := setupApproval(t, openMode, withWorkflows(t, &svc))
	const id = "gift-1"
	escalatedWorkflow(t, f, svc, id)
	// A step's own operation escalated: its card links to its run.
	escalated(t, f.store, "wf:gift-9/charge", "payments.charge", events.Irreversible, secretArgs)
	b := newBrowser(t, f)

	queue := page(t, b.get(t, "/ui/"))
	if !strings.Contains(queue, `<a href="/ui/workflows/gift-9">gift-9</a>`) {
		t.Errorf("the escalated step operation's card does not link to its workflow:\n%s", queue)
	}
	if !strings.Contains(queue, `data-workflow="gift-1"`) || !strings.Contains(queue, `href="/ui/workflows/gift-1"`) ||
		!strings.Contains(queue, "Workflows waiting for a decision") {
		t.Fatalf("the queue does not list the escalated workflow:\n%s", queue)
	}
	href := ui.WorkflowHref(id)
	html := page(t, b.get(t, href))
	for _, want := range []string{
		`data-status="escalated"`,
		`href="` + ui.OperationHref("wf:gift-1/charge") + `"`,
		`href="` + ui.OperationHref("wf:gift-1/reserve") + `"`,
		`data-step="reserve"`,
		"after the pivot",
		`value="retry_step"`, `value="unwind"`, `value="abandon"`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the workflow page lacks %q", want)
		}
	}
	if strings.Contains(html, "ch_1") {
		t.Error("the workflow page shows a step's result; it belongs to the operation's page")
	}
	csrf := csrfOf(t, html)

	// Without the session's token nothing is recorded.
	wantStatus(t, b.post(t, href+"/decisions", url.Values{"action": {"abandon"}}), http.StatusForbidden)
	wantStatus(t, b.post(t, href+"/decisions", workflowForm(ui.CSRFToken("another-session"), events.WorkflowAbandon, "")), http.StatusForbidden)
	if rec, _ := svc.Get(context.Background(), id); rec.Status != events.WorkflowEscalated {
		t.Fatalf("a refused form changed the run: %s", rec.Status)
	}
	wantRedirect(t, b.post(t, href+"/decisions", workflowForm(csrf, "bogus", "")), href)

	wantRedirect(t, b.post(t, href+"/decisions", workflowForm(csrf, events.WorkflowRetryStep, "the warehouse restocked")), href)
	html = page(t, b.get(t, href))
	if !strings.Contains(html, "Recorded retry_step on workflow gift-1: it is now running") ||
		!strings.Contains(html, `href="`+ui.OperationHref("wf:gift-1/reserve~r1")+`"`) ||
		!strings.Contains(html, "the warehouse restocked") {
		t.Fatalf("the page after the decision:\n%s", html)
	}
	if strings.Contains(html, `name="action"`) {
		t.Fatal("a running workflow still offers decisions")
	}
	rec, err := svc.Get(context.Background(), id)
	if err != nil || rec.Status != events.WorkflowRunning || rec.Awaiting != "wf:gift-1/reserve~r1" ||
		len(rec.Decisions) != 1 || rec.Decisions[0].Approver != api.DevPrincipal {
		t.Fatalf("stored run after the decision: %+v, %v", rec, err)
	}
	// A second decision is refused with a message; the queue no longer
	// lists the run; an unknown id sends back to the queue.
	wantRedirect(t, b.post(t, href+"/decisions", workflowForm(csrf, events.WorkflowAbandon, "")), href)
	if html := page(t, b.get(t, href)); !strings.Contains(html, "Not recorded: the workflow is running, not waiting for a decision") {
		t.Fatalf("no refusal message:\n%s", html)
	}
	if queue := page(t, b.get(t, "/ui/")); strings.Contains(queue, `data-workflow="gift-1"`) {
		t.Fatal("the queue still lists the decided run")
	}
	wantRedirect(t, b.post(t, ui.WorkflowHref("nope")+"/decisions", workflowForm(csrf, events.WorkflowAbandon, "")), "/ui/")
	r := b.get(t, ui.WorkflowHref("nope"))
	wantStatus(t, r, http.StatusNotFound)
}

// A non-approver reads its own runs but gets no decision form and cannot
// post one; another principal's run is as absent as an unknown one.
func TestUIWorkflowNonApprover(t *testing.T) {
	t.Parallel()
	var svc *workflow.Service
	f, _ := setupApproval(t, withWorkflows(t, &svc))
	escalatedWorkflow(t, f, svc, "gift-2")
	b := newBrowser(t, f)
	wantRedirect(t, b.post(t, "/ui/login", url.Values{"token": {billingToken}}), "/ui/")
	html := page(t, b.get(t, ui.WorkflowHref("gift-2")))
	if !strings.Contains(html, "Only approvers record decisions") || strings.Contains(html, `name="action"`) {
		t.Fatalf("non-approver's workflow page:\n%s", html)
	}
	csrf := csrfOf(t, html)
	wantStatus(t, b.post(t, ui.WorkflowHref("gift-2")+"/decisions", workflowForm(csrf, events.WorkflowAbandon, "")), http.StatusForbidden)
	if rec, _ := svc.Get(context.Background(), "gift-2"); rec.Status != events.WorkflowEscalated {
		t.Fatalf("a non-approver's form changed the run: %s", rec.Status)
	}

	other := newBrowser(t, f)
	wantRedirect(t, other.post(t, "/ui/login", url.Values{"token": {supportToken}}), "/ui/")
	wantStatus(t, other.get(t, ui.WorkflowHref("gift-2")), http.StatusNotFound)
	if queue := page(t, other.get(t, "/ui/")); strings.Contains(queue, "gift-2") {
		t.Fatal("another principal's queue lists the run")
	}
}

// A run whose step's operation is escalated is still running: its page
// says the decision is on the operation and links to it, and offers no
// decision on the run.
func TestUIWorkflowWaitingOnAnOperation(t *testing.T) {
	t.Parallel()
	var svc *workflow.Service
	f, _ := setupApproval(t, openMode, withWorkflows(t, &svc))
	// The step's operation exists already with the same call: the run
	// adopts it.
	escalated(t, f.store, "wf:gift-3/charge", "payments.charge", events.Irreversible, `{"amount":500,"currency":"EUR"}`)
	if _, _, err := svc.Start(context.Background(), workflow.Start{WorkflowID: "gift-3", Workflow: "gift",
		Input: json.RawMessage(`{}`), Principal: "billing-agent"}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, f)
	html := page(t, b.get(t, ui.WorkflowHref("gift-3")))
	for _, want := range []string{
		`data-status="running"`,
		"whose outcome waits for an approver&#39;s decision on the operation",
		`<a class="key" href="` + ui.OperationHref("wf:gift-3/charge") + `">`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page of a run waiting on an escalated operation lacks %q:\n%s", want, html)
		}
	}
	if strings.Contains(html, `name="action"`) {
		t.Error("a running workflow offers decisions on the run")
	}
}
