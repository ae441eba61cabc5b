// Package executor runs intents: it consumes effectline.intents, records each
// intent if it is new, decides the next step of the operation per effect
// class, claims it atomically in the event store, invokes the tool with the
// downstream idempotency key, classifies what came back and journals the
// outcome. A due-time poller runs scheduled retries and compensations, so a
// retry waiting for its backoff never holds up a Kafka partition.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// Tools is what the executor needs of the tools registry.
type Tools interface {
	Get(name string) (tool.Tool, bool)
}

// Config configures an Executor.
type Config struct {
	Kafka kafka.Config
	// Group is the Kafka consumer group. Default "effectline-executor".
	Group string
	// Worker names this executor in leases. Default host-pid-random.
	Worker string
	// Lease is how long a claimed step is this worker's before the
	// reconciler treats it as abandoned. Long calls renew it. Default 30s.
	Lease time.Duration
	// Concurrency caps the tool calls in flight. Default 256.
	Concurrency int
	// PollInterval is how often the due-time poller looks for retries,
	// compensations and intents nobody picked up. Default 250ms.
	PollInterval time.Duration
	// PollBatch caps the operations one poll starts. Default 256.
	PollBatch int
	// ShutdownGrace is how long in-flight calls may run after Run's context
	// ends; calls still running then are cancelled and journaled as Unknown.
	// Default 10s.
	ShutdownGrace time.Duration
	// KafkaPrincipals, when not empty, are the only principals an intent
	// produced straight to the intents topic may name; a direct intent
	// naming another is dead-lettered. Intents journaled by the outbox or
	// the API are not checked against it. Empty: any principal (the tools'
	// own allowed_principals still apply at execution time).
	KafkaPrincipals []string
	// Committer, if set, is shared with other components of the process so
	// their appends share commits; otherwise the executor runs its own.
	Committer *store.Committer

	// CrashPoint, when set, is called at the points where a crash matters
	// most (see the Point constants); the crash-matrix tests make it kill
	// the process there. Nil in production.
	CrashPoint func(point string)

	// Base is where the component logs, traces and counts, and its clock
	// and randomness; unset fields default (service.Base.WithDefaults).
	service.Base
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Group == "" {
		c.Group = "effectline-executor"
	}
	if c.Worker == "" {
		host, _ := os.Hostname()
		c.Worker = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 256
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 250 * time.Millisecond
	}
	if c.PollBatch <= 0 {
		c.PollBatch = 256
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	c.Base = c.Base.WithDefaults()
	c.Kafka = c.Kafka.WithDefaults()
	return c
}

// Points where Config.CrashPoint is called.
const (
	PointBeforeCall    = "before_call"    // the attempt is claimed, the request not sent
	PointAfterResponse = "after_response" // the tool answered, the outcome not journaled
	PointAfterJournal  = "after_journal"  // the outcome is journaled
)

func (e *Executor) crashPoint(p string) {
	if e.cfg.CrashPoint != nil {
		e.cfg.CrashPoint(p)
	}
}

// Executor runs intents. Create it with New and start it with Run.
type Executor struct {
	cfg       Config
	store     *store.Store
	tools     Tools
	committer *store.Committer
	log       *slog.Logger
	tel       *telemetry

	slots chan struct{} // one per call in flight
	// inflight tracks operations this process is working on, so a kick, a
	// poll and a redelivered message for the same operation don't pile up.
	mu       sync.Mutex
	inflight map[string]bool
	calls    sync.WaitGroup
	// callCtx is cancelled when the shutdown grace ends.
	callCtx    context.Context
	cancelCall context.CancelFunc
	kicks      chan string
}

// New returns an executor. It does no I/O.
func New(st *store.Store, tools Tools, cfg Config) (*Executor, error) {
	cfg = cfg.WithDefaults()
	if st == nil || tools == nil {
		return nil, errors.New("executor: a store and a tools registry are required")
	}
	tel, err := newTelemetry(cfg.Base)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	e := &Executor{
		cfg:       cfg,
		store:     st,
		tools:     tools,
		committer: cfg.Committer,
		log:       cfg.Logger.With("component", "executor", "worker", cfg.Worker),
		tel:       tel,
		slots:     make(chan struct{}, cfg.Concurrency),
		inflight:  map[string]bool{},
		kicks:     make(chan string, 1024),
	}
	e.callCtx, e.cancelCall = context.WithCancel(context.Background())
	return e, nil
}

// Run consumes intents and runs due steps until ctx ends, then stops taking
// work, gives in-flight calls ShutdownGrace to finish, cancels the rest (they
// are journaled as Unknown) and returns. Kafka offsets of handled batches
// are committed by the consumer group, and once more when it closes.
func (e *Executor) Run(ctx context.Context) error {
	// The committer outlives the intake so outcomes of calls still in flight
	// at shutdown are journaled.
	committer, stopCommitter := e.store.CommitterOrOwn(ctx, e.cfg.Committer)
	e.committer = committer
	defer stopCommitter()

	intakeCtx, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	// A message that can never become an operation is copied to the
	// dead-letter topic, and the partition moves on.
	intake, err := kafka.NewBatchConsumer(e.cfg.Kafka, kafka.ConsumerConfig{
		Group: e.cfg.Group, Topic: e.cfg.Kafka.Topic(events.TopicIntents), MaxBatch: e.cfg.Concurrency,
		DeadLetters: true, Logger: e.cfg.Logger, MeterProvider: e.cfg.MeterProvider,
	}, kafka.Concurrently(e.handleIntent))
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	intakeDone := make(chan error, 1)
	go func() { intakeDone <- intake.Run(intakeCtx) }()
	pollDone := make(chan struct{})
	go func() { defer close(pollDone); e.poll(intakeCtx) }()

	e.log.InfoContext(ctx, "executor started", "group", e.cfg.Group, "concurrency", e.cfg.Concurrency)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-intakeDone:
		if runErr == nil {
			runErr = errors.New("executor: the intents consumer stopped on its own")
		}
		intakeDone <- nil
	}
	stopIntake()
	<-intakeDone
	<-pollDone
	e.drain(ctx)
	e.log.Info("executor stopped")
	return runErr
}

// drain waits for calls in flight, up to the grace period, then cancels them;
// a cancelled call is classified Unknown (the request may have been sent)
// and journaled by the committer, which is still running.
func (e *Executor) drain(ctx context.Context) {
	done := make(chan struct{})
	go func() { e.calls.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(e.cfg.ShutdownGrace):
		e.log.WarnContext(context.WithoutCancel(ctx), "shutdown grace ended, cancelling calls in flight")
		e.cancelCall()
	}
	<-done
}

// claimOp marks key as being worked on by this process; false if it already is.
func (e *Executor) claimOp(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inflight[key] {
		return false
	}
	e.inflight[key] = true
	return true
}

func (e *Executor) releaseOp(key string) {
	e.mu.Lock()
	delete(e.inflight, key)
	e.mu.Unlock()
}
