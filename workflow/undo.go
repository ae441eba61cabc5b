package workflow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// undoArgs are the args of a compensable step's undo operation: what its
// tool's compensate needs to find the effect.
type undoArgs struct {
	OperationKey  string `json:"operation_key"`
	DownstreamKey string `json:"downstream_key"`
	DownstreamID  string `json:"downstream_id,omitempty"`
	UndoRef       string `json:"undo_ref,omitempty"`
}

// UndoToolName is the tool that runs the compensate of the compensable tool
// name as an operation of its own.
func UndoToolName(name string) string { return name + "~undo" }

// undoTool runs a compensable tool's compensate as the invocation of an
// operation, so an unwind's undo gets what every operation gets: a durable
// claim, retries within the caps, and reconciliation and escalation when
// its outcome is unknown. It is idempotent: compensating the same effect
// twice, or one that never happened, succeeds by the compensate contract.
type undoTool struct {
	spec  tool.Spec
	inner tool.Compensator
}

func (u *undoTool) Spec() *tool.Spec { return &u.spec }

func (u *undoTool) Invoke(ctx context.Context, c tool.Call) tool.Result {
	var a undoArgs
	if err := json.Unmarshal(c.Args, &a); err != nil || a.DownstreamKey == "" {
		return tool.Result{Outcome: events.Failed, Kind: events.Final, ErrorClass: "invalid_args",
			Err: fmt.Errorf("undo args: want operation_key and downstream_key")}
	}
	return u.inner.Compensate(ctx, tool.Call{
		OperationKey: a.OperationKey, DownstreamKey: a.DownstreamKey, DownstreamID: a.DownstreamID,
		UndoRef: a.UndoRef, Principal: c.Principal, Attempt: c.Attempt, Args: c.Args,
	})
}

// RegisterUndoTools registers, for every compensable tool a workflow of
// defs uses, the tool that runs its compensate as an operation
// (UndoToolName). Call it once, after loading the workflows and before the
// executor starts.
func RegisterUndoTools(reg *tool.Registry, defs *Set) error {
	done := map[string]bool{}
	for _, name := range defs.Names() {
		d, _ := defs.Get(name)
		for _, s := range d.Steps {
			if s.Effect != events.Compensable || done[s.Tool] {
				continue
			}
			done[s.Tool] = true
			t, ok := reg.Get(s.Tool)
			if !ok {
				return fmt.Errorf("workflow %s, step %s: unknown tool %q", name, s.Name, s.Tool)
			}
			comp, ok := t.(tool.Compensator)
			if !ok {
				return fmt.Errorf("workflow %s, step %s: tool %q cannot compensate", name, s.Name, s.Tool)
			}
			if _, exists := reg.Get(UndoToolName(s.Tool)); exists {
				continue
			}
			spec := *t.Spec()
			u := &undoTool{inner: comp, spec: tool.Spec{
				Name: UndoToolName(s.Tool), Effect: events.Idempotent, Caps: spec.Caps,
				AllowedPrincipals: spec.AllowedPrincipals, IdempotencyHeader: spec.IdempotencyHeader,
				Timeout: spec.Timeout, Internal: true,
				// An undo is the tool's own effect taken back: its operation
				// is kept as long as the step's, and a run's retention
				// (Def.Tools) counts it with the tool's window.
				DedupWindow: spec.DedupWindow,
				ArgsSchema: json.RawMessage(`{"type":"object","required":["operation_key","downstream_key"],` +
					`"properties":{"operation_key":{"type":"string"},"downstream_key":{"type":"string"},` +
					`"downstream_id":{"type":"string"},"undo_ref":{"type":"string"}}}`),
			}}
			if err := reg.Register(u); err != nil {
				return err
			}
		}
	}
	return nil
}
