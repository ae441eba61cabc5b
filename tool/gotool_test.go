package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/policy"
)

func TestFromError(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	tests := []struct {
		name    string
		err     error
		outcome events.Outcome
		kind    events.FailureKind
		class   string
		after   time.Duration
	}{
		{"nil", nil, events.Succeeded, "", "", 0},
		{"permanent", Permanent(base), events.Failed, events.Final, "permanent", 0},
		{"permanent wrapped", fmt.Errorf("charging: %w", Permanent(base)), events.Failed, events.Final, "permanent", 0},
		{"permanent nil", Permanent(nil), events.Failed, events.Final, "permanent", 0},
		{"retryable", Retryable(base, 0), events.Failed, events.Retryable, "retryable", 0},
		{"retryable after", Retryable(base, 3*time.Second), events.Failed, events.Retryable, "retryable", 3 * time.Second},
		{"retryable negative after", Retryable(base, -time.Second), events.Failed, events.Retryable, "retryable", 0},
		{"unknown", Unknown(base), events.Unknown, "", "unknown", 0},
		{"unclassified", base, events.Unknown, "", "unclassified_error", 0},
		{"deadline", fmt.Errorf("calling: %w", context.DeadlineExceeded), events.Unknown, "", "timeout", 0},
		{"canceled", context.Canceled, events.Unknown, "", "canceled", 0},
		{"outermost mark wins", Unknown(Permanent(base)), events.Unknown, "", "unknown", 0},
		{"retryable around a deadline", Retryable(context.DeadlineExceeded, 0), events.Failed, events.Retryable, "retryable", 0},
		{"mark behind a join", errors.Join(errors.New("x"), Permanent(base)), events.Failed, events.Final, "permanent", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := FromError(tt.err)
			if r.Outcome != tt.outcome || r.Kind != tt.kind || r.ErrorClass != tt.class || r.RetryAfter != tt.after {
				t.Fatalf("FromError(%v) = %s/%s/%s after %v", tt.err, r.Outcome, r.Kind, r.ErrorClass, r.RetryAfter)
			}
			if (tt.err == nil) != (r.Err == nil) {
				t.Fatalf("FromError(%v).Err = %v", tt.err, r.Err)
			}
		})
	}
	if !errors.Is(Permanent(base), base) || !IsPermanent(fmt.Errorf("x: %w", Permanent(base))) || !IsRetryable(Retryable(base, 0)) || !IsUnknown(Unknown(base)) {
		t.Fatal("marks must keep the chain")
	}
}

func TestGoTool(t *testing.T) {
	t.Parallel()
	spec := Spec{
		Name: "ledger.post", Effect: events.Compensable, Timeout: 100 * time.Millisecond,
		AllowedPrincipals: []string{"agent"},
		ArgsSchema:        json.RawMessage(`{"type":"object","properties":{"mode":{"type":"string"}}}`),
	}
	var undone []string
	g := NewGoTool(spec,
		func(ctx context.Context, c Call) (json.RawMessage, error) {
			var a struct{ Mode string }
			_ = json.Unmarshal(c.Args, &a)
			switch a.Mode {
			case "ok":
				return json.RawMessage(`{"id":"led_1","undo_ref":"rev_1"}`), nil
			case "text":
				return json.RawMessage("done"), nil
			case "reject":
				return nil, Permanent(errors.New("account closed"))
			case "busy":
				return nil, Retryable(errors.New("locked"), time.Second)
			case "lost":
				return nil, Unknown(errors.New("connection dropped after commit"))
			case "plain":
				return nil, errors.New("receipt write failed")
			case "slow":
				<-ctx.Done()
				return nil, ctx.Err()
			case "panic":
				panic("bug")
			}
			return nil, nil
		},
		WithCompensate(func(ctx context.Context, c Call) (json.RawMessage, error) {
			undone = append(undone, c.UndoRef)
			return nil, nil
		}),
		WithReconcile(func(ctx context.Context, c Call) (Answer, json.RawMessage, error) {
			switch c.DownstreamKey {
			case "k1":
				return Found, json.RawMessage(`{"id":"led_1"}`), nil
			case "k2":
				return Absent, nil, nil
			case "k3":
				return "", nil, errors.New("ledger offline")
			}
			return "perhaps", nil, nil
		}),
	)
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	if s := g.Spec(); !s.CanCompensate || !s.CanReconcile || s.IdempotencyHeader != DefaultIdempotencyHeader {
		t.Fatalf("spec = %+v", s)
	}
	tests := []struct {
		mode      string
		principal string
		outcome   events.Outcome
		class     string
	}{
		{"ok", "agent", events.Succeeded, ""},
		{"text", "agent", events.Succeeded, ""},
		{"reject", "agent", events.Failed, "permanent"},
		{"busy", "agent", events.Failed, "retryable"},
		{"lost", "agent", events.Unknown, "unknown"},
		{"plain", "agent", events.Unknown, "unclassified_error"},
		{"slow", "agent", events.Unknown, "timeout"},
		{"panic", "agent", events.Unknown, "panic"},
		{"ok", "intruder", events.Failed, "forbidden"},
	}
	for _, tt := range tests {
		r := g.Invoke(context.Background(), Call{Principal: tt.principal, Args: json.RawMessage(`{"mode":"` + tt.mode + `"}`)})
		if r.Outcome != tt.outcome || r.ErrorClass != tt.class {
			t.Errorf("%s as %s → %s/%s (%v), want %s/%s", tt.mode, tt.principal, r.Outcome, r.ErrorClass, r.Err, tt.outcome, tt.class)
		}
	}
	r := g.Invoke(context.Background(), Call{Principal: "agent", Args: json.RawMessage(`{"mode":"ok"}`)})
	if r.DownstreamID != "led_1" || r.UndoRef != "rev_1" || string(r.Body) != `{"id":"led_1","undo_ref":"rev_1"}` {
		t.Errorf("ok result = %+v", r)
	}
	if r := g.Invoke(context.Background(), Call{Principal: "agent", Args: json.RawMessage(`{"mode":"text"}`)}); string(r.Body) != `"done"` {
		t.Errorf("text body = %s", r.Body)
	}
	if r := g.Invoke(context.Background(), Call{Principal: "agent", Args: json.RawMessage(`{"mode":1}`)}); r.Outcome != events.Failed || r.ErrorClass != "invalid_args" {
		t.Errorf("invalid args → %+v", r)
	}
	if r := g.Invoke(context.Background(), Call{Principal: "agent", Args: json.RawMessage(`{"mode":"busy"}`)}); r.RetryAfter != time.Second || r.Kind != events.Retryable {
		t.Errorf("retry-after = %+v", r)
	}

	if r := g.Compensate(context.Background(), Call{UndoRef: "rev_1"}); r.Outcome != events.Succeeded || len(undone) != 1 || undone[0] != "rev_1" {
		t.Errorf("compensate → %+v, undone %v", r, undone)
	}
	for key, want := range map[string]Answer{"k1": Found, "k2": Absent, "k3": CannotTell, "k4": CannotTell} {
		rc := g.Reconcile(context.Background(), Call{DownstreamKey: key})
		if rc.Answer != want {
			t.Errorf("reconcile %s → %+v, want %s", key, rc, want)
		}
		if want == Found && rc.DownstreamID != "led_1" {
			t.Errorf("found id = %q", rc.DownstreamID)
		}
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, Call) (json.RawMessage, error) { return nil, nil }
	reg := NewRegistry()
	if err := reg.Register(NewGoTool(Spec{Name: "a.ok", Effect: events.Idempotent}, noop)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tool Tool
		want string
	}{
		{"duplicate", NewGoTool(Spec{Name: "a.ok", Effect: events.Idempotent}, noop), "duplicate tool name"},
		{"compensable without undo", NewGoTool(Spec{Name: "b", Effect: events.Compensable}, noop), `tool "b": compensate: required for a compensable tool`},
		{"bad effect", NewGoTool(Spec{Name: "c", Effect: "sometimes"}, noop), `tool "c": effect: unknown effect class`},
		{"bad schema", NewGoTool(Spec{Name: "d", Effect: events.Idempotent, ArgsSchema: json.RawMessage(`{"type":5}`)}, noop), `tool "d": args_schema:`},
		{"bad caps", NewGoTool(Spec{Name: "e", Effect: events.Idempotent, Caps: policyCaps(-1)}, noop), `tool "e": retry: max_attempts`},
		{"no name", NewGoTool(Spec{Effect: events.Idempotent}, noop), "name is required"},
		{"no invoke", NewGoTool(Spec{Name: "f", Effect: events.Idempotent}, nil), "invoke function is required"},
		{"claims reconcile", claimer{Spec{Name: "g", Effect: events.Idempotent, CanReconcile: true}}, "does not implement Reconciler"},
	}
	for _, tt := range tests {
		err := reg.Register(tt.tool)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Register = %v, want %q", tt.name, err, tt.want)
		}
	}
	if !errors.Is(reg.Register(NewGoTool(Spec{Name: "a.ok", Effect: events.Idempotent}, noop)), ErrDuplicateTool) {
		t.Error("duplicate is not ErrDuplicateTool")
	}
	if got := reg.Names(); len(got) != 1 || got[0] != "a.ok" {
		t.Fatalf("Names() = %v", got)
	}
	// A failed GoTool refuses to run rather than run unchecked.
	if r := NewGoTool(Spec{Name: "b", Effect: events.Compensable}, noop).Invoke(context.Background(), Call{}); r.Outcome != events.Failed || r.Kind != events.Final {
		t.Fatalf("invalid tool ran: %+v", r)
	}
}

type claimer struct{ s Spec }

func (c claimer) Spec() *Spec                         { return &c.s }
func (c claimer) Invoke(context.Context, Call) Result { return Result{Outcome: events.Succeeded} }

func policyCaps(maxAttempts int) policy.Caps { return policy.Caps{MaxAttempts: maxAttempts} }
