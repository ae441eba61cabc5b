package tool

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/effectline/effectline/events"
)

// InvokeFunc runs one attempt of a Go tool. It returns the result (JSON, may
// be nil) or an error classified by FromError: mark confirmed failures with
// Permanent or Retryable; anything else is read as "may have happened".
type InvokeFunc func(ctx context.Context, c Call) (json.RawMessage, error)

// ReconcileFunc answers "did the effect for c.DownstreamKey happen?" for a Go
// tool: Found with the result, Absent, or an error for "cannot tell".
type ReconcileFunc func(ctx context.Context, c Call) (Answer, json.RawMessage, error)

// GoTool adapts Go functions to Tool, Compensator and Reconciler.
type GoTool struct {
	spec       Spec
	invoke     InvokeFunc
	compensate InvokeFunc
	reconcile  ReconcileFunc
	check      CheckFunc
	idField    string
	undoField  string
	err        error
}

var (
	_ Tool        = (*GoTool)(nil)
	_ Compensator = (*GoTool)(nil)
	_ Reconciler  = (*GoTool)(nil)
)

// GoToolOption configures NewGoTool.
type GoToolOption func(*GoTool)

// WithCompensate gives the tool an undo. It must succeed for an attempt that
// never took effect.
func WithCompensate(f InvokeFunc) GoToolOption {
	return func(g *GoTool) { g.compensate = f }
}

// WithReconcile lets the tool answer "did it happen?".
func WithReconcile(f ReconcileFunc) GoToolOption {
	return func(g *GoTool) { g.reconcile = f }
}

// WithDownstreamIDField names the result field that holds the downstream id
// (default "id").
func WithDownstreamIDField(field string) GoToolOption {
	return func(g *GoTool) { g.idField = field }
}

// WithUndoRefField names the result field that holds the undo reference
// (default "undo_ref"); the executor passes it back in Call.UndoRef when it
// compensates the attempt.
func WithUndoRefField(field string) GoToolOption {
	return func(g *GoTool) { g.undoField = field }
}

// NewGoTool builds a Go tool. The spec is checked and its args schema
// compiled here; a problem is reported by Registry.Register (and by every
// Invoke), so wiring code has one place to look.
func NewGoTool(spec Spec, invoke InvokeFunc, opts ...GoToolOption) *GoTool {
	g := &GoTool{spec: spec, invoke: invoke, idField: DefaultDownstreamIDField, undoField: "undo_ref"}
	for _, o := range opts {
		o(g)
	}
	g.spec.CanCompensate = g.compensate != nil
	g.spec.CanReconcile = g.reconcile != nil
	g.err = g.spec.Prepare()
	if g.err == nil && invoke == nil {
		g.err = fmt.Errorf("tool %q: invoke function is required", spec.Name)
	}
	if g.err == nil && g.spec.Effect == events.Compensable && g.compensate == nil {
		g.err = fmt.Errorf("tool %q: compensate: required for a compensable tool", spec.Name)
	}
	return g
}

// Err reports a problem found when the tool was built.
func (g *GoTool) Err() error { return g.err }

// Spec returns the tool's spec.
func (g *GoTool) Spec() *Spec { return &g.spec }

// Invoke runs the invoke function under the spec's timeout and classifies
// its error with FromError. A panic is Unknown: it may have struck after the
// effect.
func (g *GoTool) Invoke(ctx context.Context, c Call) Result {
	if g.err != nil {
		return FailedResult(events.Final, "invalid_tool", g.err)
	}
	if r, ok := g.spec.Preflight(c); !ok {
		return r
	}
	return g.run(ctx, g.invoke, c)
}

// Compensate runs the undo function, classified like Invoke.
func (g *GoTool) Compensate(ctx context.Context, c Call) Result {
	if g.compensate == nil {
		return FailedResult(events.Final, "not_compensable", fmt.Errorf("tool %q has no compensate function", g.spec.Name))
	}
	return g.run(ctx, g.compensate, c)
}

// Reconcile runs the reconcile function; an error or an answer it does not
// recognise is CannotTell.
func (g *GoTool) Reconcile(ctx context.Context, c Call) (rec Reconciliation) {
	if g.reconcile == nil {
		return Reconciliation{Answer: CannotTell, ErrorClass: "not_reconcilable",
			Err: fmt.Errorf("tool %q has no reconcile function", g.spec.Name)}
	}
	defer func() {
		if p := recover(); p != nil {
			rec = Reconciliation{Answer: CannotTell, ErrorClass: "panic", Err: fmt.Errorf("tool %q panicked: %v", g.spec.Name, p)}
		}
	}()
	ctx, cancel := g.withTimeout(ctx)
	defer cancel()
	answer, body, err := g.reconcile(ctx, c)
	if err != nil {
		return Reconciliation{Answer: CannotTell, ErrorClass: FromError(err).ErrorClass, Err: err}
	}
	switch answer {
	case Found:
		body = JSONBody(body)
		return Reconciliation{Answer: Found, Body: body, DownstreamID: BodyField(body, g.idField)}
	case Absent:
		return Reconciliation{Answer: Absent, Body: JSONBody(body)}
	}
	return Reconciliation{Answer: CannotTell, ErrorClass: "unrecognised_answer",
		Err: fmt.Errorf("tool %q answered %q", g.spec.Name, answer)}
}

func (g *GoTool) run(ctx context.Context, f InvokeFunc, c Call) (r Result) {
	defer func() {
		if p := recover(); p != nil {
			r = UnknownResult("panic", fmt.Errorf("tool %q panicked: %v", g.spec.Name, p))
		}
	}()
	ctx, cancel := g.withTimeout(ctx)
	defer cancel()
	body, err := f(ctx, c)
	r = FromError(err)
	if r.Outcome == events.Succeeded {
		r.Body = JSONBody(body)
		r.DownstreamID = BodyField(r.Body, g.idField)
		r.UndoRef = BodyField(r.Body, g.undoField)
	}
	return r
}

func (g *GoTool) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.spec.Timeout > 0 {
		return context.WithTimeout(ctx, g.spec.Timeout)
	}
	return context.WithCancel(ctx)
}
