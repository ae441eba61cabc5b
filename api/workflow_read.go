package api

import (
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Workflows follow the read rule of operations (scope.go): a principal
// reads the runs it started, approvers and readers read all, another
// principal's run is 404 and absent from lists, and starting a run under
// another principal's id is key_in_use.

// mayReadWorkflow reports whether r may read rec.
func (s *Server) mayReadWorkflow(r reader, rec events.Workflow) bool {
	return s.mayRead(r, events.Operation{Principal: rec.Principal})
}

// renderWorkflow returns rec as it may leave in a response: the input
// redacted by field names, each step's result by its tool (and wherever it
// echoes a sensitive value of the input), and every event's data likewise.
// The workflow's input has no tool schema of its own, so names and echoes
// are what mark it.
func (s *Server) renderWorkflow(rec events.Workflow) events.Workflow {
	in := rec.Input
	out := rec
	out.Input = tool.Scrub(nil, in, in)
	out.Steps = make([]events.WorkflowStep, len(rec.Steps))
	for i, st := range rec.Steps {
		var spec *tool.Spec
		if t, ok := s.tools.Get(st.Tool); ok && t != nil {
			spec = t.Spec()
		}
		st.Result = tool.Scrub(spec, in, st.Result)
		out.Steps[i] = st
	}
	if len(rec.Events) > 0 {
		out.Events = make([]events.WorkflowEnvelope, len(rec.Events))
		for i, e := range rec.Events {
			e.Data = tool.Scrub(nil, in, e.Data)
			out.Events[i] = e
		}
	}
	return out
}
