package mcp

import (
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

func TestOperationKeyComesOnlyFromTheRuntimesMeta(t *testing.T) {
	for _, c := range []struct {
		meta map[string]any
		key  string
		ok   bool
	}{
		{map[string]any{MetaOperationKey: "order-7/charge"}, "order-7/charge", true},
		{map[string]any{MetaWorkflowID: "ord-1", MetaStep: "charge"}, "wf:ord-1/charge", true},
		{map[string]any{MetaWorkflowID: "ord-1", MetaStep: float64(2)}, "wf:ord-1/2", true},
		{map[string]any{MetaOperationKey: "k", MetaWorkflowID: "w", MetaStep: "s"}, "k", true},
		{map[string]any{MetaWorkflowID: "ord-1"}, "", false},
		{map[string]any{MetaStep: "charge"}, "", false},
		{map[string]any{"progressToken": 7, "id": "toolu_01"}, "", false},
		{map[string]any{MetaOperationKey: ""}, "", false},
		{nil, "", false},
	} {
		key, ok := operationKey(c.meta)
		if key != c.key || ok != c.ok {
			t.Errorf("operationKey(%v) = %q %t, want %q %t", c.meta, key, ok, c.key, c.ok)
		}
	}
}

func TestWaitFromMeta(t *testing.T) {
	for _, c := range []struct {
		v    any
		want time.Duration
	}{
		{nil, DefaultWait}, {float64(3), 3 * time.Second}, {"1.5", 1500 * time.Millisecond},
		{float64(600), MaxWait}, {float64(-1), 0}, {"soon", DefaultWait},
	} {
		if got := waitFrom(map[string]any{MetaWaitSeconds: c.v}); got != c.want {
			t.Errorf("wait %v = %v, want %v", c.v, got, c.want)
		}
	}
}

func TestLineTellsTheModelWhatToDo(t *testing.T) {
	for _, c := range []struct {
		o    events.OperationOutcome
		says []string
	}{
		{events.OperationOutcome{State: events.StateSucceeded, Result: []byte(`{"id":"ch_1"}`)}, []string{"succeeded", "ch_1"}},
		{events.OperationOutcome{State: events.StateFailed, Next: events.StepFixArgs, Reason: "http_422"}, []string{"failed", "no effect", "correct the arguments"}},
		{events.OperationOutcome{State: events.StateUnknown, Next: events.StepAskHuman}, []string{"unknown", "may have happened", "do not retry", "a human was asked"}},
		{events.OperationOutcome{State: events.StatePending, Next: events.StepWait}, []string{"pending", "same operation key"}},
	} {
		line := Line("payments.charge", c.o)
		for _, s := range c.says {
			if !strings.Contains(line, s) {
				t.Errorf("%s line %q does not say %q", c.o.State, line, s)
			}
		}
		if strings.Contains(line, "\n") {
			t.Errorf("line has a newline: %q", line)
		}
	}
}

func TestDescribeHintsFromTheEffectClass(t *testing.T) {
	for class, want := range map[events.EffectClass][2]bool{
		events.Idempotent: {true, false}, events.Compensable: {false, true}, events.Irreversible: {false, true},
	} {
		d := describe(Tool{Name: "t", Effect: class, ArgsSchema: []byte(`{"properties":{"a":{"type":"integer"}}}`)})
		a := d.Annotations
		if a.IdempotentHint != want[0] || *a.DestructiveHint != want[1] || a.ReadOnlyHint {
			t.Errorf("%s: %+v", class, a)
		}
		if s := d.InputSchema.(map[string]any); s["type"] != "object" || s["properties"] == nil {
			t.Errorf("%s: input schema %v", class, s)
		}
	}
}
