package reconciler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/policy"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/tool"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// opAfter folds an operation of class through one attempt whose outcome is
// unknown and handed to reconciliation, at attempt number attempts; with
// undoFailed the attempt was instead sent to compensation, whose undo
// failed.
func opAfter(t *testing.T, class events.EffectClass, attempts int, undoFailed bool) events.Operation {
	t.Helper()
	var op events.Operation
	add := func(typ events.Type, attempt int, data any) {
		t.Helper()
		ev, err := events.New(typ, "op-1", op.Seq+1, "t", class, attempt, data, t0)
		if err != nil {
			t.Fatal(err)
		}
		if op, err = events.Apply(op, ev); err != nil {
			t.Fatal(err)
		}
	}
	add(events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(`{"amount":1,"api_key":"sk_live_1"}`), Principal: "p"})
	for i := 1; i <= attempts; i++ {
		add(events.AttemptStarted, i, events.AttemptStartedData{DownstreamKey: "op-1", Worker: "w", LeaseUntil: t0.Add(time.Minute)})
		switch {
		case undoFailed && i == attempts:
			add(events.AttemptUnknown, i, events.AttemptUnknownData{ErrorClass: "eof", Next: events.NextCompensate})
			add(events.CompensationStarted, i, events.CompensationStartedData{DownstreamKey: "op-1", Worker: "w", LeaseUntil: t0.Add(time.Minute)})
			add(events.CompensationFailed, i, events.CompensationFailedData{Outcome: events.Unknown, ErrorClass: "http_500"})
		case i == attempts:
			add(events.AttemptUnknown, i, events.AttemptUnknownData{ErrorClass: "eof", Next: events.NextReconcile})
		default:
			at := t0
			add(events.AttemptFailed, i, events.AttemptFailedData{Kind: events.Retryable, ErrorClass: "http_503", RetryAt: &at})
		}
	}
	if op.Status != events.StatusNeedsReconciliation {
		t.Fatalf("built %s, want needs_reconciliation", op.Status)
	}
	return op
}

func TestPlan(t *testing.T) {
	t.Parallel()
	caps := policy.Caps{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Second, Deadline: time.Hour}
	specOf := func(class events.EffectClass) *tool.Spec {
		return &tool.Spec{Name: "t", Effect: class, Caps: caps, CanReconcile: true}
	}
	found := tool.Reconciliation{Answer: tool.Found, Body: json.RawMessage(`{"id":"d1","api_key":"echoed"}`), DownstreamID: "d1"}
	absent := tool.Reconciliation{Answer: tool.Absent, Body: json.RawMessage(`{"error":"not_found"}`)}
	cannot := tool.Reconciliation{Answer: tool.CannotTell, ErrorClass: "http_500", Err: errors.New(`Get "http://x/y?card=4242": EOF`)}
	cannotWithID := tool.Reconciliation{Answer: tool.CannotTell, ErrorClass: "http_409", DownstreamID: "d7"}
	cannotAsk := tool.Reconciliation{Answer: answerCannotAsk}
	now := t0.Add(time.Second)

	type want struct {
		reask   bool
		types   []events.Type
		retry   bool // the resolution carries retry_at
		reason  string
		propose events.Action
		status  events.Status // after applying the events
	}
	tests := []struct {
		name  string
		op    events.Operation
		spec  *tool.Spec
		ans   tool.Reconciliation
		asks  int
		want  want
		check func(t *testing.T, v verdict)
	}{
		{name: "irreversible found completes", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: found, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved}, status: events.StatusCompleted}},
		{name: "irreversible absent escalates proposing retry", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved, events.OperationEscalated},
				reason: ReasonAbsentDownstream, propose: events.ActionRetry, status: events.StatusEscalated}},
		{name: "idempotent absent with attempts left retries now", op: opAfter(t, events.Idempotent, 1, false), spec: specOf(events.Idempotent),
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved}, retry: true, status: events.StatusPending}},
		{name: "compensable absent with attempts left retries now", op: opAfter(t, events.Compensable, 2, false), spec: specOf(events.Compensable),
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved}, retry: true, status: events.StatusPending}},
		{name: "idempotent absent with caps spent escalates", op: opAfter(t, events.Idempotent, 3, false), spec: specOf(events.Idempotent),
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved, events.OperationEscalated},
				reason: ReasonAbsentDownstream, propose: events.ActionRetry, status: events.StatusEscalated}},
		{name: "unregistered tool absent escalates", op: opAfter(t, events.Idempotent, 1, false), spec: nil,
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved, events.OperationEscalated},
				reason: ReasonAbsentDownstream, propose: events.ActionRetry, status: events.StatusEscalated}},
		{name: "cannot tell below the limit asks again", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: cannot, asks: 2, want: want{reask: true}},
		{name: "irreversible cannot tell at the limit proposes retry with the risk", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: cannot, asks: 3, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCannotTell,
				propose: events.ActionRetry, status: events.StatusEscalated},
			check: func(t *testing.T, v verdict) {
				if !strings.Contains(v.escalation.Detail, "irreversible") {
					t.Fatalf("detail does not spell out the risk: %q", v.escalation.Detail)
				}
				if strings.Contains(string(v.escalation.Downstream), "4242") {
					t.Fatalf("downstream evidence keeps a URL query: %s", v.escalation.Downstream)
				}
			}},
		{name: "irreversible cannot tell with a downstream id proposes record_success", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: cannotWithID, asks: 3, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCannotTell,
				propose: events.ActionRecordSuccess, status: events.StatusEscalated}},
		{name: "idempotent cannot tell proposes retry", op: opAfter(t, events.Idempotent, 3, false), spec: specOf(events.Idempotent),
			ans: cannot, asks: 3, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCannotTell,
				propose: events.ActionRetry, status: events.StatusEscalated}},
		{name: "cannot ask escalates at once", op: opAfter(t, events.Irreversible, 1, false), spec: specOf(events.Irreversible),
			ans: cannotAsk, asks: 0, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCannotAsk,
				propose: events.ActionRetry, status: events.StatusEscalated}},
		{name: "failed undo, effect stands: escalate to compensate", op: opAfter(t, events.Compensable, 1, true), spec: specOf(events.Compensable),
			ans: found, asks: 1, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCompensationFailed,
				propose: events.ActionCompensate, status: events.StatusEscalated},
			check: func(t *testing.T, v verdict) {
				if strings.Contains(string(v.escalation.Downstream), "echoed") {
					t.Fatalf("downstream evidence not redacted: %s", v.escalation.Downstream)
				}
			}},
		// The fold retires the possibly undone key on this path, so the
		// retry under a new key is automatic.
		{name: "failed undo, effect absent: retry under a new key", op: opAfter(t, events.Compensable, 1, true), spec: specOf(events.Compensable),
			ans: absent, asks: 1, want: want{types: []events.Type{events.ReconciliationResolved}, retry: true, status: events.StatusPending}},
		{name: "failed undo, cannot tell", op: opAfter(t, events.Compensable, 1, true), spec: specOf(events.Compensable),
			ans: cannot, asks: 3, want: want{types: []events.Type{events.OperationEscalated}, reason: ReasonCannotTell,
				propose: events.ActionCompensate, status: events.StatusEscalated}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := plan(tt.op, tt.spec, tt.ans, tt.asks, 3, now)
			if v.reask != tt.want.reask {
				t.Fatalf("reask = %v, want %v", v.reask, tt.want.reask)
			}
			if v.reask {
				if len(v.specs) != 0 {
					t.Fatal("a re-ask writes events")
				}
				return
			}
			evs, err := events.Following(tt.op, now, v.specs...)
			if err != nil {
				t.Fatal(err)
			}
			op := tt.op
			for i, ev := range evs {
				if ev.Type != tt.want.types[i] {
					t.Fatalf("event %d is %s, want %v", i, ev.Type, tt.want.types)
				}
				if _, err := events.Encode(ev); err != nil {
					t.Fatal(err)
				}
				if op, err = events.Apply(op, ev); err != nil {
					t.Fatalf("the fold refuses the plan: %v", err)
				}
			}
			if len(evs) != len(tt.want.types) {
				t.Fatalf("%d events, want %v", len(evs), tt.want.types)
			}
			if op.Status != tt.want.status {
				t.Fatalf("status after the plan: %s, want %s", op.Status, tt.want.status)
			}
			if tt.want.retry != (op.DueAt != nil && op.DueAt.Equal(now)) {
				t.Fatalf("due_at %v, want due now: %v", op.DueAt, tt.want.retry)
			}
			if tt.want.reason != "" {
				if v.escalation == nil || v.escalation.Reason != tt.want.reason || v.escalation.ProposedAction != tt.want.propose {
					t.Fatalf("escalation = %+v, want %s proposing %s", v.escalation, tt.want.reason, tt.want.propose)
				}
				if strings.Contains(string(v.escalation.Request), "sk_live_1") {
					t.Fatalf("request evidence leaks a secret: %s", v.escalation.Request)
				}
				if op.Escalation == nil || op.Escalation.Reason != tt.want.reason {
					t.Fatalf("record's escalation = %+v", op.Escalation)
				}
			}
			if tt.check != nil {
				tt.check(t, v)
			}
		})
	}
}

func TestAskBackoff(t *testing.T) {
	t.Parallel()
	r := &Reconciler{cfg: Config{AskBackoff: Backoff{Base: 100 * time.Millisecond, Max: time.Second}, Base: service.Base{Rand: func() float64 { return 0.999999 }}}}
	lo := &Reconciler{cfg: Config{AskBackoff: r.cfg.AskBackoff, Base: service.Base{Rand: func() float64 { return 0 }}}}
	for asks, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		if got := r.askBackoff(asks); got > ceiling || got < ceiling*99/100 {
			t.Errorf("askBackoff(%d) at the top = %v, want ~%v", asks, got, ceiling)
		}
		if got := lo.askBackoff(asks); got != ceiling/2 {
			t.Errorf("askBackoff(%d) at the bottom = %v, want %v", asks, got, ceiling/2)
		}
	}
}
