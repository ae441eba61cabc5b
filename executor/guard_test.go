package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// refundTool is a tool written against the public packages only (tool and
// events), as a service in another module would write it: its check hook
// holds the business rules a schema cannot express — the order belongs to
// the principal, and a refund is not above what was paid.
func refundTool(orders map[string]struct {
	owner string
	total int
}, calls *atomic.Int64) *tool.GoTool {
	return tool.NewGoTool(tool.Spec{Name: "go.refund", Effect: events.Irreversible},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`{"id":"re_1"}`), nil
		},
		tool.WithCheck(func(ctx context.Context, principal string, args json.RawMessage) error {
			var a struct {
				OrderID string `json:"order_id"`
				Amount  int    `json:"amount"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return err
			}
			o, ok := orders[a.OrderID]
			switch {
			case !ok:
				return fmt.Errorf("order %s does not exist", a.OrderID)
			case o.owner != principal:
				return errors.New("the order belongs to another customer")
			case a.Amount > o.total:
				return fmt.Errorf("refund %d is above the order total %d", a.Amount, o.total)
			}
			return nil
		}))
}

// TestGoToolCheckHook: a Go tool's check hook runs at execution time with
// the principal and the args; a rejection fails the operation for good with
// its reason and nothing is sent, and the check is journaled as evidence.
func TestGoToolCheckHook(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int64
	gt := refundTool(map[string]struct {
		owner string
		total int
	}{"o1": {"billing-agent", 500}, "o2": {"someone-else", 500}}, &calls)
	if err := e.tools.Register(gt); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.produce("refund/good", "go.refund", events.Irreversible, `{"order_id":"o1","amount":500}`)
	e.produce("refund/too-much", "go.refund", events.Irreversible, `{"order_id":"o1","amount":501}`)
	e.produce("refund/not-yours", "go.refund", events.Irreversible, `{"order_id":"o2","amount":5}`)
	e.waitStatus("refund/good", events.StatusCompleted)
	for key, reason := range map[string]string{"refund/too-much": "above the order total", "refund/not-yours": "another customer"} {
		op := e.waitStatus(key, events.StatusFailed)
		if op.LastErrorClass != tool.ClassCheckRejected {
			t.Errorf("%s: last error class %q", key, op.LastErrorClass)
		}
		evs, err := e.store.Events(context.Background(), key, 0)
		if err != nil {
			t.Fatal(err)
		}
		last, _ := evs[len(evs)-1].DecodeData()
		f, ok := last.(*events.AttemptFailedData)
		if !ok || f.Kind != events.Final || !containsAll(f.Error, reason) || !containsAll(string(f.Precondition), `"verdict":"rejected"`, reason) {
			t.Errorf("%s: last event %T %+v", key, last, last)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("invocations = %d, want only the good refund", n)
	}
}

// TestApprovalNeedsDistinctApprovers: a tool whose approval rule needs two
// approvers waits after one retry decision, is not moved by the same
// approver twice, and runs once a second approver decides.
func TestApprovalNeedsDistinctApprovers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int64
	gt := tool.NewGoTool(tool.Spec{Name: "go.payout", Effect: events.Irreversible,
		Approval: &tool.Approval{When: json.RawMessage(`{"properties":{"amount":{"minimum":1000}}}`), Approvers: 2}},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`{"id":"po_1"}`), nil
		})
	if err := e.tools.Register(gt); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.produce("payout/small", "go.payout", events.Irreversible, `{"amount":10}`)
	e.waitStatus("payout/small", events.StatusCompleted)
	e.produce("payout/big", "go.payout", events.Irreversible, `{"amount":5000}`)
	op := e.waitStatus("payout/big", events.StatusEscalated)
	if op.Escalation == nil || op.Escalation.Approvers != 2 {
		t.Fatalf("escalation = %+v", op.Escalation)
	}
	decide := func(approver string) events.Operation {
		t.Helper()
		cur, err := e.store.Load(context.Background(), "payout/big")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		dec, _ := events.New(events.DecisionRecorded, cur.Key, cur.Seq+1, cur.Tool, cur.EffectClass, 0,
			events.DecisionData{Action: events.ActionRetry, Approver: approver, RetryAt: &now}, now)
		next, err := e.store.Append(context.Background(), store.Append{Base: cur, Events: []events.Envelope{dec}})
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	for _, a := range []string{"alice", "alice"} {
		if next := decide(a); next.Status != events.StatusEscalated || len(next.Approvals) != 1 {
			t.Fatalf("after %s: %s approvals %v", a, next.Status, next.Approvals)
		}
	}
	time.Sleep(200 * time.Millisecond) // a wrong execution would start at once
	if calls.Load() != 1 {
		t.Fatalf("invocations = %d before the second approver", calls.Load())
	}
	decide("bob")
	e.waitStatus("payout/big", events.StatusCompleted)
	if calls.Load() != 2 {
		t.Fatalf("invocations = %d, want one per payout", calls.Load())
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
