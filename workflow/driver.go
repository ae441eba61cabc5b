package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

// Publisher sends workflow events to Kafka and returns once the brokers
// acknowledged them (kafka.Producer).
type Publisher interface {
	Send(ctx context.Context, records []kafka.Record) error
}

// DriverConfig configures a Driver.
type DriverConfig struct {
	// PollInterval is how often the driver looks for runs whose awaited
	// operation settled, when nothing woke it sooner, and how often the
	// publisher looks for unpublished events. Default 200ms.
	PollInterval time.Duration
	// Batch bounds the runs advanced per round, all in one transaction.
	// Default 50.
	Batch int
	// PublishBatch bounds the events published per Kafka send and per
	// transaction of the publisher. Default 500.
	PublishBatch int
	// RetryBackoff is how long a run that failed to advance is left out of
	// the rounds before it is tried again; it doubles with every failure in
	// a row, up to MaxRetryBackoff. Defaults 500ms and 1 minute.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	Logger          *slog.Logger
	// CrashPoint, when set, is called at the points where a crash matters
	// (Point*), so the crash tests can kill the process there (a binary
	// built with -tags crashpoints). Nil in production.
	CrashPoint func(point string)
}

// Points where DriverConfig.CrashPoint is called. A transition taken while
// the run unwinds (an undo completed, the next undo's intent follows) is
// named apart, so a test can kill a process in the middle of an unwind.
const (
	// PointBeforeIntent: inside a round's transaction, the workflow events
	// of its runs journaled, the next steps' intents not yet recorded.
	PointBeforeIntent = "workflow_before_intent"
	// PointAfterTransition: the round committed with the next steps'
	// intents; no executor has claimed them yet.
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
		c.Batch = 50
	}
	if c.PublishBatch <= 0 {
		c.PublishBatch = 500
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 500 * time.Millisecond
	}
	if c.MaxRetryBackoff < c.RetryBackoff {
		c.MaxRetryBackoff = max(time.Minute, c.RetryBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// RunError is a run the driver could not advance. The round it was in
// went on without it (its other runs committed), and the run is left out
// of the rounds until RetryAt, then tried again from where it stands: a
// failure writes nothing of the run, so it still waits on the same settled
// operation.
type RunError struct {
	WorkflowID string
	// Attempt counts the failures in a row, this one included.
	Attempt int
	RetryAt time.Time
	Err     error
}

func (e *RunError) Error() string {
	return fmt.Sprintf("advancing workflow %s (failure %d in a row, retried after %s): %v",
		e.WorkflowID, e.Attempt, e.RetryAt.Format(time.RFC3339Nano), e.Err)
}

func (e *RunError) Unwrap() error { return e.Err }

// DriverCounts are what a driver did since it was made.
type DriverCounts struct {
	// Rounds is the rounds that committed at least one transition: the
	// driver's synchronous commits.
	Rounds int64
	// Transitions is the runs advanced, over all rounds.
	Transitions int64
	// Isolated is the rounds taken again one run at a time (savepoints)
	// because the batched write of the round failed.
	Isolated int64
	// Failures is the RunErrors.
	Failures int64
	// Published is the workflow events published.
	Published int64
}

// Driver advances workflow runs and publishes their events.
//
// It finds its work in PostgreSQL rather than on the outcomes topic: a run
// waits on exactly one operation (events.Workflow.Awaiting, a column), and
// the sweep joins the waiting runs to the operations' head rows, so "the
// operation settled" is read from the same database the transition is
// written to.
//
// It advances runs in rounds, as the executor's group commit appends: a
// round locks up to Batch due runs in one statement (SKIP LOCKED, so
// drivers in several processes share the work, and each run has one
// driver at a time), decides each run's transition in memory, and writes
// them all in one transaction of a few pipelined round trips: the heads
// and events of every run (a head moves only from the seq it was read at),
// then the next intents of every run. One commit holds each run's step
// completion and its next intent together. A crash before the commit
// leaves every run of the round waiting on its settled operation, and the
// next round takes the same transitions; after the commit the runs wait on
// their next operations, so a replay finds nothing to do.
//
// One run's failure does not hold back the others: a run whose transition
// cannot be decided is left out of the write; when the batched write
// fails, the round is rolled back and taken again with each run in a
// savepoint of its own, so only the failing run is rolled back. Either way
// the run gets a RunError, logged, and a backoff before it is tried again.
//
// The in-process store's append hook wakes the driver at once; other
// processes' appends are found by the poll. Publishing the journaled
// events to Kafka runs beside the rounds, never inside one (Run).
type Driver struct {
	svc *Service
	pub Publisher
	cfg DriverConfig
	// wake is signalled by appends in this process; published by rounds
	// that journaled events.
	wake, publish chan struct{}
	// clock is the time of the backoffs (a test moves it).
	clock func() time.Time

	mu sync.Mutex
	// failing holds the runs that failed to advance, until their backoff
	// ends and a little longer (so a failure in a row is counted as one).
	failing map[string]backoff

	rounds, transitions, isolated, failures, published atomic.Int64
}

type backoff struct {
	attempt int
	until   time.Time
}

// NewDriver returns a driver over svc's workflows. pub may be nil: then
// the driver advances runs and leaves their events unpublished.
func NewDriver(svc *Service, pub Publisher, cfg DriverConfig) *Driver {
	d := &Driver{svc: svc, pub: pub, cfg: cfg.WithDefaults(), clock: time.Now,
		wake: make(chan struct{}, 1), publish: make(chan struct{}, 1), failing: map[string]backoff{}}
	svc.store.OnAppend(func() { signal(d.wake) })
	return d
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Counts returns what the driver did so far.
func (d *Driver) Counts() DriverCounts {
	return DriverCounts{Rounds: d.rounds.Load(), Transitions: d.transitions.Load(), Isolated: d.isolated.Load(),
		Failures: d.failures.Load(), Published: d.published.Load()}
}

// Run advances runs until ctx ends. The events the rounds journal are
// published by a loop of their own beside them, so a Kafka send never
// delays a transition; a round only wakes it.
func (d *Driver) Run(ctx context.Context) error {
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		d.publishLoop(ctx)
	}()
	defer func() { <-pubDone }()
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	for {
		n, err := d.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.logErrors(ctx, err)
		}
		if n >= d.cfg.Batch {
			continue // a full round: more may be waiting
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-d.wake:
		}
	}
}

// logErrors logs each run's failure with its workflow id, and a round's
// own failure.
func (d *Driver) logErrors(ctx context.Context, err error) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, err := range errs {
		var re *RunError
		if errors.As(err, &re) {
			d.cfg.Logger.WarnContext(ctx, "workflow run not advanced; retried after a backoff",
				slog.String("workflow_id", re.WorkflowID), slog.Int("failures", re.Attempt),
				slog.Time("retry_at", re.RetryAt), slog.Any("error", re.Err))
			continue
		}
		d.cfg.Logger.WarnContext(ctx, "workflow driver round failed", slog.Any("error", err))
	}
}

func (d *Driver) publishLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	for {
		n, err := d.PublishOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.cfg.Logger.WarnContext(ctx, "publishing workflow events failed", slog.Any("error", err))
		}
		if err == nil && n >= d.cfg.PublishBatch {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.publish:
		}
	}
}

// lockDueSQL locks the runs whose awaited operation has settled, with what
// a transition needs: the run's head, the operation's head and the run's
// trace context (journaled with its first event). Runs another driver
// holds are skipped, and so are the runs backing off ($2). Only the runs'
// rows are locked. FOR NO KEY UPDATE is enough to keep two drivers and the
// journal's writes apart, and lets the projector's FOR KEY SHARE on the
// same rows through (projector/workflow_state.go); only the prune's FOR
// UPDATE conflicts with that one.
//
// Each run reads its awaited operation by primary key: LIMIT 1 keeps the
// LATERAL from being flattened into a join. As a join, the generic plan of
// a statement prepared on a fresh database (kept until statistics change,
// for good where autovacuum is off) was a nested loop over a materialized
// sequential scan of every settled operation, once per waiting run: rounds
// of hundreds of milliseconds, spilling to disk, that held the driver to a
// fraction of the pipeline's rate (docs/benchmarks.md, session 9).
//
// The outer o.operation_key = w.awaiting is not redundant: a row that
// changed between the statement's snapshot and its lock is checked again
// against the quals outside the LATERAL only (the subquery's row is
// carried over as it was read, and LIMIT keeps the qual from being pushed
// into it), so this is what makes a run that moved on to another operation
// drop out.
const lockDueSQL = `
SELECT w.workflow_id, w.record,
       (SELECT e.traceparent FROM workflow_events e WHERE e.workflow_id = w.workflow_id AND e.seq = 1),
       o.*
  FROM workflows w
 CROSS JOIN LATERAL (
       SELECT o.pruned_at IS NOT NULL, ` + store.HeadColumns + ` FROM operations o
        WHERE o.operation_key = w.awaiting
          AND o.status IN ('completed', 'failed', 'compensated')
        LIMIT 1) o
 WHERE w.awaiting IS NOT NULL
   AND o.operation_key = w.awaiting
   AND w.workflow_id <> ALL($2::text[])
 ORDER BY w.updated_at
 LIMIT $1
   FOR NO KEY UPDATE OF w SKIP LOCKED`

// due is a run a round locked.
type due struct {
	transition
	id   string
	undo bool // unwinding: the crash points are the undo ones
}

// runFailure is a run of a round that failed to advance.
type runFailure struct {
	id  string
	err error
}

// RunOnce takes one round: up to Batch transitions that are due now, in
// one transaction. It returns how many it took, and for each run that
// failed to advance a *RunError (joined), the others being taken anyway.
func (d *Driver) RunOnce(ctx context.Context) (int, error) {
	skip := d.backingOff()
	done, failed, err := d.round(ctx, skip, false)
	if err != nil && ctx.Err() == nil {
		// The batched write failed and was rolled back whole: take the
		// round again with each run in a savepoint of its own, so the
		// run at fault is found and the others advance.
		d.isolated.Add(1)
		var ierr error
		done, failed, ierr = d.round(ctx, skip, true)
		if ierr != nil {
			return 0, fmt.Errorf("workflow round: %w (taken one run at a time after: %v)", ierr, err)
		}
	} else if err != nil {
		return 0, fmt.Errorf("workflow round: %w", err)
	}

	var errs []error
	for _, f := range failed {
		errs = append(errs, d.fail(f))
	}
	if len(done) == 0 {
		return 0, errors.Join(errs...)
	}
	d.rounds.Add(1)
	d.transitions.Add(int64(len(done)))
	d.mu.Lock()
	for _, r := range done {
		delete(d.failing, r.id)
	}
	d.mu.Unlock()
	for _, r := range done {
		if len(r.p.intents) == 0 {
			continue
		}
		if r.undo {
			d.crashPoint(PointUndoAfterTransition)
		} else {
			d.crashPoint(PointAfterTransition)
		}
	}
	d.svc.store.NotifyAppended()
	signal(d.publish)
	return len(done), errors.Join(errs...)
}

// round locks the due runs, decides their transitions and writes them in
// one transaction. isolate writes each run in a savepoint of its own (the
// slow way, after the batched write failed). It returns the runs advanced
// and those that failed; err is the round's own failure, nothing committed.
func (d *Driver) round(ctx context.Context, skip []string, isolate bool) (done []*due, failed []runFailure, err error) {
	err = pgx.BeginFunc(ctx, d.svc.pool, func(tx pgx.Tx) error {
		done, failed = nil, nil
		runs, bad, err := d.lockDue(ctx, tx, skip)
		if err != nil {
			return err
		}
		failed = bad
		if len(runs) == 0 {
			return nil
		}
		// The undo points are those of a run that was unwinding already:
		// an undo completed, the next undo's intent follows.
		before := func(t *transition) {
			if t.base.Status == events.WorkflowUnwinding {
				d.crashPoint(PointUndoBeforeIntent)
			} else {
				d.crashPoint(PointBeforeIntent)
			}
		}
		if !isolate {
			ts := make([]*transition, len(runs))
			for i, r := range runs {
				ts[i] = &r.transition
			}
			if err := writeTransitions(ctx, tx, ts, d.svc.prefix, before); err != nil {
				return err
			}
			for _, r := range runs {
				if r.done {
					done = append(done, r)
				}
			}
			return nil
		}
		for _, r := range runs {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := writeTransitions(ctx, sp, []*transition{&r.transition}, d.svc.prefix, before); err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil {
					return rerr
				}
				r.done = false
				failed = append(failed, runFailure{r.id, err})
				continue
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			if r.done {
				done = append(done, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, r := range done {
		for _, e := range r.p.events {
			d.cfg.Logger.InfoContext(ctx, "workflow event", slog.String("workflow_id", r.id),
				slog.String("type", string(e.Type)), slog.Int64("seq", e.Seq))
		}
	}
	return done, failed, nil
}

// lockDue locks the round's runs and decides their transitions. A run
// whose transition cannot be decided is returned as failed, and nothing of
// it is written.
func (d *Driver) lockDue(ctx context.Context, tx pgx.Tx, skip []string) ([]*due, []runFailure, error) {
	rows, err := tx.Query(ctx, lockDueSQL, d.cfg.Batch, skip)
	if err != nil {
		return nil, nil, fmt.Errorf("locking the due workflow runs: %w", store.InterpretError(err))
	}
	type locked struct {
		id     string
		run    []byte
		pruned bool
		tp     *string
		op     events.Operation
	}
	var ls []locked
	for rows.Next() {
		var (
			l    locked
			head store.Head
		)
		if err := rows.Scan(append([]any{&l.id, &l.run, &l.tp, &l.pruned}, head.Dest()...)...); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("locking the due workflow runs: %w", err)
		}
		op, err := head.Operation()
		if err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("locking the due workflow runs: %w", err)
		}
		l.op = op
		ls = append(ls, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("locking the due workflow runs: %w", store.InterpretError(err))
	}
	// One time for the round: its transitions' events share it, so the
	// journal tells a round's transactions apart (CountTransitions).
	now := d.svc.now()
	var runs []*due
	var failed []runFailure
	for _, l := range ls {
		var r events.Workflow
		if err := json.Unmarshal(l.run, &r); err != nil {
			failed = append(failed, runFailure{l.id, fmt.Errorf("decoding the record: %w", err)})
			continue
		}
		dr, err := d.decide(r, l.op, l.pruned, l.tp, now)
		if err != nil {
			failed = append(failed, runFailure{l.id, err})
			continue
		}
		if dr != nil {
			runs = append(runs, dr)
		}
	}
	return runs, failed, nil
}

// decide is one locked run's transition, or nil when it has none to take.
func (d *Driver) decide(r events.Workflow, op events.Operation, pruned bool, tp *string, now time.Time) (*due, error) {
	if r.Awaiting == "" || !r.Status.Active() {
		return nil, nil
	}
	if pruned {
		return nil, fmt.Errorf("the awaited operation %s was pruned", r.Awaiting)
	}
	if !settled(op.Status) {
		return nil, nil
	}
	if tp == nil {
		return nil, fmt.Errorf("loading the trace context of workflow %s: no first event", r.WorkflowID)
	}
	p, err := d.svc.eng.advance(r, op, now)
	if err != nil {
		return nil, err
	}
	return &due{transition: transition{base: r, p: p, tp: *tp}, id: r.WorkflowID,
		undo: r.Status == events.WorkflowUnwinding}, nil
}

// backingOff lists the runs whose backoff has not ended, and forgets the
// failures long past.
func (d *Driver) backingOff() []string {
	now := d.clock()
	d.mu.Lock()
	defer d.mu.Unlock()
	skip := []string{}
	for id, b := range d.failing {
		switch {
		case now.Before(b.until):
			skip = append(skip, id)
		case now.Sub(b.until) > d.cfg.MaxRetryBackoff:
			delete(d.failing, id)
		}
	}
	return skip
}

// fail records a run's failure and its backoff.
func (d *Driver) fail(f runFailure) *RunError {
	now := d.clock()
	d.mu.Lock()
	b := d.failing[f.id]
	b.attempt++
	wait := d.cfg.RetryBackoff << min(b.attempt-1, 20)
	if wait <= 0 || wait > d.cfg.MaxRetryBackoff {
		wait = d.cfg.MaxRetryBackoff
	}
	b.until = now.Add(wait)
	d.failing[f.id] = b
	d.mu.Unlock()
	d.failures.Add(1)
	return &RunError{WorkflowID: f.id, Attempt: b.attempt, RetryAt: b.until, Err: f.err}
}

// publisherLock is the advisory lock key of the one publisher at a time:
// with a single publisher, events of a run go out in seq order without the
// outbox's per-row guard.
const publisherLock = 0x6566776b666c6f77 // "efwkflow"

// publishLockSQL takes the publisher's lock and has the rest of its
// transaction planned by key. markPublishedSQL joins the published (id,
// seq) pairs to workflow_events; its generic plan, made while the journal
// was small (a fresh database) and kept until an ANALYZE or the end of the
// connection (pgxpool's default lifetime is an hour), hashed a sequential
// scan of the whole journal, every run's events since the last prune, for
// every batch published (1.2 ms a batch after 1,000 runs, growing with the
// journal; docs/benchmarks.md, session 18). Without
// sequential scans and hash or merge joins it is one primary-key probe
// per published event (TestThePublisherMarksByKey). The settings end with
// the transaction.
const publishLockSQL = `SELECT pg_try_advisory_xact_lock($1), set_config('enable_seqscan', 'off', true),
	set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// markPublishedSQL marks the events ($1 ids, $2 seqs) published.
const markPublishedSQL = `UPDATE workflow_events w SET published = true
	FROM unnest($1::text[], $2::bigint[]) AS u(id, seq) WHERE w.workflow_id = u.id AND w.seq = u.seq`

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
		if err := tx.QueryRow(ctx, publishLockSQL, int64(publisherLock)).Scan(&got, nil, nil, nil); err != nil || !got {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT workflow_id, seq, envelope, traceparent FROM workflow_events
			WHERE NOT published ORDER BY workflow_id, seq LIMIT $1`, d.cfg.PublishBatch)
		if err != nil {
			return err
		}
		var recs []kafka.Record
		var ids []string
		var seqs []int64
		for rows.Next() {
			var id, tp string
			var seq int64
			var stored []byte
			if err := rows.Scan(&id, &seq, &stored, &tp); err != nil {
				rows.Close()
				return err
			}
			raw, err := packed.Unpack(stored, "")
			if err != nil {
				rows.Close()
				return fmt.Errorf("workflow %s seq %d: %w", id, seq, err)
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
		if _, err := tx.Exec(ctx, markPublishedSQL, ids, seqs); err != nil {
			return err
		}
		n = len(recs)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("publishing workflow events: %w", err)
	}
	d.published.Add(int64(n))
	return n, nil
}
