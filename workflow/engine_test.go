package workflow

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool/httptool"
)

const engineFile = `tools:
  - name: inventory.reserve
    effect: compensable
    invoke: {url: "http://127.0.0.1:9/r"}
    compensate: {url: "http://127.0.0.1:9/release"}
  - name: payments.charge
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/c"}
  - name: payments.refund
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/f"}
  - name: email.send
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/e"}
workflows:
  - name: order
    steps:
      - {name: reserve, tool: inventory.reserve, args: {sku: "{{.Input.sku}}"}}
      - {name: charge, tool: payments.charge, args: {amount: "{{.Input.amount}}", reservation: "{{.Steps.reserve.DownstreamID}}"}, undo_with: payments.refund}
      - {name: confirm, tool: email.send, args: {text: "order {{.Input.sku}}"}}
`

func newEngine(t *testing.T) *engine {
	t.Helper()
	reg, err := httptool.Parse([]byte(engineFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := Parse([]byte(engineFile), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := RegisterUndoTools(reg, defs); err != nil {
		t.Fatal(err)
	}
	return &engine{defs: defs, reg: reg}
}

// schemas compiles the workflow envelope schema with the type schemas.
func schemas(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	for name, b := range events.Schemas() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(events.SchemaBaseURL+name, doc); err != nil {
			t.Fatal(err)
		}
	}
	sch, err := c.Compile(events.SchemaBaseURL + "workflow.envelope.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

type run struct {
	t   *testing.T
	e   *engine
	sch *jsonschema.Schema
	rec events.Workflow
	// intents are every intent recorded, in order.
	intents []intent
}

func (r *run) take(p *plan, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range p.events {
		b, _ := json.Marshal(e)
		inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err := r.sch.Validate(inst); err != nil {
			r.t.Errorf("%s does not match its schema: %v\n%s", e.Type, err, b)
		}
	}
	r.rec = p.rec
	r.intents = append(r.intents, p.intents...)
}

func startRun(t *testing.T) *run {
	e := newEngine(t)
	r := &run{t: t, e: e, sch: schemas(t)}
	d, _ := e.defs.Get("order")
	base := newRecord(d, "w1")
	base.Input = json.RawMessage(`{"sku":"s1","amount":42}`)
	in, err := e.stepIntent(d, base, 0, StepKey("w1", "reserve", 0))
	if err != nil {
		t.Fatal(err)
	}
	// The run starts from the empty record, as a reader of the events has
	// it: its steps come from workflow.started, which the schema checks.
	p := &plan{rec: events.Workflow{WorkflowID: "w1", Workflow: d.Name}, intents: []intent{in}}
	r.take(p, p.add(events.WorkflowStarted, events.WorkflowStartedData{Input: base.Input, InputHash: "h", Principal: "p",
		Step: "reserve", OperationKey: in.key, Steps: stepDecls(d)}, time.Now()))
	if len(r.rec.Steps) != len(d.Steps) || r.rec.Steps[0].Status != events.StepRunning || r.rec.Steps[1].Tool != d.Steps[1].Tool {
		t.Fatalf("the record after workflow.started has steps %+v, want the declared %d", r.rec.Steps, len(d.Steps))
	}
	return r
}

func (r *run) settle(status events.Status, id string) {
	r.t.Helper()
	op := events.Operation{Key: r.rec.Awaiting, Status: status, DownstreamID: id, DownstreamKey: r.rec.Awaiting,
		Result: json.RawMessage(`{"id":"` + id + `"}`)}
	r.take(r.e.advance(r.rec, op, time.Now()))
}

func (r *run) keys() []string {
	var out []string
	for _, in := range r.intents {
		out = append(out, in.key+" "+in.tool+" "+string(in.args))
	}
	return out
}

func wantKeys(t *testing.T, r *run, status events.WorkflowStatus, want ...string) {
	t.Helper()
	if r.rec.Status != status {
		t.Errorf("status = %s, want %s", r.rec.Status, status)
	}
	got := r.keys()
	if len(got) != len(want) {
		t.Fatalf("intents\n got %q\nwant %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("intent %d\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

func TestEngineSaga(t *testing.T) {
	t.Parallel()
	reserve := `wf:w1/reserve inventory.reserve {"sku":"s1"}`
	charge := `wf:w1/charge payments.charge {"amount":42,"reservation":"r1"}`
	confirm := `wf:w1/confirm email.send {"text":"order s1"}`
	release := `wf:w1/reserve~undo inventory.reserve~undo {"operation_key":"wf:w1/reserve","downstream_key":"wf:w1/reserve","downstream_id":"r1"}`
	refund := `wf:w1/charge~undo payments.refund {"downstream_id":"c1"}`

	t.Run("completed", func(t *testing.T) {
		r := startRun(t)
		r.settle(events.StatusCompleted, "r1")
		r.settle(events.StatusCompleted, "c1")
		r.settle(events.StatusCompleted, "e1")
		wantKeys(t, r, events.WorkflowCompleted, reserve, charge, confirm)
	})
	t.Run("the pivot fails: the reservation is released", func(t *testing.T) {
		r := startRun(t)
		r.settle(events.StatusCompleted, "r1")
		r.settle(events.StatusFailed, "")
		wantKeys(t, r, events.WorkflowUnwinding, reserve, charge, release)
		r.settle(events.StatusCompleted, "")
		wantKeys(t, r, events.WorkflowUnwound, reserve, charge, release)
	})
	t.Run("after the pivot: escalated, then unwound by decision", func(t *testing.T) {
		r := startRun(t)
		r.settle(events.StatusCompleted, "r1")
		r.settle(events.StatusCompleted, "c1")
		r.settle(events.StatusFailed, "")
		wantKeys(t, r, events.WorkflowEscalated, reserve, charge, confirm)
		if _, err := r.e.decide(r.rec, events.WorkflowAction("bogus"), "", "a", time.Now()); err == nil {
			t.Error("an unknown decision was accepted")
		}
		r.take(r.e.decide(r.rec, events.WorkflowUnwind, "refund it", "approver", time.Now()))
		r.settle(events.StatusCompleted, "")
		r.settle(events.StatusCompleted, "")
		wantKeys(t, r, events.WorkflowUnwound, reserve, charge, confirm, refund, release)
		if _, err := r.e.decide(r.rec, events.WorkflowAbandon, "", "a", time.Now()); err == nil {
			t.Error("a decision on an unwound run was accepted")
		}
	})
	t.Run("an undo that fails escalates, and retry_step tries it under a new key", func(t *testing.T) {
		r := startRun(t)
		r.settle(events.StatusCompleted, "r1")
		r.settle(events.StatusFailed, "")
		r.settle(events.StatusFailed, "")
		if r.rec.Status != events.WorkflowEscalated || !r.rec.Escalation.Undo {
			t.Fatalf("after a failed undo: %s %+v", r.rec.Status, r.rec.Escalation)
		}
		r.take(r.e.decide(r.rec, events.WorkflowRetryStep, "", "approver", time.Now()))
		r.settle(events.StatusCompleted, "")
		wantKeys(t, r, events.WorkflowUnwound, reserve, charge, release,
			`wf:w1/reserve~undo~r1 inventory.reserve~undo {"operation_key":"wf:w1/reserve","downstream_key":"wf:w1/reserve","downstream_id":"r1"}`)
	})
}
