package api

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/watch"
	"github.com/effectline/effectline/workflow"
)

// fakeWorkflows serves one run whose record the test moves on.
type fakeWorkflows struct {
	mu    sync.Mutex
	rec   events.Workflow
	reads int
}

func (f *fakeWorkflows) set(r events.Workflow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rec = r
}

func (f *fakeWorkflows) Start(context.Context, workflow.Start) (events.Workflow, bool, error) {
	return events.Workflow{}, false, workflow.ErrUnknownWorkflow
}

func (f *fakeWorkflows) Get(_ context.Context, id string) (events.Workflow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if id != f.rec.WorkflowID {
		return events.Workflow{}, workflow.ErrNotFound
	}
	return f.rec, nil
}

func (f *fakeWorkflows) Decide(context.Context, string, events.WorkflowAction, string, string) (events.Workflow, error) {
	return events.Workflow{}, workflow.ErrNotWaiting
}

func withWorkflows(f *fakeWorkflows) option {
	return func(_ *Config, d *Deps) { d.Workflows = f }
}

func running(id, awaiting string) events.Workflow {
	return events.Workflow{WorkflowID: id, Workflow: "order", Principal: "billing-agent", Status: events.WorkflowRunning, Current: "charge", Awaiting: awaiting, Seq: 2}
}

// GET /v1/workflows/{id}?wait= answers once the run settles: the wait
// watches the awaited operation (here the step moves on to the next one,
// then the run completes).
func TestGetWorkflowWaitAnswersOnceSettled(t *testing.T) {
	var hub *watch.Hub
	wf := &fakeWorkflows{rec: running("ord-7", "wf:ord-7/charge")}
	f := setup(t, withHub(t, time.Hour, &hub, nil), withWorkflows(wf))
	answered := make(chan response, 1)
	go func() { answered <- f.do(t, http.MethodGet, workflowHref("ord-7")+"?wait=30s", billingToken, "") }()
	waitForWaiters(t, hub, 1)
	wf.set(running("ord-7", "wf:ord-7/confirm"))
	// The wait follows the run to the operation it awaits now: a
	// re-read (the poll's) moves the watch.
	deadline := time.Now().Add(30 * time.Second)
	for !func() bool { wf.mu.Lock(); defer wf.mu.Unlock(); return wf.reads >= 3 }() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := hub.Waiting(); n != 1 {
		t.Errorf("%d watches while one request waits", n)
	}
	done := running("ord-7", "")
	done.Status, done.Seq = events.WorkflowCompleted, 6
	wf.set(done)
	r := <-answered
	wantStatus(t, r, http.StatusOK)
	var got events.Workflow
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status != events.WorkflowCompleted || got.Seq != 6 {
		t.Errorf("waited record: status %s seq %d, want completed at seq 6", got.Status, got.Seq)
	}
	if r.header.Get("Preference-Applied") != "wait=30" {
		t.Errorf("Preference-Applied = %q", r.header.Get("Preference-Applied"))
	}
}

// At the wait's deadline the run so far is the answer, 202; a settled run
// (escalated: waiting for a decision on the run itself) answers at once.
func TestGetWorkflowWaitAnswers202AtItsDeadline(t *testing.T) {
	var hub *watch.Hub
	wf := &fakeWorkflows{rec: running("ord-8", "wf:ord-8/reserve")}
	f := setup(t, withHub(t, time.Hour, &hub, nil), withWorkflows(wf))
	r := f.do(t, http.MethodGet, workflowHref("ord-8")+"?wait=1s", billingToken, "")
	wantStatus(t, r, http.StatusAccepted)
	if r.header.Get("Location") != workflowHref("ord-8") {
		t.Errorf("Location = %q", r.header.Get("Location"))
	}
	esc := running("ord-8", "")
	esc.Status = events.WorkflowEscalated
	wf.set(esc)
	wantStatus(t, f.do(t, http.MethodGet, workflowHref("ord-8")+"?wait=60s", billingToken, ""), http.StatusOK)
	wantStatus(t, f.do(t, http.MethodGet, workflowHref("ord-8"), billingToken, ""), http.StatusOK)
	wantError(t, f.do(t, http.MethodGet, workflowHref("ord-8")+"?wait=soon", billingToken, ""), http.StatusBadRequest, codeInvalidRequest)
	wantStatus(t, f.do(t, http.MethodGet, workflowHref("ord-9")+"?wait=1s", billingToken, ""), http.StatusNotFound)
}
