package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/watch"
	"github.com/effectline/effectline/workflow"
)

// Workflows is what the workflow routes need of the write side:
// *workflow.Service. A run is read from its head, so the run a client just
// started is there when it asks.
type Workflows interface {
	Start(ctx context.Context, in workflow.Start) (events.Workflow, bool, error)
	Get(ctx context.Context, id string) (events.Workflow, error)
	Decide(ctx context.Context, id string, action events.WorkflowAction, note, approver string) (events.Workflow, error)
}

// WorkflowRuns pages the workflow read model (the projector's
// workflow_state) for GET /v1/workflows; *projector.Reader is one. A
// filter it cannot apply (a cursor it did not issue) is an error wrapping
// an *events.FilterError, answered 400.
type WorkflowRuns interface {
	ListWorkflows(ctx context.Context, f events.WorkflowFilter) (events.WorkflowPage, error)
}

// Page sizes of GET /v1/workflows.
const (
	defaultWorkflowLimit = 100
	maxWorkflowLimit     = 500
)

func (s *Server) workflowRoutes() {
	s.HandleFunc("POST /v1/workflows", s.postWorkflow, Authenticated)
	s.HandleFunc("GET /v1/workflows", s.listWorkflows, Authenticated)
	s.HandleFunc("GET /v1/workflows/{id}", s.getWorkflow, Authenticated)
	s.HandleFunc("POST /v1/workflows/{id}/decisions", s.postWorkflowDecision, ApproverOnly)
}

type workflowRequest struct {
	WorkflowID *string         `json:"workflow_id"`
	Workflow   *string         `json:"workflow"`
	Input      json.RawMessage `json:"input"`
}

type workflowAccepted struct {
	WorkflowID string                `json:"workflow_id"`
	Status     events.WorkflowStatus `json:"status"`
	Href       string                `json:"href"`
}

func workflowHref(id string) string { return "/v1/workflows/" + url.PathEscape(id) }

// postWorkflow starts a run: 202 when it is new, 200 with the run when the
// id exists with the same input, 409 with another. A run pruned after its
// retention answers the same from its tombstone: 200 with what it keeps
// and "pruned": true, 409 for another input; it never starts again.
func (s *Server) postWorkflow(w http.ResponseWriter, r *http.Request) {
	if s.workflows == nil {
		writeUnavailable(w, "this process runs no workflows")
		return
	}
	ctx := r.Context()
	principal, _ := PrincipalFrom(ctx)
	var req workflowRequest
	if !s.decodeBody(w, r, &req) {
		return
	}
	switch {
	case req.WorkflowID == nil:
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "workflow_id", "workflow_id is required")
		return
	case req.Workflow == nil || *req.Workflow == "":
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "workflow", "workflow is required")
		return
	case len(req.Input) == 0 || bytes.Equal(req.Input, []byte("null")):
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "input", "input is required (a JSON object; {} for none)")
		return
	}
	rec, created, err := s.workflows.Start(ctx, workflow.Start{WorkflowID: *req.WorkflowID, Workflow: *req.Workflow,
		Input: req.Input, Principal: principal})
	var ie *workflow.InputError
	switch {
	case errors.As(err, &ie):
		code := codeInvalidRequest
		if ie.Field != "workflow_id" {
			code = codeInvalidArgs
		}
		writeFieldError(w, http.StatusBadRequest, code, ie.Field, ie.Reason)
		return
	case errors.Is(err, workflow.ErrUnknownWorkflow):
		writeFieldError(w, http.StatusNotFound, codeNotFound, "workflow", "no workflow with this name is declared")
		return
	case errors.Is(err, workflow.ErrPayloadConflict):
		existing, gerr := s.workflows.Get(ctx, *req.WorkflowID)
		if tomb, pruned := workflow.AsPruned(gerr); pruned {
			existing, gerr = tomb.Record(), nil // a tombstone is scoped like the live run
		}
		if gerr == nil && existing.Principal != principal {
			writeError(w, http.StatusConflict, codeKeyInUse, "this workflow_id is in use by another principal")
			return
		}
		writeError(w, http.StatusConflict, codePayloadConflict, "this workflow_id was started with another workflow or input")
		return
	case err != nil:
		s.log.ErrorContext(ctx, "starting a workflow failed", slog.Any("error", err))
		writeUnavailable(w, "the workflow could not be recorded; retry with the same workflow_id")
		return
	}
	if !created {
		if rec.Principal != principal {
			// Another principal's run: neither its record nor whether its
			// input matches is this caller's to learn.
			writeError(w, http.StatusConflict, codeKeyInUse, "this workflow_id is in use by another principal")
			return
		}
		writeJSON(w, http.StatusOK, s.renderWorkflow(rec))
		return
	}
	w.Header().Set("Location", workflowHref(rec.WorkflowID))
	writeJSON(w, http.StatusAccepted, workflowAccepted{WorkflowID: rec.WorkflowID, Status: rec.Status, Href: workflowHref(rec.WorkflowID)})
}

func (s *Server) getWorkflow(w http.ResponseWriter, r *http.Request) {
	if s.workflows == nil {
		writeUnavailable(w, "this process runs no workflows")
		return
	}
	d, given, ok := queryWait(r)
	if !ok {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "wait", "wait must be a duration such as 10s, at most 60s")
		return
	}
	rec, err := s.workflows.Get(r.Context(), r.PathValue("id"))
	if tomb, pruned := workflow.AsPruned(err); pruned {
		// The tombstone of a settled run: the record it keeps, "pruned":
		// true, and nothing to wait for.
		rec, err = tomb.Record(), nil
	}
	if err == nil && !s.mayReadWorkflow(readerOf(r.Context()), rec) {
		err = workflow.ErrNotFound // as absent as a run that does not exist
	}
	if err == nil && given {
		rec, err = s.waitWorkflow(r.Context(), w, rec, d)
	}
	switch {
	case errors.Is(err, workflow.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no workflow with this id")
	case err != nil:
		s.log.ErrorContext(r.Context(), "reading a workflow failed", slog.Any("error", err))
		writeUnavailable(w, "the workflow could not be read")
	case given && !workflowSettled(rec):
		w.Header().Set("Location", workflowHref(rec.WorkflowID))
		writeJSON(w, http.StatusAccepted, s.renderWorkflow(rec))
	default:
		writeJSON(w, http.StatusOK, s.renderWorkflow(rec))
	}
}

// workflowSettled reports whether a run has ended, or waits for a decision
// on the run itself: nothing more happens without someone.
func workflowSettled(r events.Workflow) bool {
	switch r.Status {
	case events.WorkflowCompleted, events.WorkflowUnwound, events.WorkflowEscalated, events.WorkflowAbandoned:
		return true
	}
	return false
}

// workflowPoll is how often a waiting workflow read re-reads the run
// regardless of wakes: the transition itself is written by a driver that
// may run in another process, after the operation's last event, so no
// operation event marks it.
const workflowPoll = 250 * time.Millisecond

// waitWorkflow re-reads rec until it settled, d passed, the request ended
// or the server began shutting down. It watches the operation the run
// awaits (a step's or an undo's), so a settling operation wakes it at
// once, and re-reads on a short poll for the driver's transition after it.
func (s *Server) waitWorkflow(ctx context.Context, w http.ResponseWriter, rec events.Workflow, d time.Duration) (events.Workflow, error) {
	w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(d/time.Second)))
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + s.cfg.WriteTimeout))
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	poll := time.NewTicker(workflowPoll)
	defer poll.Stop()
	var wt *watch.Watch
	var watched string
	defer func() {
		if wt != nil {
			wt.Close()
		}
	}()
	for !workflowSettled(rec) {
		var changed, released <-chan struct{}
		if s.waits != nil && rec.Awaiting != watched {
			if wt != nil {
				wt.Close()
				wt = nil
			}
			if watched = rec.Awaiting; watched != "" {
				wt = s.waits.Watch(watched)
			}
		}
		if wt != nil {
			changed, released = wt.Changed(), wt.Released()
		}
		select {
		case <-ctx.Done():
			return rec, nil
		case <-released:
			return rec, nil
		case <-changed:
			wt.Take()
		case <-poll.C:
		}
		next, err := s.workflows.Get(ctx, rec.WorkflowID)
		if err != nil {
			if ctx.Err() != nil {
				return rec, nil
			}
			return rec, err
		}
		rec = next
	}
	return rec, nil
}

type workflowPage struct {
	Workflows  []events.Workflow `json:"workflows"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// listWorkflows answers a page of the workflow read model, newest first.
// The status, the read rule's principal and the page are applied by the
// read model's query, so a principal that reads only its own runs gets
// full pages of them.
func (s *Server) listWorkflows(w http.ResponseWriter, r *http.Request) {
	if s.workflowRuns == nil {
		writeUnavailable(w, "this process runs no workflows")
		return
	}
	ctx := r.Context()
	q := r.URL.Query()
	f := events.WorkflowFilter{Status: events.WorkflowStatus(q.Get("status")), Limit: defaultWorkflowLimit, Cursor: q.Get("cursor")}
	if f.Status != "" && !f.Status.Valid() {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "status", fmt.Sprintf("status must be one of %v", events.WorkflowStatuses()))
		return
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxWorkflowLimit {
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "limit", fmt.Sprintf("limit must be 1 to %d", maxWorkflowLimit))
			return
		}
		f.Limit = n
	}
	if len(f.Cursor) > maxCursorBytes {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "cursor", "cursor is not one this server issued")
		return
	}
	scope, ok := s.listScope(readerOf(ctx))
	if !ok {
		writeJSON(w, http.StatusOK, workflowPage{Workflows: []events.Workflow{}})
		return
	}
	f.Principal = scope
	page, err := s.workflowRuns.ListWorkflows(ctx, f)
	if errors.Is(err, events.ErrInvalidFilter) {
		// Status and limit are checked above: the cursor is what the read
		// model could not apply.
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "cursor", "cursor is not one this server issued")
		return
	}
	if err != nil {
		s.log.ErrorContext(ctx, "listing workflows failed", slog.String("status", string(f.Status)), slog.Any("error", err))
		writeUnavailable(w, "the workflows could not be read")
		return
	}
	body := workflowPage{Workflows: make([]events.Workflow, 0, len(page.Items)), NextCursor: page.NextCursor}
	rd := readerOf(ctx)
	for _, rec := range page.Items {
		// The query applied the rule already; this is the same rule once
		// more, so a read model that answered too much still shows nothing
		// it should not.
		if s.mayReadWorkflow(rd, rec) {
			body.Workflows = append(body.Workflows, s.renderWorkflow(rec))
		}
	}
	writeJSON(w, http.StatusOK, body)
}

// postWorkflowDecision records an approver's decision on an escalated run.
// The approver is the authenticated principal.
func (s *Server) postWorkflowDecision(w http.ResponseWriter, r *http.Request) {
	if s.workflows == nil {
		writeUnavailable(w, "this process runs no workflows")
		return
	}
	ctx := r.Context()
	var req decisionRequest
	if !s.decodeBody(w, r, &req) {
		return
	}
	if req.Action == nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "action", "action is required")
		return
	}
	action, err := events.ParseWorkflowAction(*req.Action)
	if err != nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "action",
			fmt.Sprintf("action must be one of %v", events.WorkflowActions()))
		return
	}
	approver, _ := PrincipalFrom(ctx)
	rec, err := s.workflows.Decide(ctx, r.PathValue("id"), action, req.Note, approver)
	switch {
	case errors.Is(err, workflow.ErrNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no workflow with this id")
	case errors.Is(err, workflow.ErrNotWaiting):
		writeError(w, http.StatusConflict, codeNotWaiting, fmt.Sprintf("the workflow is %s, not waiting for a decision", rec.Status))
	case errors.Is(err, workflow.ErrInvalidDecision):
		writeError(w, http.StatusBadRequest, codeInvalidDecision, err.Error())
	case err != nil:
		s.log.ErrorContext(ctx, "recording a workflow decision failed", slog.Any("error", err))
		writeUnavailable(w, "the decision could not be recorded")
	default:
		writeJSON(w, http.StatusOK, s.renderWorkflow(rec))
	}
}
