package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
)

// Config configures the worked example.
type Config struct {
	Store *store.Store
	// Workflows runs the order: the service whose declarations include
	// the demo tools file's "order" workflow, with its driver running.
	Workflows  *workflow.Service
	Downstream *Downstream
	Out        io.Writer
	// OrderID names the order; its steps' operation keys derive from it, so
	// running the demo again with the same id resumes where it stopped.
	// The second order, whose charge nobody can confirm, is OrderID+"-2".
	OrderID string
	// StepTimeout bounds the wait for one step. Default 60s.
	StepTimeout time.Duration
	// UIBase prefixes the approval UI's links ("" prints paths).
	UIBase string
}

// Workflow is the declared workflow the demo's orders run as.
const Workflow = "order"

// Step is one step of the order workflow.
type Step struct {
	Name string
	Tool string
	Why  string
}

// Steps is the order: reserve inventory → charge the customer → confirm.
var Steps = []Step{
	{"reserve", "inventory.reserve",
		"compensable: its first response is lost → undo → retry under a new key"},
	{"charge", "payments.charge",
		"irreversible: its response is lost after the charge committed → reconciliation finds it → no second charge"},
	{"confirm", "email.send",
		"irreversible: 429 with Retry-After: 1 → a delayed retry"},
}

// Summary is the outcome of the worked example.
type Summary struct {
	OrderID    string
	Operations []events.Operation
	Tallies    []Tally
	Duplicates int
	Completed  int
	// Waiting is the second order's operation waiting for an approver, ""
	// when it does not wait (decided in an earlier run).
	Waiting string
}

// order is one run of the worked example.
type order struct {
	id     string
	intro  string
	amount int
	why    map[string]string // a step's fault in this order, if not Steps' Why
}

// Run places two orders as runs of the declared workflow "order", printing
// a live timeline of each step's operation. The first goes through all
// three steps despite a fault at each. The second one's charge loses its
// response and the payments ledger cannot tell whether it happened: the
// operation is escalated and the workflow waits on it, a real decision for
// the approval UI. Each order's row and the workflow's start (with its
// first step's intent) commit in one transaction, as an agent service
// would do it; the workflow driver records every later intent with the
// previous step's completion.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 60 * time.Second
	}
	sum := Summary{OrderID: cfg.OrderID}
	if _, err := cfg.Store.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS demo_orders (
		order_id text PRIMARY KEY, step text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return sum, fmt.Errorf("demo: creating the orders table: %w", err)
	}
	start := time.Now()
	tl := &timeline{out: cfg.Out, start: start, unanswered: cfg.Downstream.Unanswered}
	second := cfg.OrderID + "-2"
	cfg.Downstream.CannotTell(workflow.StepKey(second, "charge", 0))
	orders := []order{
		{cfg.OrderID, fmt.Sprintf("Worked example: order %s — reserve inventory → charge the customer → send the confirmation, as the declared workflow %q", cfg.OrderID, Workflow), 4999, nil},
		{second, fmt.Sprintf("Second order %s: its charge's response is lost and the payments ledger cannot tell whether it happened", second), 12900,
			map[string]string{
				"reserve": "compensable: no fault this time",
				"charge":  "irreversible: its response is lost and reconciliation cannot tell → escalated; the workflow waits for the decision",
			}},
	}
	for _, o := range orders {
		fmt.Fprintf(cfg.Out, "\n%s\n", o.intro)
		ops, rec, err := runOrder(ctx, cfg, tl, o)
		sum.Operations = append(sum.Operations, ops...)
		if err != nil {
			return sum, err
		}
		if o.id == cfg.OrderID {
			for _, st := range rec.Steps {
				if st.Status == events.StepCompleted {
					sum.Completed++
				}
			}
		}
		switch {
		case rec.Status == events.WorkflowCompleted:
			fmt.Fprintf(cfg.Out, "\nWorkflow %s completed: %d steps, each intent recorded with the previous step's completion\n", o.id, len(rec.Steps))
		case rec.Status.Active() && rec.Awaiting != "":
			op := ops[len(ops)-1]
			if op.Status == events.StatusEscalated {
				sum.Waiting = op.Key
			}
			fmt.Fprintf(cfg.Out, "\nWaiting: workflow %s waits on %s (%s) for an approver: %s%s\n",
				o.id, op.Key, op.Status, cfg.UIBase, "/ui/workflows/"+url.PathEscape(o.id))
		default:
			fmt.Fprintf(cfg.Out, "\nWorkflow %s is %s: %s%s\n", o.id, rec.Status, cfg.UIBase, "/ui/workflows/"+url.PathEscape(o.id))
		}
	}
	sum.Tallies = cfg.Downstream.Tallies()
	for _, t := range sum.Tallies {
		sum.Duplicates += t.Duplicates
	}
	printSummary(cfg.Out, sum, time.Since(start))
	return sum, nil
}

// runOrder starts (or resumes) one order's workflow and follows each step's
// operation until the workflow ends or waits on an operation that waits
// for a human.
func runOrder(ctx context.Context, cfg Config, tl *timeline, o order) ([]events.Operation, events.Workflow, error) {
	input, err := json.Marshal(map[string]any{"order_id": o.id, "sku": "SKU-42", "quantity": 2, "amount": o.amount})
	if err != nil {
		return nil, events.Workflow{}, err
	}
	var rec events.Workflow
	var created bool
	err = pgx.BeginFunc(ctx, cfg.Store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO demo_orders (order_id, step) VALUES ($1, 'placed')
			ON CONFLICT (order_id) DO NOTHING`, o.id); err != nil {
			return err
		}
		var err error
		rec, created, err = cfg.Workflows.StartTx(ctx, tx, workflow.Start{
			WorkflowID: o.id, Workflow: Workflow, Input: input, Principal: "order-agent"})
		return err
	})
	if err != nil {
		return nil, rec, fmt.Errorf("demo: starting workflow %s: %w", o.id, err)
	}
	if created {
		cfg.Store.NotifyAppended()
	}
	// A resumed order's steps that ran before say so; the ones its driver
	// records from now on are new.
	existed := map[string]bool{}
	if !created {
		for _, st := range rec.Steps {
			if st.OperationKey == "" {
				continue
			}
			if _, err := cfg.Store.Load(ctx, st.OperationKey); err == nil {
				existed[st.OperationKey] = true
			}
		}
	}
	var ops []events.Operation
	var wfSeq int64
	deadline := time.Now().Add(cfg.StepTimeout * time.Duration(len(Steps)))
	for i, step := range Steps {
		// The step's operation exists once the driver recorded its intent.
		for {
			if rec, err = cfg.Workflows.Get(ctx, o.id); err != nil {
				return ops, rec, fmt.Errorf("demo: reading workflow %s: %w", o.id, err)
			}
			wfSeq = tl.printWorkflow(rec.Events, wfSeq)
			if rec.Steps[i].OperationKey != "" || !rec.Status.Active() {
				break
			}
			if time.Now().After(deadline) {
				return ops, rec, fmt.Errorf("demo: workflow %s did not reach step %s within %s (status %s)", o.id, step.Name, cfg.StepTimeout, rec.Status)
			}
			select {
			case <-ctx.Done():
				return ops, rec, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		key := rec.Steps[i].OperationKey
		if key == "" {
			break // the workflow ended before this step
		}
		why := step.Why
		if w, ok := o.why[step.Name]; ok {
			why = w
		}
		fmt.Fprintf(cfg.Out, "\n%s  (%s)\n", step.Tool, why)
		if existed[key] {
			fmt.Fprintf(cfg.Out, "  (operation %s already exists: resuming it)\n", key)
		}
		tl.first = i == 0
		op, err := tl.follow(ctx, cfg.Store, key, cfg.StepTimeout)
		ops = append(ops, op)
		if err != nil {
			return ops, rec, err
		}
		if op.Status != events.StatusCompleted {
			break
		}
	}
	// Let the driver journal the transition the last operation allows.
	for {
		if rec, err = cfg.Workflows.Get(ctx, o.id); err != nil {
			return ops, rec, fmt.Errorf("demo: reading workflow %s: %w", o.id, err)
		}
		wfSeq = tl.printWorkflow(rec.Events, wfSeq)
		last := ops[len(ops)-1]
		if !rec.Status.Active() || (rec.Awaiting == last.Key && last.Status == events.StatusEscalated) {
			return ops, rec, nil
		}
		if time.Now().After(deadline) {
			return ops, rec, fmt.Errorf("demo: workflow %s did not move on from %s within %s (status %s)", o.id, last.Key, cfg.StepTimeout, rec.Status)
		}
		select {
		case <-ctx.Done():
			return ops, rec, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// timeline prints an operation's events as they are journaled.
type timeline struct {
	out   io.Writer
	start time.Time
	// first: the operation followed is a workflow's first step, whose
	// intent commits with the order row.
	first bool
	// unanswered says when the downstream left a lookup of a key
	// unanswered: the reconciler's asks are not journaled, and without
	// them the seconds before "cannot tell" is escalated would pass in
	// silence.
	unanswered func(key string) []time.Time
}

// printWorkflow prints the workflow events after seq and returns the last
// seq printed.
func (tl *timeline) printWorkflow(evs []events.WorkflowEnvelope, seq int64) int64 {
	for _, e := range evs {
		if e.Seq <= seq {
			continue
		}
		seq = e.Seq
		what, why := describeWorkflow(e)
		if what != "" {
			fmt.Fprintf(tl.out, "  %+8.3fs  %-24s %s\n", time.Since(tl.start).Seconds(), what, why)
		}
	}
	return seq
}

// describeWorkflow says what a workflow event means, in words.
func describeWorkflow(e events.WorkflowEnvelope) (what, why string) {
	switch events.WorkflowType(e.Type) {
	case events.WorkflowStarted:
		return "workflow started", "workflow " + e.WorkflowID + ": its first step's intent committed with it"
	case events.WorkflowStepCompleted:
		var d events.WorkflowStepCompletedData
		_ = json.Unmarshal(e.Data, &d)
		if d.Next != "" {
			return "step " + d.Step + " completed", "next: " + d.Next + ", its intent recorded in the same transaction"
		}
		return "step " + d.Step + " completed", "the last step"
	case events.WorkflowCompletedEvent:
		return "workflow completed", ""
	case events.WorkflowUnwindingEvent:
		return "workflow unwinding", "a step before the pivot failed: undoing the completed steps, last first"
	case events.WorkflowStepUndone:
		return "step undone", ""
	case events.WorkflowUnwoundEvent:
		return "workflow unwound", ""
	case events.WorkflowEscalatedEvent:
		return "workflow ESCALATED", "after the pivot nothing is undone without a decision"
	case events.WorkflowDecisionRecorded:
		return "workflow decision", ""
	}
	return "", ""
}

// follow prints new events of key until the operation settles: terminal,
// or waiting for a human.
func (tl *timeline) follow(ctx context.Context, st *store.Store, key string, timeout time.Duration) (events.Operation, error) {
	deadline := time.Now().Add(timeout)
	var seq int64
	asks := 0 // unanswered lookups printed
	for {
		evs, err := st.Events(ctx, key, seq)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return events.Operation{}, err
		}
		unanswered := tl.unanswered(key)[asks:]
		// In the order they happened: an ask follows the attempt whose
		// outcome it asks about and comes before the escalation it ends in.
		for _, e := range evs {
			for len(unanswered) > 0 && unanswered[0].Before(e.Envelope.OccurredAt) {
				asks++
				tl.printAsk(asks)
				unanswered = unanswered[1:]
			}
			tl.print(e.Envelope)
			seq = e.Seq
		}
		for range unanswered {
			asks++
			tl.printAsk(asks)
		}
		op, err := st.Load(ctx, key)
		if err == nil && op.Seq == seq && (op.Status.Terminal() || op.Status == events.StatusEscalated) {
			return op, nil
		}
		if time.Now().After(deadline) {
			return op, fmt.Errorf("demo: %s did not settle within %s (status %s)", key, timeout, op.Status)
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// printAsk prints the n-th lookup the downstream left unanswered.
func (tl *timeline) printAsk(n int) {
	fmt.Fprintf(tl.out, "  %+8.3fs  %-24s %s\n", time.Since(tl.start).Seconds(),
		fmt.Sprintf("asked (%d)", n), "did it happen? the ledger answers 503: cannot tell")
}

func (tl *timeline) print(e events.Envelope) {
	what, why := describe(e, tl.first)
	fmt.Fprintf(tl.out, "  %+8.3fs  %-24s %s\n", time.Since(tl.start).Seconds(), what, why)
}

// describe says what an event means and which rule applied, in words.
func describe(e events.Envelope, first bool) (what, why string) {
	d, err := e.DecodeData()
	if err != nil {
		return string(e.Type), err.Error()
	}
	switch d := d.(type) {
	case *events.IntentData:
		if !first {
			return "intent recorded", "key " + e.OperationKey + ", recorded by the workflow with the previous step's completion"
		}
		return "intent recorded", "key " + e.OperationKey + ", committed with the order row and the workflow's start"
	case *events.AttemptStartedData:
		why := "Idempotency-Key: " + d.DownstreamKey
		if d.BackoffWaitedMS > 0 {
			why += fmt.Sprintf(" (after waiting %.1fs)", float64(d.BackoffWaitedMS)/1000)
		}
		return fmt.Sprintf("attempt %d →", e.Attempt), why
	case *events.AttemptSucceededData:
		why := "confirmed by the downstream"
		if d.DownstreamID != "" {
			why += ", id " + d.DownstreamID
		}
		if d.Late {
			why += " (late report of a lost lease, kept as evidence)"
		}
		return fmt.Sprintf("attempt %d succeeded", e.Attempt), why
	case *events.AttemptFailedData:
		// The delay is measured from the event, not from now: a resumed
		// demo replays old events, and "retry in -3.7s" would say nothing.
		if d.RetryAt != nil {
			return fmt.Sprintf("attempt %d failed", e.Attempt),
				fmt.Sprintf("%s, nothing happened: retry in %.1fs (Retry-After honored within the caps)", d.ErrorClass, d.RetryAt.Sub(e.OccurredAt).Seconds())
		}
		return fmt.Sprintf("attempt %d failed", e.Attempt), d.ErrorClass + ": final, no retry"
	case *events.AttemptUnknownData:
		rule := map[events.Next]string{
			events.NextRetry:      "idempotent: retry with the same key",
			events.NextCompensate: "compensable: undo first, then retry under a new key",
			events.NextReconcile:  "never retried blindly: ask the downstream whether it happened",
		}[d.Next]
		return fmt.Sprintf("attempt %d UNKNOWN", e.Attempt), d.ErrorClass + " — it may have happened; " + rule
	case *events.CompensationStartedData:
		return "undo →", "release " + d.DownstreamKey
	case *events.CompensationSucceededData:
		if d.RetryAt != nil {
			return "undone", "the first reservation is released; the retry gets a new key"
		}
		return "undone", "caps spent: the operation ends compensated"
	case *events.CompensationFailedData:
		return "undo failed", d.ErrorClass + ": needs reconciliation"
	case *events.ReconciliationResolvedData:
		if d.Found {
			return "reconciled: it happened", "the downstream shows " + orDash(d.DownstreamID) + " → recorded as success, nothing sent again"
		}
		if d.RetryAt != nil {
			return "reconciled: absent", "provably not done → retry"
		}
		return "reconciled: absent", "provably not done, and the class forbids a blind retry"
	case *events.EscalationData:
		return "ESCALATED", d.Reason + ": waiting for an approver at /ui/ (proposed: " + string(d.ProposedAction) + ")"
	case *events.DecisionData:
		return "decision", string(d.Action) + " by " + d.Approver
	case *events.IntentRejectedData:
		return "intent rejected", d.Reason
	}
	return string(e.Type), ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printSummary(out io.Writer, s Summary, took time.Duration) {
	fmt.Fprintf(out, "\nSummary after %.1fs: order %s, %d of %d steps completed\n", took.Seconds(), s.OrderID, s.Completed, len(Steps))
	if s.Waiting != "" {
		fmt.Fprintf(out, "  waiting for an approver: %s\n", s.Waiting)
	}
	fmt.Fprintf(out, "  %-10s %9s %8s %7s %11s\n", "service", "requests", "effects", "undone", "duplicates")
	for _, t := range s.Tallies {
		fmt.Fprintf(out, "  %-10s %9d %8d %7d %11d\n", t.Service, t.Requests, t.Effects, t.Released, t.Duplicates)
	}
	fmt.Fprintf(out, "duplicates: %d\n", s.Duplicates)
	var keys []string
	for _, op := range s.Operations {
		keys = append(keys, fmt.Sprintf("%s=%s", op.Key, op.Status))
	}
	fmt.Fprintf(out, "operations: %s\n", strings.Join(keys, " "))
}
