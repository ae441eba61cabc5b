package workflow

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// intent is an operation a transition records, in its own transaction.
type intent struct {
	key   string
	tool  string
	class events.EffectClass
	args  json.RawMessage
}

// plan is one transition: the workflow events and the intents that are
// written together, or not at all.
type plan struct {
	rec     events.Workflow
	events  []events.WorkflowEnvelope
	intents []intent
}

func (p *plan) add(t events.WorkflowType, data any, at time.Time) error {
	env, err := events.NewWorkflowEvent(t, p.rec.WorkflowID, p.rec.Workflow, p.rec.Seq+1, data, at)
	if err != nil {
		return err
	}
	next, err := events.ApplyWorkflow(p.rec, env)
	if err != nil {
		return err
	}
	p.rec = next
	p.events = append(p.events, env)
	return nil
}

// engine decides transitions. It reads the definitions and the registry
// and writes nothing itself.
type engine struct {
	defs *Set
	reg  *tool.Registry
}

// StepKey is the operation key of a step: "wf:<workflow>/<step>", and
// "~r<n>" after an approver's n-th retry_step.
func StepKey(workflowID, step string, retries int) string {
	k := "wf:" + workflowID + "/" + step
	if retries > 0 {
		k += "~r" + strconv.Itoa(retries)
	}
	return k
}

// UndoKey is the operation key of a step's undo: "wf:<workflow>/<step>~undo",
// and "~r<n>" after an approver's n-th retry of it.
func UndoKey(workflowID, step string, retries int) string {
	k := "wf:" + workflowID + "/" + step + "~undo"
	if retries > 0 {
		k += "~r" + strconv.Itoa(retries)
	}
	return k
}

func (e *engine) def(r events.Workflow) (*Def, error) {
	d, ok := e.defs.Get(r.Workflow)
	if !ok {
		return nil, fmt.Errorf("workflow %s: %q is no longer declared in the tools file", r.WorkflowID, r.Workflow)
	}
	return d, nil
}

// stepIntent renders the args of step i.
func (e *engine) stepIntent(d *Def, r events.Workflow, i int, key string) (intent, error) {
	s := d.Steps[i]
	data, err := scope(r.Input, stepData(r))
	if err != nil {
		return intent{}, err
	}
	args, err := render(s.Args, data)
	if err != nil {
		return intent{}, fmt.Errorf("step %s: args: %w", s.Name, err)
	}
	return intent{key: key, tool: s.Tool, class: s.Effect, args: args}, nil
}

// undoIntent is the operation that undoes a completed step: its tool's
// compensate (through the tool's undo tool) for a compensable step, its
// undo_with tool for another.
func (e *engine) undoIntent(d *Def, r events.Workflow, name, key string) (intent, error) {
	i := slices.IndexFunc(d.Steps, func(s Step) bool { return s.Name == name })
	st := r.Step(name)
	if i < 0 || st == nil {
		return intent{}, fmt.Errorf("no step %q", name)
	}
	s := d.Steps[i]
	if s.Effect == events.Compensable {
		args, err := json.Marshal(undoArgs{OperationKey: st.OperationKey, DownstreamKey: st.DownstreamKey,
			DownstreamID: st.DownstreamID, UndoRef: st.UndoRef})
		if err != nil {
			return intent{}, err
		}
		return intent{key: key, tool: UndoToolName(s.Tool), class: events.Idempotent, args: args}, nil
	}
	t, ok := e.reg.Get(s.UndoWith)
	if !ok {
		return intent{}, fmt.Errorf("step %s: undo_with: unknown tool %q", name, s.UndoWith)
	}
	data, err := scope(r.Input, stepData(r))
	if err != nil {
		return intent{}, err
	}
	args, err := render(s.UndoArgs, data)
	if err != nil {
		return intent{}, fmt.Errorf("step %s: undo_args: %w", name, err)
	}
	return intent{key: key, tool: s.UndoWith, class: t.Spec().Effect, args: args}, nil
}

// settled reports whether an operation's status ends the step: completed,
// or failed or compensated for good. Every other status (pending, running,
// unknown and waiting for reconciliation or a decision) means the step is
// still in force: the workflow waits.
func settled(s events.Status) bool {
	return s == events.StatusCompleted || s == events.StatusFailed || s == events.StatusCompensated
}

// advance is the transition after the awaited operation op settled.
func (e *engine) advance(r events.Workflow, op events.Operation, now time.Time) (*plan, error) {
	d, err := e.def(r)
	if err != nil {
		return nil, err
	}
	p := &plan{rec: r}
	switch r.Status {
	case events.WorkflowRunning:
		i := r.StepIndex(r.Current)
		if i < 0 {
			return nil, fmt.Errorf("workflow %s: no current step", r.WorkflowID)
		}
		if op.Status == events.StatusCompleted {
			return p, e.stepCompleted(d, p, i, op, now)
		}
		if i <= d.Pivot {
			return p, e.unwind(d, p, r.Current, fmt.Sprintf("step %s ended %s", r.Current, op.Status),
				e.compensable(d, r, i), now)
		}
		return p, p.add(events.WorkflowEscalatedEvent, events.WorkflowEscalatedData{
			Step: r.Current, OperationKey: op.Key, OperationStatus: op.Status,
			Reason:    fmt.Sprintf("step %s ended %s (%s) after the pivot %s: nothing is undone without a decision", r.Current, op.Status, op.LastErrorClass, d.Steps[min(d.Pivot, len(d.Steps)-1)].Name),
			StepsDone: r.Done(),
		}, now)
	case events.WorkflowUnwinding:
		if len(r.Undo) == 0 {
			return nil, fmt.Errorf("workflow %s: unwinding with nothing to undo", r.WorkflowID)
		}
		name := r.Undo[0]
		if op.Status != events.StatusCompleted {
			return p, p.add(events.WorkflowEscalatedEvent, events.WorkflowEscalatedData{
				Step: name, OperationKey: op.Key, OperationStatus: op.Status, Undo: true,
				Reason:    fmt.Sprintf("the undo of step %s ended %s (%s): whether the step's effect stands is for a human to find out", name, op.Status, op.LastErrorClass),
				StepsDone: r.Done(),
			}, now)
		}
		return p, e.undone(d, p, name, now)
	}
	return nil, fmt.Errorf("workflow %s is %s and waits on nothing", r.WorkflowID, r.Status)
}

func (e *engine) stepCompleted(d *Def, p *plan, i int, op events.Operation, now time.Time) error {
	data := events.WorkflowStepCompletedData{Step: d.Steps[i].Name, OperationKey: op.Key, Result: op.Result,
		DownstreamID: op.DownstreamID, DownstreamKey: op.DownstreamKey, UndoRef: op.UndoRef}
	if i+1 == len(d.Steps) {
		if err := p.add(events.WorkflowStepCompleted, data, now); err != nil {
			return err
		}
		return p.add(events.WorkflowCompletedEvent, events.WorkflowCompletedData{Steps: p.rec.Done()}, now)
	}
	// The next step's args may read this step's result: render them on the
	// record with this step completed.
	probe := p.rec
	probe.Steps = append([]events.WorkflowStep(nil), p.rec.Steps...)
	probe.Steps[i].Status, probe.Steps[i].Result, probe.Steps[i].DownstreamID = events.StepCompleted, op.Result, op.DownstreamID
	nextKey := StepKey(p.rec.WorkflowID, d.Steps[i+1].Name, 0)
	in, err := e.stepIntent(d, probe, i+1, nextKey)
	if err != nil {
		if err := p.add(events.WorkflowStepCompleted, data, now); err != nil {
			return err
		}
		return p.add(events.WorkflowEscalatedEvent, events.WorkflowEscalatedData{
			Step: d.Steps[i+1].Name, Reason: fmt.Sprintf("the args of step %s cannot be rendered: %v", d.Steps[i+1].Name, err),
			StepsDone: p.rec.Done(),
		}, now)
	}
	data.Next, data.NextOperationKey = d.Steps[i+1].Name, nextKey
	p.intents = append(p.intents, in)
	return p.add(events.WorkflowStepCompleted, data, now)
}

// compensable lists the completed compensable steps before step i, last
// first: what an automatic unwind undoes.
func (e *engine) compensable(d *Def, r events.Workflow, i int) []string {
	var out []string
	for j := i - 1; j >= 0; j-- {
		if d.Steps[j].Effect == events.Compensable && r.Steps[j].Status == events.StepCompleted {
			out = append(out, d.Steps[j].Name)
		}
	}
	return out
}

// undoable lists every completed step that can be undone, last first: what
// an approver's unwind undoes.
func (e *engine) undoable(d *Def, r events.Workflow) []string {
	var out []string
	for j := len(d.Steps) - 1; j >= 0; j-- {
		if r.Steps[j].Status == events.StepCompleted && (d.Steps[j].Effect == events.Compensable || d.Steps[j].UndoWith != "") {
			out = append(out, d.Steps[j].Name)
		}
	}
	return out
}

// unwind starts undoing undo (in that order), or ends the run unwound when
// there is nothing to undo.
func (e *engine) unwind(d *Def, p *plan, step, reason string, undo []string, now time.Time) error {
	data := events.WorkflowUnwindingData{Step: step, Reason: reason, Undo: append([]string{}, undo...)}
	if len(undo) > 0 {
		key := nextUndoKey(p.rec, undo[0])
		in, err := e.undoIntent(d, p.rec, undo[0], key)
		if err != nil {
			return err
		}
		data.OperationKey = key
		p.intents = append(p.intents, in)
	}
	if err := p.add(events.WorkflowUnwindingEvent, data, now); err != nil {
		return err
	}
	if len(undo) == 0 {
		return p.add(events.WorkflowUnwoundEvent, events.WorkflowUnwoundData{Undone: []string{}}, now)
	}
	return nil
}

func (e *engine) undone(d *Def, p *plan, name string, now time.Time) error {
	data := events.WorkflowStepUndoneData{Step: name, OperationKey: p.rec.Awaiting}
	if len(p.rec.Undo) > 1 {
		next := p.rec.Undo[1]
		key := nextUndoKey(p.rec, next)
		in, err := e.undoIntent(d, p.rec, next, key)
		if err != nil {
			return err
		}
		data.Next, data.NextOperationKey = next, key
		p.intents = append(p.intents, in)
	}
	if err := p.add(events.WorkflowStepUndone, data, now); err != nil {
		return err
	}
	if data.Next != "" {
		return nil
	}
	var undone []string
	for _, s := range p.rec.Steps {
		if s.Status == events.StepUndone {
			undone = append(undone, s.Name)
		}
	}
	slices.Reverse(undone)
	return p.add(events.WorkflowUnwoundEvent, events.WorkflowUnwoundData{Undone: append([]string{}, undone...)}, now)
}

// decide is an approver's decision on an escalated run.
func (e *engine) decide(r events.Workflow, action events.WorkflowAction, note, approver string, now time.Time) (*plan, error) {
	if r.Status != events.WorkflowEscalated || r.Escalation == nil {
		return nil, fmt.Errorf("%w: the workflow is %s", ErrNotWaiting, r.Status)
	}
	d, err := e.def(r)
	if err != nil {
		return nil, err
	}
	esc := r.Escalation
	p := &plan{rec: r}
	dec := events.WorkflowDecisionData{Action: action, Note: note, Approver: approver}
	switch action {
	case events.WorkflowAbandon:
		return p, p.add(events.WorkflowDecisionRecorded, dec, now)
	case events.WorkflowRetryStep:
		st := r.Step(esc.Step)
		if st == nil {
			return nil, fmt.Errorf("%w: no step %q", ErrInvalidDecision, esc.Step)
		}
		var in intent
		if esc.Undo {
			in, err = e.undoIntent(d, r, esc.Step, UndoKey(r.WorkflowID, esc.Step, st.UndoRetries+1))
		} else {
			in, err = e.stepIntent(d, r, r.StepIndex(esc.Step), StepKey(r.WorkflowID, esc.Step, st.Retries+1))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidDecision, err)
		}
		dec.OperationKey = in.key
		p.intents = append(p.intents, in)
		return p, p.add(events.WorkflowDecisionRecorded, dec, now)
	case events.WorkflowUnwind:
		if err := p.add(events.WorkflowDecisionRecorded, dec, now); err != nil {
			return nil, err
		}
		undo := e.undoable(d, p.rec)
		if esc.Undo {
			// The undo in force failed: go on from it, under a new key.
			undo = r.Undo
		}
		return p, e.unwind(d, p, "", "an approver decided to unwind", undo, now)
	}
	return nil, fmt.Errorf("%w: unknown action %q", ErrInvalidDecision, action)
}

// nextUndoKey is the key of the next undo of a step: a step undone before
// (an undo that failed and is tried again) gets a new key.
func nextUndoKey(r events.Workflow, name string) string {
	st := r.Step(name)
	n := st.UndoRetries
	if st.UndoKey != "" {
		n++
	}
	return UndoKey(r.WorkflowID, name, n)
}
