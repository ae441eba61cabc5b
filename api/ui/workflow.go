package ui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/workflow"
)

var uiWorkflowPage = parseUIPage("workflow.html")

// uiWorkflowItem is one escalated workflow run on the queue.
type uiWorkflowItem struct {
	ID, Href, Workflow, Step, Since, Reason string
	Undo                                    bool
}

// waitingWorkflows lists the escalated runs sess may read, from the
// workflow read model, narrowed to sess's own runs by the query when sess
// reads only its own, up to uiQueueLimit, oldest first.
func (s *UI) waitingWorkflows(r *http.Request, sess uiSession) ([]uiWorkflowItem, bool, error) {
	if s.workflows == nil || s.runs == nil {
		return nil, false, nil
	}
	scope, ok := s.server.ListScope(sess.Principal, sess.Approver)
	if !ok {
		return nil, false, nil
	}
	page, err := s.runs.ListWorkflows(r.Context(), events.WorkflowFilter{Status: events.WorkflowEscalated, Principal: scope, Limit: uiQueueLimit})
	if err != nil {
		return nil, false, err
	}
	var out []uiWorkflowItem
	for _, rec := range slices.Backward(page.Items) {
		if !s.mayReadWorkflow(sess, rec) {
			continue
		}
		it := uiWorkflowItem{ID: rec.WorkflowID, Href: uiWorkflowHref(rec.WorkflowID), Workflow: rec.Workflow,
			Since: since(rec.UpdatedAt)}
		if e := rec.Escalation; e != nil {
			it.Step, it.Reason, it.Undo = e.Step, e.Reason, e.Undo
		}
		out = append(out, it)
	}
	return out, page.NextCursor != "", nil
}

// mayReadWorkflow is the operations' rule for a run: its own principal's,
// or every run for approvers and readers.
func (s *UI) mayReadWorkflow(sess uiSession, rec events.Workflow) bool {
	return s.server.MayRead(sess.Principal, sess.Approver, events.Operation{Principal: rec.Principal})
}

// uiWorkflowView is a run's page.
type uiWorkflowView struct {
	ID, Workflow, Status, Principal, Current string
	Created, Updated                         string
	Awaiting                                 *uiOpLink
	// WaitText says what the run waits on and why.
	WaitText   string
	Escalation *uiWorkflowEscalation
	Steps      []uiWorkflowStep
	Decisions  []uiWorkflowDecision
	Events     []uiEvent
	Decide     *uiWorkflowDecideForm
}

type uiWorkflowDecision struct {
	events.WorkflowDecisionData
	Href string
}

type uiOpLink struct {
	Key, Href, Status string
	Attempt           int
	LastErrorClass    string
	Waiting           bool // the operation itself waits for a decision
}

type uiWorkflowStep struct {
	Name, Tool, EffectClass, Status string
	Op, Undo                        *uiOpLink
	Retries                         int
}

type uiWorkflowEscalation struct {
	Step, Reason, OperationKey, OperationHref, OperationStatus string
	Undo                                                       bool
	StepsDone                                                  []string
}

type uiWorkflowDecideForm struct {
	URL     string
	CSRF    string
	Buttons []uiWorkflowButton
}

type uiWorkflowButton struct {
	Action events.WorkflowAction
	Label  string
	Why    string
}

// uiWorkflow shows one run from the workflow journal (the write side).
func (s *UI) uiWorkflow(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.viewer(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if s.workflows == nil {
		s.renderMessage(w, r, http.StatusNotFound, sess, "Not found", "This server runs no workflows.")
		return
	}
	rec, err := s.workflows.Get(r.Context(), id)
	if errors.Is(err, workflow.ErrNotFound) || err == nil && !s.mayReadWorkflow(sess, rec) {
		s.renderMessage(w, r, http.StatusNotFound, sess, "Not found", "There is no workflow with this id.")
		return
	}
	if err != nil {
		s.uiFailure(w, r, sess, "loading the workflow", "", err)
		return
	}
	v := uiWorkflowView{ID: rec.WorkflowID, Workflow: rec.Workflow, Status: string(rec.Status), Principal: rec.Principal,
		Current: rec.Current, Created: stamp(rec.CreatedAt), Updated: stamp(rec.UpdatedAt)}
	for _, d := range rec.Decisions {
		dv := uiWorkflowDecision{WorkflowDecisionData: d}
		if d.OperationKey != "" {
			dv.Href = uiOperationHref(d.OperationKey)
		}
		v.Decisions = append(v.Decisions, dv)
	}
	link := func(key string) *uiOpLink {
		if key == "" {
			return nil
		}
		l := &uiOpLink{Key: key, Href: uiOperationHref(key)}
		if op, ok := rec.Operations[key]; ok {
			l.Status, l.Attempt, l.LastErrorClass = string(op.Status), op.Attempt, op.LastErrorClass
			l.Waiting = op.Status.AwaitingDecision()
		}
		return l
	}
	for _, st := range rec.Steps {
		v.Steps = append(v.Steps, uiWorkflowStep{Name: st.Name, Tool: st.Tool, EffectClass: string(st.Effect),
			Status: string(st.Status), Op: link(st.OperationKey), Undo: link(st.UndoKey), Retries: st.Retries})
	}
	v.Awaiting = link(rec.Awaiting)
	v.WaitText = waitText(rec, v.Awaiting)
	if e := rec.Escalation; e != nil && rec.Status == events.WorkflowEscalated {
		v.Escalation = &uiWorkflowEscalation{Step: e.Step, Reason: e.Reason, OperationKey: e.OperationKey,
			OperationStatus: string(e.OperationStatus), Undo: e.Undo, StepsDone: e.StepsDone}
		if e.OperationKey != "" {
			v.Escalation.OperationHref = uiOperationHref(e.OperationKey)
		}
		if sess.Approver {
			v.Decide = workflowDecideForm(rec, sess)
		}
	}
	for _, e := range rec.Events {
		v.Events = append(v.Events, uiEvent{Seq: e.Seq, Type: string(e.Type), When: stamp(e.OccurredAt), Data: workflowEventData(e)})
	}
	s.render(w, r, http.StatusOK, uiWorkflowPage, uiPage{Title: "Workflow " + rec.WorkflowID, Session: sess,
		Flash: takeFlash(w, r), Data: v})
}

// workflowEventData is a workflow event's data for the history. Step
// results stay on the steps' operation pages, redacted by their tools:
// the history shows what the run did, not what the tools returned.
func workflowEventData(e events.WorkflowEnvelope) string {
	if events.WorkflowType(e.Type) == events.WorkflowStepCompleted || events.WorkflowType(e.Type) == events.WorkflowStarted {
		return ""
	}
	data := prettyJSON(e.Data)
	if data == "{}" || data == "null" {
		return ""
	}
	return data
}

// waitText says in words what a run waits on.
func waitText(rec events.Workflow, op *uiOpLink) string {
	switch {
	case rec.Status == events.WorkflowEscalated:
		return "The run waits for an approver's decision on the run itself: retry the step, unwind, or abandon."
	case !rec.Status.Active():
		return fmt.Sprintf("The run is %s: it waits on nothing.", rec.Status)
	case op == nil:
		return "The run is between steps: the workflow driver records the next transition."
	case op.Status == string(events.StatusNeedsReconciliation):
		return fmt.Sprintf("The run waits on %s, whose outcome is unknown: the reconciler asks the downstream whether it happened (an approver who knows may decide on the operation).", op.Key)
	case op.Waiting:
		return fmt.Sprintf("The run waits on %s, whose outcome waits for an approver's decision on the operation: decide there, and the run goes on from its outcome.", op.Key)
	case op.Status == string(events.StatusCompleted) || op.Status == string(events.StatusFailed) || op.Status == string(events.StatusCompensated):
		return fmt.Sprintf("The run waits on %s, which has settled (%s): the workflow driver takes the next transition.", op.Key, op.Status)
	}
	what := "step " + rec.Current
	if rec.Status == events.WorkflowUnwinding && len(rec.Undo) > 0 {
		what = "the undo of step " + rec.Undo[0]
	}
	return fmt.Sprintf("The run waits on %s, %s: the executor runs it.", op.Key, what)
}

// workflowDecideForm builds the run's decision buttons. Unwind is shown
// disabled with the reason when there is nothing to undo.
func workflowDecideForm(rec events.Workflow, sess uiSession) *uiWorkflowDecideForm {
	f := &uiWorkflowDecideForm{URL: uiWorkflowHref(rec.WorkflowID) + "/decisions", CSRF: sess.CSRF}
	for _, a := range events.WorkflowActions() {
		b := uiWorkflowButton{Action: a}
		switch a {
		case events.WorkflowRetryStep:
			b.Label = "Retry the step"
			b.Why = "run it again under a new operation key"
			if rec.Escalation != nil && rec.Escalation.Undo {
				b.Label, b.Why = "Retry the undo", "run the undo again under a new operation key"
			}
		case events.WorkflowUnwind:
			b.Label, b.Why = "Unwind", "undo the completed steps, last first (undo_with for irreversible ones)"
		case events.WorkflowAbandon:
			b.Label, b.Why = "Abandon", "end the run as it stands"
		}
		f.Buttons = append(f.Buttons, b)
	}
	return f
}

// uiWorkflowDecide records a run's decision posted from its page and
// redirects back with what happened.
func (s *UI) uiWorkflowDecide(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.formPoster(w, r)
	if !ok {
		return
	}
	if !sess.Approver {
		s.renderMessage(w, r, http.StatusForbidden, sess, "Refused", "Only approvers record decisions.")
		return
	}
	id := r.PathValue("id")
	back := uiWorkflowHref(id)
	if s.workflows == nil {
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: this server runs no workflows."})
		redirect(w, r, "/ui/")
		return
	}
	action, err := events.ParseWorkflowAction(r.PostForm.Get("action"))
	if err != nil {
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: choose one of the decision buttons."})
		redirect(w, r, back)
		return
	}
	note := strings.TrimSpace(r.PostForm.Get("note"))
	rec, err := s.workflows.Decide(r.Context(), id, action, note, sess.Principal)
	switch {
	case errors.Is(err, workflow.ErrNotFound):
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: there is no workflow with this id."})
		redirect(w, r, "/ui/")
		return
	case errors.Is(err, workflow.ErrNotWaiting):
		setFlash(w, r, uiFlash{Kind: flashError, Text: fmt.Sprintf("Not recorded: the workflow is %s, not waiting for a decision.", rec.Status)})
	case errors.Is(err, workflow.ErrInvalidDecision):
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: " + err.Error() + "."})
	case err != nil:
		s.log.ErrorContext(r.Context(), "ui: recording a workflow decision failed", "workflow_id", id, "error", err)
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: the decision could not be recorded; try again."})
	default:
		setFlash(w, r, uiFlash{Kind: flashOK, Text: fmt.Sprintf("Recorded %s on workflow %s: it is now %s.", action, id, rec.Status)})
	}
	redirect(w, r, back)
}

func uiWorkflowHref(id string) string { return "/ui/workflows/" + url.PathEscape(id) }
