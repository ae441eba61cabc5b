package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/workflow"
)

// restockFile declares a one-step workflow on the test tools: a
// compensable reservation, whose undo tool inventory.reserve~undo the
// workflow engine registers.
const restockFile = toolsFile + `
workflows:
  - name: restock
    steps:
      - {name: reserve, tool: inventory.reserve, args: {sku: "{{.Input.sku}}"}}
`

// withRealWorkflows gives the server the workflow service of restockFile on
// the fixture's database.
func withRealWorkflows(t *testing.T, svc **workflow.Service) option {
	return func(_ *Config, d *Deps) {
		reg := d.Tools.(*tool.Registry)
		defs, err := workflow.Parse([]byte(restockFile), reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := workflow.RegisterUndoTools(reg, defs); err != nil {
			t.Fatal(err)
		}
		*svc = workflow.NewService(d.Store, defs, reg, "")
		d.Workflows = *svc
	}
}

// TestPostWorkflowOfAPrunedRun: once a completed run is pruned to its
// tombstone, the same start is answered 200 from the tombstone with
// "pruned": true, another input 409, another principal 409 key_in_use,
// and none of them journals anything: the run never starts again. GET
// shows the tombstone too, scoped like the live run.
func TestPostWorkflowOfAPrunedRun(t *testing.T) {
	t.Parallel()
	var svc *workflow.Service
	f := setup(t, withRealWorkflows(t, &svc))
	ctx := context.Background()
	const id = "restock-1"
	start := func(token, input string) response {
		return f.do(t, http.MethodPost, "/v1/workflows", token,
			`{"workflow_id":"`+id+`","workflow":"restock","input":`+input+`}`)
	}
	wantStatus(t, start(supportToken, `{"sku":"sku-1"}`), http.StatusAccepted)
	step := workflow.StepKey(id, "reserve", 0)
	f.complete(t, step, `{"reservation":"r-1"}`)
	drv := workflow.NewDriver(svc, nil, workflow.DriverConfig{})
	if n, err := drv.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("advancing: %d, %v", n, err)
	}
	live, err := svc.Get(ctx, id)
	if err != nil || live.Status != events.WorkflowCompleted {
		t.Fatalf("the run: %s, %v; want completed", live.Status, err)
	}
	// The driver here publishes nothing; the relay and the publisher would
	// have by now.
	if _, err := f.store.Pool().Exec(ctx, `UPDATE workflow_events SET published = true`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Pool().Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	j := workflow.NewJournal(f.store.Pool())
	if n, err := j.PruneSettled(ctx, "restock", time.Now().Add(time.Hour), time.Now(), 10); err != nil || n != 1 {
		t.Fatalf("pruned %d runs (err %v), want 1", n, err)
	}
	stepEvents := f.countEvents(t, step)

	r := start(supportToken, `{ "sku" : "sku-1" }`) // the same input, canonically
	wantStatus(t, r, http.StatusOK)
	var got events.Workflow
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if !got.Pruned || got.WorkflowID != id || got.Workflow != "restock" || got.Status != events.WorkflowCompleted ||
		got.InputHash != live.InputHash || got.Principal != "support-agent" || got.Seq != live.Seq ||
		!got.UpdatedAt.Equal(live.UpdatedAt.Truncate(time.Microsecond)) || len(got.Steps) != 0 {
		t.Fatalf("200 tombstone = %s\nlive run was %+v", r.body, live)
	}

	wantError(t, start(supportToken, `{"sku":"sku-2"}`), http.StatusConflict, codePayloadConflict)
	dup := start(billingToken, `{"sku":"sku-1"}`)
	wantError(t, dup, http.StatusConflict, codeKeyInUse)
	if strings.Contains(string(dup.body), "completed") {
		t.Fatalf("key_in_use tells about the pruned run: %s", dup.body)
	}

	var runEvents, outbox int
	if err := f.store.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM workflow_events), (SELECT count(*) FROM outbox)`).
		Scan(&runEvents, &outbox); err != nil {
		t.Fatal(err)
	}
	if runEvents != 0 || outbox != 0 || f.countEvents(t, step) != stepEvents {
		t.Fatalf("after the duplicates: %d workflow events, %d outbox rows, %d events of the step (was %d): it started again",
			runEvents, outbox, f.countEvents(t, step), stepEvents)
	}
	if n, err := drv.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("the driver took %d transitions of a tombstone (err %v)", n, err)
	}

	g := f.do(t, http.MethodGet, workflowHref(id)+"?wait=30s", supportToken, "")
	wantStatus(t, g, http.StatusOK)
	if b := g.json(t); b["pruned"] != true || b["status"] != string(events.WorkflowCompleted) {
		t.Fatalf("GET of a pruned run = %s", g.body)
	}
	wantError(t, f.do(t, http.MethodGet, workflowHref(id), billingToken, ""), http.StatusNotFound, codeNotFound)
	wantError(t, f.do(t, http.MethodPost, workflowHref(id)+"/decisions", opsToken, `{"action":"abandon"}`),
		http.StatusNotFound, codeNotFound)
}

// TestPostIntentRefusesUndoTools: the generated undo tools are the
// workflow engine's; an intent naming one is refused like an unknown tool
// and journals nothing.
func TestPostIntentRefusesUndoTools(t *testing.T) {
	t.Parallel()
	var svc *workflow.Service
	f := setup(t, withRealWorkflows(t, &svc))
	undo := workflow.UndoToolName("inventory.reserve")
	r := f.post(t, supportToken, "wf:restock-9/reserve~undo", undo,
		`{"operation_key":"wf:restock-9/reserve","downstream_key":"wf:restock-9/reserve"}`)
	wantError(t, r, http.StatusNotFound, codeUnknownTool, "tool")
	if !strings.Contains(string(r.body), "workflow engine") {
		t.Fatalf("the refusal does not say why: %s", r.body)
	}
	if n := f.countEvents(t, "wf:restock-9/reserve~undo"); n != 0 {
		t.Fatalf("%d events journaled for a refused undo intent", n)
	}
	// The tool it undoes is still an ordinary one.
	wantStatus(t, f.post(t, supportToken, "restock-9/reserve", "inventory.reserve", `{"sku":"sku-9"}`), http.StatusAccepted)
}
