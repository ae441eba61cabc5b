package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
)

// Publisher sends workflow events to Kafka and returns once the brokers
// acknowledged them (kafka.Producer).
type Publisher interface {
	Send(ctx context.Context, records []kafka.Record) error
}

// DriverConfig configures a Driver.
type DriverConfig struct {
	// PollInterval is how often the driver looks for runs whose awaited
	// operation settled, when nothing woke it sooner. Default 200ms.
	PollInterval time.Duration
	// Batch bounds the runs advanced, and the events published, per round.
	// Default 100.
	Batch  int
	Logger *slog.Logger
	// CrashPoint, when set, is called at the points where a crash matters
	// (Point*), so the crash tests can kill the process there (a binary
	// built with -tags crashpoints). Nil in production.
	CrashPoint func(point string)
}

// Points where DriverConfig.CrashPoint is called. A transition taken while
// the run unwinds (an undo completed, the next undo's intent follows) is
// named apart, so a test can kill a process in the middle of an unwind.
const (
	// PointBeforeIntent: inside a transition's transaction, the workflow
	// events journaled, the next step's intent not yet recorded.
	PointBeforeIntent = "workflow_before_intent"
	// PointAfterTransition: the transition committed with the next step's
	// intent; no executor has claimed it yet.
	PointAfterTransition = "workflow_after_transition"
	// PointUndoBeforeIntent and PointUndoAfterTransition are the same
	// points of a transition from an unwinding run.
	PointUndoBeforeIntent    = "workflow_undo_before_intent"
	PointUndoAfterTransition = "workflow_undo_after_transition"
)

func (d *Driver) crashPoint(p string) {
	if d.cfg.CrashPoint != nil {
		d.cfg.CrashPoint(p)
	}
}

// WithDefaults fills the zero fields.
func (c DriverConfig) WithDefaults() DriverConfig {
	if c.PollInterval <= 0 {
		c.PollInterval = 200 * time.Millisecond
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Driver advances workflow runs and publishes their events.
//
// It finds its work in PostgreSQL rather than on the outcomes topic: a run
// waits on exactly one operation (events.Workflow.Awaiting, a column), and the sweep
// joins the waiting runs to the operations' head rows, so "the operation
// settled" is read from the same database the transition is written to.
// Each transition runs in one transaction that locks the run's row (SKIP
// LOCKED, so drivers in several processes share the work), checks again
// that the run still waits on that operation and the operation is still
// settled, appends the events (the head moves only from the seq it was read
// at) and records the next intent. A crash before the commit leaves the run
// waiting on the settled operation, and the next sweep takes the same
// transition; after the commit the run waits on the next operation, so a
// replay finds nothing to do. The in-process store's append hook wakes the
// driver at once; other processes' appends are found by the poll.
type Driver struct {
	svc *Service
	pub Publisher
	cfg DriverConfig
	// wake is signalled by appends in this process.
	wake chan struct{}
}

// NewDriver returns a driver over svc's workflows. pub may be nil: then
// the driver advances runs and leaves their events unpublished.
func NewDriver(svc *Service, pub Publisher, cfg DriverConfig) *Driver {
	d := &Driver{svc: svc, pub: pub, cfg: cfg.WithDefaults(), wake: make(chan struct{}, 1)}
	svc.store.OnAppend(func() {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	})
	return d
}

// Run advances runs until ctx ends.
func (d *Driver) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	for {
		n, err := d.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.cfg.Logger.WarnContext(ctx, "workflow driver round failed", slog.Any("error", err))
		}
		if _, err := d.PublishOnce(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.WarnContext(ctx, "publishing workflow events failed", slog.Any("error", err))
		}
		if n > 0 {
			continue // more may be waiting; the transitions' own appends woke nobody else
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-d.wake:
		}
	}
}

// sweepSQL lists runs whose awaited operation has settled. It reads
// without locking; each transition locks and checks again.
const sweepSQL = `
SELECT w.workflow_id
  FROM workflows w
  JOIN operations o ON o.operation_key = w.awaiting
 WHERE w.awaiting IS NOT NULL
   AND o.status IN ('completed', 'failed', 'compensated')
 ORDER BY w.updated_at
 LIMIT $1`

// RunOnce takes every transition that is due now and returns how many it
// took.
func (d *Driver) RunOnce(ctx context.Context) (int, error) {
	rows, err := d.svc.pool.Query(ctx, sweepSQL, d.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("workflow sweep: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("workflow sweep: %w", err)
	}
	n := 0
	var errs []error
	for _, id := range ids {
		ok, err := d.advance(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			n++
		}
	}
	if n > 0 {
		d.svc.store.NotifyAppended()
	}
	return n, errors.Join(errs...)
}

func (d *Driver) advance(ctx context.Context, id string) (bool, error) {
	done := false
	before, after := PointBeforeIntent, PointAfterTransition
	intents := false
	err := pgx.BeginFunc(ctx, d.svc.pool, func(tx pgx.Tx) error {
		var raw []byte
		err := tx.QueryRow(ctx, `SELECT record FROM workflows WHERE workflow_id = $1 FOR UPDATE SKIP LOCKED`, id).Scan(&raw)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // another driver holds it
		}
		if err != nil {
			return err
		}
		var r events.Workflow
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		if r.Awaiting == "" || !r.Status.Active() {
			return nil
		}
		op, err := store.LoadTx(ctx, tx, r.Awaiting)
		if err != nil {
			return err
		}
		if !settled(op.Status) {
			return nil
		}
		p, err := d.svc.eng.advance(r, op, d.svc.now())
		if err != nil {
			return err
		}
		if r.Status == events.WorkflowUnwinding {
			before, after = PointUndoBeforeIntent, PointUndoAfterTransition
		}
		if intents = len(p.intents) > 0; intents {
			p.beforeIntents = func() { d.crashPoint(before) }
		}
		tp, err := workflowTrace(ctx, tx, id)
		if err != nil {
			return err
		}
		ok, err := write(ctx, tx, r, p, d.svc.prefix, tp)
		if err != nil {
			return err
		}
		done = ok
		if ok {
			for _, e := range p.events {
				d.cfg.Logger.InfoContext(ctx, "workflow event", slog.String("workflow_id", id),
					slog.String("type", string(e.Type)), slog.Int64("seq", e.Seq))
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("advancing workflow %s: %w", id, err)
	}
	if done && intents {
		d.crashPoint(after)
	}
	return done, nil
}

// publisherLock is the advisory lock key of the one publisher at a time:
// with a single publisher, events of a run go out in seq order without the
// outbox's per-row guard.
const publisherLock = 0x6566776b666c6f77 // "efwkflow"

// PublishOnce publishes one batch of unpublished workflow events to the
// workflows topic, at least once and in order per workflow id (the message
// key), and returns how many it published.
func (d *Driver) PublishOnce(ctx context.Context) (int, error) {
	if d.pub == nil {
		return 0, nil
	}
	n := 0
	topic := d.svc.prefix + events.TopicWorkflows
	err := pgx.BeginFunc(ctx, d.svc.pool, func(tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(publisherLock)).Scan(&got); err != nil || !got {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT workflow_id, seq, envelope, traceparent FROM workflow_events
			WHERE NOT published ORDER BY workflow_id, seq LIMIT $1`, d.cfg.Batch)
		if err != nil {
			return err
		}
		var recs []kafka.Record
		var ids []string
		var seqs []int64
		for rows.Next() {
			var id, tp string
			var seq int64
			var raw []byte
			if err := rows.Scan(&id, &seq, &raw, &tp); err != nil {
				rows.Close()
				return err
			}
			var e events.WorkflowEnvelope
			if err := json.Unmarshal(raw, &e); err != nil {
				rows.Close()
				return fmt.Errorf("workflow %s seq %d: %w", id, seq, err)
			}
			// The record's key and CloudEvents subject are the workflow id,
			// so a workflow's events stay in order on one partition.
			recs = append(recs, kafka.EventRecord(traceparent.ContextWith(ctx, tp), topic, events.Envelope{
				EventID: e.EventID, Type: events.Type(e.Type), OperationKey: e.WorkflowID, Seq: e.Seq, OccurredAt: e.OccurredAt,
			}, raw))
			ids, seqs = append(ids, id), append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		if err := d.pub.Send(ctx, recs); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE workflow_events w SET published = true
			FROM unnest($1::text[], $2::bigint[]) AS u(id, seq) WHERE w.workflow_id = u.id AND w.seq = u.seq`, ids, seqs); err != nil {
			return err
		}
		n = len(recs)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("publishing workflow events: %w", err)
	}
	return n, nil
}
