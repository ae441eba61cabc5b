package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// Config configures the worked example.
type Config struct {
	Store      *store.Store
	Downstream *Downstream
	Out        io.Writer
	// OrderID names the order; its steps' operation keys derive from it, so
	// running the demo again with the same id resumes where it stopped.
	OrderID string
	// StepTimeout bounds the wait for one step. Default 60s.
	StepTimeout time.Duration
	// TopicPrefix must match the deployment's. Default "effectline.".
	TopicPrefix string
}

// Step is one step of the order workflow.
type Step struct {
	Name string
	Tool string
	Args string
	Why  string
}

// Steps is the order: reserve inventory → charge the customer → confirm.
var Steps = []Step{
	{"reserve", "inventory.reserve", `{"sku":"SKU-42","quantity":2}`,
		"compensable: its first response is lost → undo → retry under a new key"},
	{"charge", "payments.charge", `{"amount":4999,"currency":"EUR","card_number":"4242424242424242"}`,
		"irreversible: its response is lost after the charge committed → reconciliation finds it → no second charge"},
	{"confirm", "email.send", `{"to":"customer@example.com","template":"order_confirmed"}`,
		"irreversible: 429 with Retry-After: 1 → a delayed retry"},
}

// Summary is the outcome of the worked example.
type Summary struct {
	OrderID    string
	Operations []events.Operation
	Tallies    []Tally
	Duplicates int
	Completed  int
}

// Run places one order through the three steps, each with its own operation
// key, printing a live timeline; it stops at the first step that does not
// complete. The agent's business write (the order row) and each intent
// commit in one transaction, as an agent service would do it.
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
	tl := &timeline{out: cfg.Out, start: start}
	fmt.Fprintf(cfg.Out, "\nWorked example: order %s — reserve inventory → charge the customer → send the confirmation\n", cfg.OrderID)
	for _, step := range Steps {
		key, err := outbox.OperationKey(cfg.OrderID, step.Name)
		if err != nil {
			return sum, fmt.Errorf("demo: %w", err)
		}
		fmt.Fprintf(cfg.Out, "\n%s  (%s)\n", step.Tool, step.Why)
		var appended outbox.Appended
		err = pgx.BeginFunc(ctx, cfg.Store.Pool(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO demo_orders (order_id, step) VALUES ($1, $2)
				ON CONFLICT (order_id) DO UPDATE SET step = EXCLUDED.step, updated_at = now()`, cfg.OrderID, step.Name); err != nil {
				return err
			}
			var err error
			appended, err = outbox.Writer{TopicPrefix: cfg.TopicPrefix}.Append(ctx, tx, outbox.Intent{
				OperationKey: key, Tool: step.Tool, EffectClass: classOf(step.Tool),
				Args: json.RawMessage(step.Args), Principal: "order-agent",
			})
			return err
		})
		if err != nil {
			return sum, fmt.Errorf("demo: recording the %s intent: %w", step.Name, err)
		}
		cfg.Store.NotifyAppended()
		if !appended.Created {
			fmt.Fprintf(cfg.Out, "  (operation %s already exists: resuming it)\n", key)
		}
		op, err := tl.follow(ctx, cfg.Store, key, cfg.StepTimeout)
		sum.Operations = append(sum.Operations, op)
		if err != nil {
			return sum, err
		}
		if op.Status != events.StatusCompleted {
			fmt.Fprintf(cfg.Out, "\nStopped: %s is %s. Decide at /ui/ and run the demo again with --order-id %s to resume.\n",
				key, op.Status, cfg.OrderID)
			break
		}
		sum.Completed++
	}
	sum.Tallies = cfg.Downstream.Tallies()
	for _, t := range sum.Tallies {
		sum.Duplicates += t.Duplicates
	}
	printSummary(cfg.Out, sum, time.Since(start))
	return sum, nil
}

func classOf(toolName string) events.EffectClass {
	if toolName == "inventory.reserve" {
		return events.Compensable
	}
	return events.Irreversible
}

// timeline prints an operation's events as they are journaled.
type timeline struct {
	out   io.Writer
	start time.Time
}

// follow prints new events of key until the operation settles: terminal,
// or waiting for a human.
func (tl *timeline) follow(ctx context.Context, st *store.Store, key string, timeout time.Duration) (events.Operation, error) {
	deadline := time.Now().Add(timeout)
	var seq int64
	for {
		evs, err := st.Events(ctx, key, seq)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return events.Operation{}, err
		}
		for _, e := range evs {
			tl.print(e.Envelope)
			seq = e.Seq
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

func (tl *timeline) print(e events.Envelope) {
	what, why := describe(e)
	fmt.Fprintf(tl.out, "  %+8.3fs  %-24s %s\n", time.Since(tl.start).Seconds(), what, why)
}

// describe says what an event means and which rule applied, in words.
func describe(e events.Envelope) (what, why string) {
	d, err := e.DecodeData()
	if err != nil {
		return string(e.Type), err.Error()
	}
	switch d := d.(type) {
	case *events.IntentData:
		return "intent recorded", "key " + e.OperationKey + ", committed with the order row in one transaction"
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
	fmt.Fprintf(out, "\nSummary: order %s, %d of %d steps completed in %.1fs\n", s.OrderID, s.Completed, len(Steps), took.Seconds())
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
