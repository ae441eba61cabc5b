// Package reconciler settles operations whose outcome is unknown (contract §1,
// §4): it asks the downstream system "did this operation already happen?",
// records success when it did, schedules a retry where the effect class
// allows one when it provably did not, and otherwise escalates to the
// approval gate with evidence. It also declares attempts Unknown when the
// worker holding their lease died, records the approvers' decisions
// (Decide), and applies verified inbound callbacks from tools (Webhooks).
//
// Every state change here is an append to the event store conditioned on the
// record it was decided from (store.Append's Base). Nothing is read, decided
// and written without that guard, so the reconciler can race the executor, a
// late outcome, a webhook, an approver and other reconciler replicas freely:
// whoever appends first wins, and every loser reloads the operation and
// decides again from what the winner wrote — which is usually "nothing left
// to do".
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// Tools is what the reconciler needs of the tools registry.
type Tools interface {
	Get(name string) (tool.Tool, bool)
}

// Backoff spaces the re-asks of a downstream that could not tell.
type Backoff struct {
	// Base is the wait after the first unanswered ask; it doubles per ask.
	Base time.Duration
	// Max caps one wait.
	Max time.Duration
}

// Config configures a Reconciler.
type Config struct {
	Kafka kafka.Config
	// Group is the Kafka consumer group on the outcomes topic. Default
	// "effectline-reconciler".
	Group string
	// SweepInterval is how often the leader looks for expired leases and
	// for unresolved operations nobody is working on, and how often a
	// replica that is not the leader tries to become it. Default 1s.
	SweepInterval time.Duration
	// ResweepAfter is how long an operation may wait in
	// needs_reconciliation before the sweep asks again on its own: the
	// safety net for a lost or skipped outcome message and for asks cut
	// short by a restart. Default 30s.
	ResweepAfter time.Duration
	// SweepBatch caps the operations one sweep handles per kind. Default 256.
	SweepBatch int
	// Concurrency caps the reconciliations running at once in this process.
	// Default 32.
	Concurrency int
	// ToolConcurrency caps the asks in flight to one tool, so a downstream
	// that stalls cannot take every worker. Default Concurrency/4 (at least 1).
	ToolConcurrency int
	// AskTimeout bounds one "did it happen?" request, on top of the tool's
	// own timeout. Default 30s.
	AskTimeout time.Duration
	// AskBackoff spaces re-asks after "cannot tell". Default 500ms doubling
	// up to 10s.
	AskBackoff Backoff
	// MaxAsks is how many times a downstream is asked before "cannot tell"
	// becomes an escalation. Default 5.
	MaxAsks int
	// WebhookRetention is how long webhook delivery ids are kept for
	// deduplication; the leader's sweep deletes older ones. It must exceed
	// twice the signature tolerance (10 minutes). Default 24h.
	WebhookRetention time.Duration
	// LeaderLockKey is the Postgres advisory lock that elects the sweeper.
	// Deployments sharing one database must share it. Default DefaultLeaderLockKey.
	LeaderLockKey int64
	// Committer, if set, is shared with other components of the process so
	// their appends share commits; otherwise the reconciler runs its own.
	Committer *store.Committer

	// Base is where the component logs, traces and counts, and its clock
	// and randomness; unset fields default (service.Base.WithDefaults).
	service.Base
}

// DefaultLeaderLockKey is the advisory lock key of the sweeper election
// ("reconcile" in ASCII, truncated to fit an int64).
const DefaultLeaderLockKey int64 = 0x7265636f6e63696c

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Group == "" {
		c.Group = "effectline-reconciler"
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Second
	}
	if c.ResweepAfter <= 0 {
		c.ResweepAfter = 30 * time.Second
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 256
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
	if c.ToolConcurrency <= 0 {
		c.ToolConcurrency = max(1, c.Concurrency/4)
	}
	if c.AskTimeout <= 0 {
		c.AskTimeout = 30 * time.Second
	}
	if c.AskBackoff.Base <= 0 {
		c.AskBackoff.Base = 500 * time.Millisecond
	}
	if c.AskBackoff.Max <= 0 {
		c.AskBackoff.Max = 10 * time.Second
	}
	if c.MaxAsks <= 0 {
		c.MaxAsks = 5
	}
	if c.WebhookRetention <= 0 {
		c.WebhookRetention = 24 * time.Hour
	}
	if c.LeaderLockKey == 0 {
		c.LeaderLockKey = DefaultLeaderLockKey
	}
	c.Base = c.Base.WithDefaults()
	c.Kafka = c.Kafka.WithDefaults()
	return c
}

func (c Config) validate() error {
	if c.AskBackoff.Max < c.AskBackoff.Base {
		return fmt.Errorf("reconciler: AskBackoff.Max %v is below AskBackoff.Base %v", c.AskBackoff.Max, c.AskBackoff.Base)
	}
	if c.WebhookRetention < 2*webhookTolerance {
		return fmt.Errorf("reconciler: WebhookRetention %v is shorter than twice the signature tolerance (%v): a replay could pass", c.WebhookRetention, 2*webhookTolerance)
	}
	return c.Kafka.Validate()
}

// Reconciler resolves unknown outcomes. Create it with New and start it with
// Run; several replicas may run against one database and one consumer group.
type Reconciler struct {
	cfg   Config
	store *store.Store
	tools Tools
	log   *slog.Logger
	tel   *telemetry

	// committer is set by Run (the configured one or Run's own).
	committer *store.Committer
	work      *pool
	leader    leaderState
	started   atomic.Bool

	slotsMu  sync.Mutex
	toolBusy map[string]int // asks in flight per tool
	perTool  int
}

// New returns a reconciler. It does no I/O.
func New(st *store.Store, tools Tools, cfg Config) (*Reconciler, error) {
	cfg = cfg.WithDefaults()
	if st == nil || tools == nil {
		return nil, errors.New("reconciler: a store and a tools registry are required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newTelemetry(cfg.Base)
	if err != nil {
		return nil, fmt.Errorf("reconciler: %w", err)
	}
	r := &Reconciler{
		cfg:   cfg,
		store: st,
		tools: tools,
		log:   cfg.Logger.With("component", "reconciler"),
		tel:   tel,

		toolBusy: map[string]int{},
		perTool:  cfg.ToolConcurrency,
	}
	return r, nil
}

// Run consumes the outcomes topic, runs reconciliations and, while this
// replica holds the sweeper lock, the sweeps, until ctx ends. It then stops
// taking work, cancels asks in flight (an interrupted ask decides nothing:
// the next owner asks again), waits for every goroutine it started, and
// returns. It returns early with an error only when the Kafka consumer
// fails. Call it once per Reconciler.
func (r *Reconciler) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("reconciler: Run called twice")
	}
	// The committer outlives the intake and the workers, so a decision
	// taken just before shutdown is still journaled.
	committer, stopCommitter := r.store.CommitterOrOwn(ctx, r.cfg.Committer)
	r.committer = committer
	defer stopCommitter()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r.work = newPool(r.cfg.Concurrency, r.reconcileJob)
	poolDone := make(chan struct{})
	go func() { defer close(poolDone); r.work.run(runCtx) }()
	intake, err := kafka.NewBatchConsumer(r.cfg.Kafka, kafka.ConsumerConfig{
		Group: r.cfg.Group, Topic: r.cfg.Kafka.Topic(events.TopicOutcomes),
		Logger: r.cfg.Logger, MeterProvider: r.cfg.MeterProvider,
	}, r.handleOutcomes)
	if err != nil {
		stop()
		<-poolDone
		return fmt.Errorf("reconciler: %w", err)
	}
	intakeDone := make(chan error, 1)
	go func() { intakeDone <- intake.Run(runCtx) }()
	sweepDone := make(chan struct{})
	go func() { defer close(sweepDone); r.sweepLoop(runCtx) }()

	r.log.InfoContext(ctx, "reconciler started", "group", r.cfg.Group, "concurrency", r.cfg.Concurrency)
	var runErr error
	select {
	case <-ctx.Done():
		<-intakeDone
	case runErr = <-intakeDone:
		switch {
		case runErr != nil:
			runErr = fmt.Errorf("reconciler: %w", runErr)
		case ctx.Err() == nil:
			runErr = errors.New("reconciler: the outcomes consumer stopped on its own")
		}
	}
	stop()
	<-sweepDone
	<-poolDone
	r.log.Info("reconciler stopped")
	return runErr
}

// Leader reports whether this replica holds the sweeper lock now.
func (r *Reconciler) Leader() bool { return r.leader.held.Load() }
