// Package pruner enforces retention: it prunes settled operations to
// tombstones once their tool's dedup window has passed, settled workflow
// runs once their workflow's retention has passed, and deletes tombstones
// older than the tombstone retention. The statements and the race they
// close are the store's (store/prune.go) and the workflow journal's
// (workflow/prune.go); this package decides what to prune when, elects
// the one replica that prunes in the background, and paces the work so
// that it stays off the write path's latency.
package pruner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
)

// DefaultRetention is the dedup window of a tool that names none.
const DefaultRetention = 720 * time.Hour

// DefaultLeaderLockKey is the advisory lock key that elects the pruning
// replica ("pruner" in ASCII). Deployments sharing a database share it.
const DefaultLeaderLockKey int64 = 0x7072756e6572

// Config configures a Pruner. Zero fields take the defaults.
type Config struct {
	// Windows holds the dedup_window of the tools that set one.
	Windows map[string]time.Duration
	// Default is the window of every other tool, including tools no longer
	// in the tools file, and the retention of a workflow no longer in it.
	// Default DefaultRetention.
	Default time.Duration
	// WorkflowTools holds, per declared workflow, the tools whose
	// operations its runs record (workflow.Def.Tools); see WorkflowWindow.
	WorkflowTools map[string][]string
	// TombstoneRetention is how long a tombstone is kept after it was made.
	// Zero keeps tombstones forever.
	TombstoneRetention time.Duration
	// Interval is how often the leader looks for work. Default 30s.
	Interval time.Duration
	// Batch bounds the operations one page of a pass reads and prunes, and
	// the runs and tombstones one statement prunes or deletes. Default 500.
	Batch int
	// Pace is the share of wall time the pruner may spend in its
	// statements while it works through a backlog: after each page or
	// batch it waits (1-Pace)/Pace times as long as it took. Default 0.5.
	Pace float64
	// LeaderLockKey is the advisory lock of the election. Default
	// DefaultLeaderLockKey.
	LeaderLockKey int64

	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	Now           func() time.Time
}

// WithDefaults returns c with its zero fields set.
func (c Config) WithDefaults() Config {
	if c.Default <= 0 {
		c.Default = DefaultRetention
	}
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Pace <= 0 || c.Pace > 1 {
		c.Pace = 0.5
	}
	if c.LeaderLockKey == 0 {
		c.LeaderLockKey = DefaultLeaderLockKey
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	if c.TombstoneRetention < 0 {
		return errors.New("pruner: the tombstone retention must not be negative")
	}
	for tool, w := range c.Windows {
		if w < 0 {
			return fmt.Errorf("pruner: the dedup window of %s must not be negative", tool)
		}
	}
	return nil
}

// Window returns the dedup window of tool.
func (c Config) Window(tool string) time.Duration {
	if w := c.Windows[tool]; w > 0 {
		return w
	}
	return c.Default
}

// WorkflowWindow returns the retention of the settled runs of workflow
// name: the longest dedup window among the tools its runs use (Window of
// each, so a tool without one counts with Default), or Default for a
// workflow no longer in the tools file.
//
// Why the tools' windows rather than EFFECTLINE_RETENTION alone: a run
// settles after every one of its operations did, so with the longest of
// their windows it is pruned after each of them. While any operation of a
// run keeps its full record, so does the run that explains it (the other
// steps, the escalation, the decisions), and a late duplicate start finds
// the whole run, not a tombstone beside live steps. A deployment that
// shortens every window (a soak with dedup_window: 1m) gets its runs
// pruned as soon, and one tool kept for 90 days keeps its runs as long.
// A run's steps are read from the tools file in force, not from the run's
// record (workflow.started lists them as they were then): the per-tool
// windows of operations follow the current file the same way.
func (c Config) WorkflowWindow(name string) time.Duration {
	tools, ok := c.WorkflowTools[name]
	if !ok || len(tools) == 0 {
		return c.Default
	}
	var w time.Duration
	for _, t := range tools {
		w = max(w, c.Window(t))
	}
	return w
}

// Pruner prunes one database. Create it with New.
type Pruner struct {
	store  *store.Store
	runs   *workflow.Journal
	cfg    Config
	log    *slog.Logger
	leader leader

	pruned      metric.Int64Counter
	expired     metric.Int64Counter
	runsPruned  metric.Int64Counter
	runsExpired metric.Int64Counter
}

// New returns a pruner for st.
func New(st *store.Store, cfg Config) (*Pruner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Pruner{store: st, runs: workflow.NewJournal(st.Pool()), cfg: cfg, log: cfg.Logger, leader: leader{key: cfg.LeaderLockKey}}
	m := cfg.MeterProvider.Meter("github.com/effectline/effectline/pruner")
	if err := metrics.Counters(m,
		metrics.Counter{Into: &p.pruned, Name: "effectline.operations_pruned",
			Description: "Settled operations pruned to tombstones after their tool's dedup window, by tool."},
		metrics.Counter{Into: &p.expired, Name: "effectline.tombstones_expired",
			Description: "Tombstones deleted after the tombstone retention; their keys are free again."},
		metrics.Counter{Into: &p.runsPruned, Name: "effectline.workflows_pruned",
			Description: "Settled workflow runs pruned to tombstones after their workflow's retention, by workflow."},
		metrics.Counter{Into: &p.runsExpired, Name: "effectline.workflow_tombstones_expired",
			Description: "Workflow run tombstones deleted after the tombstone retention; their ids are free again."},
	); err != nil {
		return nil, err
	}
	return p, nil
}

// Counts says what one pass did.
type Counts struct {
	// Pruned and Expired count operations and their tombstones.
	Pruned  int
	Expired int
	// RunsPruned and RunsExpired count workflow runs and theirs.
	RunsPruned  int
	RunsExpired int
}

// Run prunes in the background until ctx ends, on the replica that holds
// the leader lock; the others wait their turn. A pass runs at start and
// then every Interval (±20%, so replicas drift apart).
func (p *Pruner) Run(ctx context.Context) error {
	defer p.leader.release(context.WithoutCancel(ctx))
	for {
		if p.leader.ensure(ctx, p.store.Pool()) {
			n, err := p.RunOnce(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				p.log.WarnContext(ctx, "pruning failed", "error", err, "operations_pruned", n.Pruned,
					"workflows_pruned", n.RunsPruned)
			case n.Pruned+n.Expired+n.RunsPruned+n.RunsExpired > 0:
				p.log.InfoContext(ctx, "pruned", "operations_pruned", n.Pruned, "tombstones_expired", n.Expired,
					"workflows_pruned", n.RunsPruned, "workflow_tombstones_expired", n.RunsExpired)
			}
		}
		wait := time.Duration(float64(p.cfg.Interval) * (0.8 + 0.4*rand.Float64()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// RunOnce prunes everything due now, page by page, and expires old
// tombstones; it returns when nothing due is left. Operations go first,
// then runs; the order does not matter (workflow/prune.go says why), and
// an operation a run still awaits is never pruned. It takes no lock: two
// passes running at once (two replicas in the window of a leader change,
// `effectline prune` beside the background pruner) lock disjoint rows and
// each operation and each run is pruned once.
func (p *Pruner) RunOnce(ctx context.Context) (Counts, error) {
	var n Counts
	var errs []error
	// fail keeps going after a failed batch of one tool or workflow, so
	// that one cannot hold back the others, unless the pass was cancelled.
	fail := func(err error) bool {
		if err == nil {
			return false
		}
		errs = append(errs, err)
		return ctx.Err() != nil
	}
	tools, err := p.store.SettledTools(ctx)
	if fail(err) {
		return n, errors.Join(errs...)
	}
	for _, tool := range tools {
		before := p.cfg.Now().Add(-p.cfg.Window(tool))
		// One pass over the tool, a page after another: the cursor moves
		// past the candidates a page could not prune (awaited, locked), so
		// a full page that pruned few is followed, not taken for the end.
		var cur store.PruneCursor
		pruned, err := p.drain(ctx, func(ctx context.Context) (int, bool, error) {
			page, err := p.store.PruneSettledPage(ctx, tool, cur, before, p.cfg.Now(), p.cfg.Batch)
			cur = page.Next
			return page.Pruned, page.Full, err
		})
		n.Pruned += pruned
		if pruned > 0 {
			p.pruned.Add(ctx, int64(pruned), metric.WithAttributes(attribute.String("tool", tool)))
		}
		if fail(err) {
			return n, errors.Join(errs...)
		}
	}
	names, err := p.runs.SettledWorkflows(ctx)
	if fail(err) {
		return n, errors.Join(errs...)
	}
	for _, name := range names {
		before := p.cfg.Now().Add(-p.cfg.WorkflowWindow(name))
		pruned, err := p.drain(ctx, p.batch(func(ctx context.Context) (int, error) {
			return p.runs.PruneSettled(ctx, name, before, p.cfg.Now(), p.cfg.Batch)
		}))
		n.RunsPruned += pruned
		if pruned > 0 {
			p.runsPruned.Add(ctx, int64(pruned), metric.WithAttributes(attribute.String("workflow", name)))
		}
		if fail(err) {
			return n, errors.Join(errs...)
		}
	}
	if p.cfg.TombstoneRetention > 0 {
		before := p.cfg.Now().Add(-p.cfg.TombstoneRetention)
		expired, err := p.drain(ctx, p.batch(func(ctx context.Context) (int, error) {
			return p.store.ExpireTombstones(ctx, before, p.cfg.Batch)
		}))
		n.Expired = expired
		if expired > 0 {
			p.expired.Add(ctx, int64(expired))
		}
		if fail(err) {
			return n, errors.Join(errs...)
		}
		expired, err = p.drain(ctx, p.batch(func(ctx context.Context) (int, error) {
			return p.runs.ExpireTombstones(ctx, before, p.cfg.Batch)
		}))
		n.RunsExpired = expired
		if expired > 0 {
			p.runsExpired.Add(ctx, int64(expired))
		}
		fail(err)
	}
	return n, errors.Join(errs...)
}

// drain runs step until it says no more may follow, pausing after each
// step in proportion to its duration. The pause is what keeps a backlog
// (the first pass after retention is switched on, or after an outage) from
// taking a connection and the disk away from the write path for minutes
// on end: the writes it competes with are the fsyncs of the hot path's
// commits.
func (p *Pruner) drain(ctx context.Context, step func(context.Context) (n int, more bool, err error)) (int, error) {
	total := 0
	for {
		start := time.Now()
		n, more, err := step(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
		pause := time.Duration(float64(time.Since(start)) * (1 - p.cfg.Pace) / p.cfg.Pace)
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// batch makes a step of one bounded statement that takes the oldest of
// what is due: more may follow while it returns a full batch.
func (p *Pruner) batch(statement func(context.Context) (int, error)) func(context.Context) (int, bool, error) {
	return func(ctx context.Context) (int, bool, error) {
		n, err := statement(ctx)
		return n, n >= p.cfg.Batch, err
	}
}
