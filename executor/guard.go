package executor

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/tool"
)

// semconv.CheckVerdict is a check span's verdict.
// guarded is what the execution-time check said before an attempt.
type guarded struct {
	// evidence is journaled with the attempt's outcome; nil when the tool
	// declares no check.
	evidence json.RawMessage
	// blocked is the attempt's outcome when the check did not pass: the
	// mutation is not sent.
	blocked *tool.Result
}

// guard runs the tool's execution-time check (the tools file's
// precondition, a Go tool's check hook) for the claimed attempt, in a span
// of its own under the attempt's. It runs before every attempt, the retry
// after an undo included: the record it looks at may have changed since.
func (e *Executor) guard(ctx context.Context, op events.Operation, t tool.Tool, c tool.Call) guarded {
	ck, ok := t.(tool.Checker)
	if !ok {
		return guarded{}
	}
	ctx, span := e.tel.tracer.Start(ctx, "precondition", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(semconv.Operation(op), semconv.Attempt.Int(op.Attempt))...))
	defer span.End()
	chk, ok := ck.Check(ctx, c)
	if !ok {
		span.SetAttributes(semconv.CheckVerdict.String("none"))
		return guarded{}
	}
	span.SetAttributes(semconv.CheckVerdict.String(string(chk.Verdict)))
	if chk.StatusCode != 0 {
		span.SetAttributes(semconv.HTTPStatusCode.Int(chk.StatusCode))
	}
	if chk.Verdict == tool.Passed {
		span.SetStatus(codes.Ok, "")
		return guarded{evidence: chk.Evidence}
	}
	span.SetAttributes(semconv.ErrorClass.String(chk.ErrorClass))
	span.SetStatus(codes.Error, chk.ErrorClass)
	e.log.InfoContext(ctx, "the check before the attempt did not pass; nothing was sent",
		"operation_key", op.Key, "tool", op.Tool, "attempt", op.Attempt,
		"verdict", chk.Verdict, "error_class", chk.ErrorClass)
	res := chk.Result()
	return guarded{evidence: chk.Evidence, blocked: &res}
}

// withEvidence puts a check's evidence on the attempt's outcome event.
func withEvidence(s events.Spec, evidence json.RawMessage) events.Spec {
	if len(evidence) == 0 {
		return s
	}
	switch d := s.Data.(type) {
	case *events.AttemptSucceededData:
		d.Precondition = evidence
	case *events.AttemptFailedData:
		d.Precondition = evidence
	case *events.AttemptUnknownData:
		d.Precondition = evidence
	}
	return s
}

// approvalGate is the escalation that holds a first attempt for approvers,
// or nil when the tool's approval rule does not apply to these args.
func approvalGate(op events.Operation, t tool.Tool) *events.Spec {
	if op.Approved || op.Attempt != 0 {
		return nil
	}
	n, ok := t.Spec().NeedsApproval(op.Args)
	if !ok {
		return nil
	}
	detail := "the tool requires an approver's decision before it runs"
	if n > 1 {
		detail = "the tool requires the decisions of distinct approvers before it runs"
	}
	if a := t.Spec().Gate(); a != nil && len(a.When) > 0 {
		detail = "these args match the tool's approval rule, so an approver decides before it runs"
		if n > 1 {
			detail = "these args match the tool's approval rule, so distinct approvers decide before it runs"
		}
	}
	return &events.Spec{Type: events.OperationEscalated, Data: &events.EscalationData{
		Reason:         events.ReasonApprovalRequired,
		Request:        requestEvidence(op, t),
		ProposedAction: events.ActionRetry,
		Detail:         detail,
		Approvers:      n,
	}}
}
