// Package projector maintains effectline's read models: operation_state,
// one row per operation, the fold of its events, kept up to date from the
// effectline.outcomes topic and rebuildable from the event store; and
// workflow_state, one row per workflow run, kept the same way from
// effectline.workflows and the workflow journal.
//
// The projector is idempotent by construction. Every row carries last_seq,
// the seq of the last event folded into it; a delivered event at or below it
// is skipped, the next one is folded with events.Apply, and one further
// ahead (a lost or reordered message) is preceded by the missing events read
// from the event store. Replaying the topic from offset 0 therefore changes
// nothing, and any writer that reaches seq N of an operation writes the same
// row, which is what Rebuild relies on.
//
// The same holds for workflow runs, by (workflow_id, seq), folded with
// events.ApplyWorkflow.
//
// Reader is the query side the HTTP API uses: Get by key, List and
// ListWorkflows with keyset paging, newest first.
package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/pacing"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
)

// DefaultGroup is the consumer group of the projector. Every replica joins
// it; a new group name replays the topic from its start.
const DefaultGroup = "effectline-projector"

// DefaultWorkflowGroup is the consumer group of the workflow projection,
// one of its own so that the two topics rebalance and lag apart.
const DefaultWorkflowGroup = "effectline-projector-workflows"

// DefaultFlushWindow is Config.FlushWindow unless set: at 500 operations/s
// it writes the read model in about a quarter of the statements a flush
// per arrival took, for a few milliseconds of the read model's lag
// (docs/benchmarks.md, "Session 15").
const DefaultFlushWindow = 4 * time.Millisecond

// Config configures a Projector.
type Config struct {
	// Kafka says where effectline.outcomes is. Required.
	Kafka kafka.Config
	// Store is the event store: it fills gaps, and operation_state lives in
	// its database. Required. Its pool needs a connection for gap fills, and
	// a connection per flusher with SynchronousCommit; without it, Run opens
	// a pool of Flushers connections of its own with the same settings.
	Store *store.Store
	// Group is the Kafka consumer group. Default DefaultGroup.
	Group string
	// Workflows is the workflow journal (*workflow.Journal). With it, the
	// projector also consumes effectline.workflows into workflow_state,
	// filling gaps from it; nil: it projects operations only.
	Workflows WorkflowJournal
	// WorkflowGroup is the consumer group of the workflow projection.
	// Default DefaultWorkflowGroup.
	WorkflowGroup string
	// Base is where the component logs, traces and counts, and its clock
	// and randomness; unset fields default (service.Base.WithDefaults).
	service.Base
	// MaxBatch caps the events one transaction folds. Default 512. Batches
	// are bounded in practice by the partitions this replica owns, since
	// each has one message in flight.
	MaxBatch int
	// Flushers is how many batch transactions may be in flight at once.
	// Default 2. The first flushes all the time; the others help only
	// while there is a backlog (a flush just took at least BacklogBatch
	// events), as the journal's committer does.
	Flushers int
	// BacklogBatch is the batch size from which flushers beyond the first
	// help. Default 64.
	BacklogBatch int
	// FlushWindow is the least time between the first flusher's writes
	// while events arrive steadily: it gathers what arrives in between into
	// one statement (internal/pacing). After a quiet spell an event is
	// written at once. Default DefaultFlushWindow; negative: no window.
	FlushWindow time.Duration
	// FlushTimeout bounds one batch transaction. Default 30s.
	FlushTimeout time.Duration
	// SynchronousCommit makes every projection commit wait for its WAL
	// flush. By default it does not (synchronous_commit = off on the
	// projector's own connections only): the read model is derived data, so
	// its rows need not each cost an fsync. Their offsets are committed only
	// once the WAL holding them is flushed (durabilityWatch), so a database
	// crash that takes rows also has their events read again. Set this to
	// do without the watch's connection.
	SynchronousCommit bool
	// DurabilityInterval is how often, while batches wait, the projector
	// checks whether its asynchronous commits have reached disk, so that
	// their offsets can be committed (durabilityWatch). Default 20ms.
	DurabilityInterval time.Duration
	// CacheSize caps how many operations' last written records the projector
	// keeps in memory, so that a flush writes without reading the rows
	// first. Default 100000; an entry costs about the size of its record.
	// When full, the cache drops half its entries, terminal operations
	// first. A negative value turns the cache off: every flush reads. The
	// workflow projection has a cache of its own with the same cap.
	CacheSize int
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	c.Kafka = c.Kafka.WithDefaults()
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.WorkflowGroup == "" {
		c.WorkflowGroup = DefaultWorkflowGroup
	}
	c.Base = c.Base.WithDefaults()
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.Flushers <= 0 {
		c.Flushers = 2
	}
	if c.BacklogBatch <= 0 {
		c.BacklogBatch = 64
	}
	if c.FlushWindow == 0 {
		c.FlushWindow = DefaultFlushWindow
	}
	if c.FlushTimeout <= 0 {
		c.FlushTimeout = 30 * time.Second
	}
	if c.CacheSize == 0 {
		c.CacheSize = 100_000
	}
	if c.DurabilityInterval <= 0 {
		c.DurabilityInterval = 20 * time.Millisecond
	}
	return c
}

func (c Config) validate() error {
	if c.Store == nil {
		return errors.New("projector: Config.Store is required")
	}
	if err := c.Kafka.Validate(); err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	return nil
}

// Projector consumes effectline.outcomes into operation_state and, with a
// workflow journal, effectline.workflows into workflow_state.
type Projector struct {
	cfg     Config
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics
	batcher *batcher[events.Envelope, events.Operation]
	// workflows is nil without Config.Workflows.
	workflows *batcher[workflowEvent, workflowRow]
	watch     *durabilityWatch // nil with synchronous commits
	started   atomic.Bool
}

// New returns a projector; Run starts it.
func New(cfg Config) (*Projector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("projector: %w", err)
	}
	log := cfg.Logger.With("component", "projector")
	p := &Projector{
		cfg:     cfg,
		log:     log,
		tracer:  cfg.TracerProvider.Tracer("github.com/effectline/effectline/projector"),
		metrics: m,
		batcher: newBatcher(cfg, stream[events.Envelope, events.Operation](operationStream{store: cfg.Store}),
			newRecordCache(cfg.CacheSize), m.stream(StreamOperations), log),
	}
	if cfg.Workflows != nil {
		p.workflows = newBatcher(cfg, stream[workflowEvent, workflowRow](workflowStream{wj: cfg.Workflows}),
			newWorkflowCache(cfg.CacheSize), m.stream(StreamWorkflows), log)
	}
	return p, nil
}

func newBatcher[E, R any](cfg Config, s stream[E, R], cache *recordCache[R], m *streamMetrics, log *slog.Logger) *batcher[E, R] {
	b := &batcher[E, R]{
		stream:   s,
		cache:    cache,
		metrics:  m,
		log:      log,
		maxBatch: cfg.MaxBatch,
		flushers: cfg.Flushers,
		timeout:  cfg.FlushTimeout,
		reqs:     make(chan []*request[E], cfg.MaxBatch*cfg.Flushers),
		done:     make(chan struct{}),
	}
	// A group (the events of one operation delivered together) goes into
	// one batch whole.
	b.queue = pacing.NewQueue(b.reqs, func(batch []*request[E], g []*request[E]) []*request[E] { return append(batch, g...) },
		cfg.Flushers, cfg.MaxBatch, cfg.BacklogBatch, cfg.FlushWindow)
	return b
}

// Run consumes until ctx is done and returns nil then; it returns an error
// if a consumer (of the outcomes, or of the workflows with
// Config.Workflows) cannot start or stops on its own, and then stops the
// other. A Projector runs once.
//
// A message's offset is committed only once its row is committed and, with
// asynchronous commits, flushed to disk; so a crash of the process or of
// the database at any point redelivers what was not stored, and
// redelivery is harmless.
func (p *Projector) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("projector: Run called twice")
	}
	pool, closePool, err := openWritePool(ctx, p.cfg.Store, p.cfg.Flushers, p.cfg.SynchronousCommit)
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	defer closePool()
	p.batcher.pool = pool
	if p.workflows != nil {
		p.workflows.pool = pool
	}

	if !p.cfg.SynchronousCommit {
		stopWatch, err := p.startWatch(ctx)
		if err != nil {
			return nil // ctx ended before the database answered
		}
		// Stopped once the consumers have returned: no handler waits on it then.
		defer stopWatch()
	}

	consumers := []consumerRun{}
	c, err := kafka.NewDeferredBatchConsumer(p.cfg.Kafka, kafka.ConsumerConfig{
		Group: p.cfg.Group, Topic: p.cfg.Kafka.Topic(events.TopicOutcomes), MaxBatch: p.cfg.MaxBatch,
		Logger: p.cfg.Logger, MeterProvider: p.cfg.MeterProvider,
	}, p.handle)
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	consumers = append(consumers, consumerRun{c, p.cfg.Group, p.cfg.Kafka.Topic(events.TopicOutcomes)})
	if p.workflows != nil {
		c, err := kafka.NewDeferredBatchConsumer(p.cfg.Kafka, kafka.ConsumerConfig{
			Group: p.cfg.WorkflowGroup, Topic: p.cfg.Kafka.Topic(events.TopicWorkflows), MaxBatch: p.cfg.MaxBatch,
			Logger: p.cfg.Logger, MeterProvider: p.cfg.MeterProvider,
		}, p.handleWorkflows)
		if err != nil {
			return fmt.Errorf("projector: %w", err)
		}
		consumers = append(consumers, consumerRun{c, p.cfg.WorkflowGroup, p.cfg.Kafka.Topic(events.TopicWorkflows)})
	}

	// The batchers outlive the consumers: handlers still running when ctx
	// ends get their commit answered instead of an error, and they stop
	// once the consumers have waited for all of them.
	bctx, stopBatchers := context.WithCancel(context.WithoutCancel(ctx))
	var batchers sync.WaitGroup
	batchers.Go(func() { p.batcher.run(bctx) })
	if p.workflows != nil {
		batchers.Go(func() { p.workflows.run(bctx) })
	}
	defer func() {
		stopBatchers()
		batchers.Wait()
	}()

	// Either consumer stopping stops the other: a projector that projects
	// only one of its topics would look healthy while a read model ages.
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	errs := make(chan error, len(consumers))
	for _, c := range consumers {
		p.log.InfoContext(ctx, "projector: consuming", "topic", c.topic, "group", c.group)
		go func() {
			err := c.consumer.Run(cctx)
			if err == nil && cctx.Err() == nil {
				err = fmt.Errorf("the consumer of %s stopped on its own", c.topic)
			}
			stopConsumers()
			errs <- err
		}()
	}
	var first error
	for range consumers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return fmt.Errorf("projector: %w", first)
	}
	return nil
}

// consumerRun is one of the projector's consumers.
type consumerRun struct {
	consumer interface{ Run(context.Context) error }
	group    string
	topic    string
}

// startWatch connects the durability watch and runs it until stop.
func (p *Projector) startWatch(ctx context.Context) (stop func(), err error) {
	p.watch = newDurabilityWatch(watchConnConfig(p.cfg.Store.Pool()), p.cfg.DurabilityInterval, func(lost bool) {
		p.batcher.cache.reset()
		if p.workflows != nil {
			p.workflows.cache.reset()
		}
		if lost {
			p.metrics.rewinds.Add(context.WithoutCancel(ctx), 1)
		}
	}, p.log)
	conn, err := p.watch.connect(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.watch.run(wctx, conn)
	}()
	return func() { cancel(); <-done }, nil
}

// watchConnConfig is the store's connection settings, named for operators
// who look at pg_stat_activity.
func watchConnConfig(pool *pgxpool.Pool) *pgx.ConnConfig {
	cfg := pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "effectline-projector-durability"
	return cfg
}

// writePlanning is how the flushes' connections plan: each statement once,
// kept for the connection's life (plan_cache_mode), by index only
// (enable_seqscan and enable_bitmapscan off). Left to itself, PostgreSQL
// re-plans a prepared statement whenever a plan for its values looks
// cheaper than the kept one; the upsert of one or two rows, a flush at a
// moderate rate, always does, and planning it cost as much as running it
// (~0.2 ms a flush; docs/benchmarks.md, session 18). Every statement here
// reads or writes rows by key: the upserts, whose guards probe the head
// tables by primary key (TestUpsertsProbeTheirGuardsByKey), and the loads
// of records by key. Without sequential scans a plan made on an empty
// table, kept, still reads the key index once the table has millions of
// rows (TestTheFlushesPlanOnceByIndex).
var writePlanning = map[string]string{
	"plan_cache_mode":   "force_generic_plan",
	"enable_seqscan":    "off",
	"enable_bitmapscan": "off",
}

// openWritePool returns the pool the flushes run on and how to release it.
// With asynchronous commit it is a pool of its own, on the store pool's
// settings, whose sessions have synchronous_commit off: a flush's upsert
// then commits asynchronously as a statement of its own, one round trip,
// where SET LOCAL would need a transaction around it (BEGIN, SET, upsert,
// COMMIT). The rest of the process keeps synchronous commits.
func openWritePool(ctx context.Context, st *store.Store, conns int, syncCommit bool) (*pgxpool.Pool, func(), error) {
	if syncCommit {
		return st.Pool(), func() {}, nil
	}
	cfg := st.Pool().Config()
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	// The read model is derived data: a write lost to a database crash
	// after its commit returned is redone (see Config.SynchronousCommit), so
	// it does not need its own WAL flush. Without one, a commit costs no
	// fsync and the projector keeps pace with the executors' synchronous
	// commits on the same server.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	// Each statement these connections run is planned once and kept
	// (writePlanning).
	maps.Copy(cfg.ConnConfig.RuntimeParams, writePlanning)
	cfg.MaxConns = int32(conns)
	cfg.MinConns, cfg.MinIdleConns = 0, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the projection pool: %w", err)
	}
	return pool, pool.Close, nil
}

// handle projects the messages of one partition fetched together. They join
// the batcher's group commit as one group, so they are folded and written in
// one flush (a claim and its outcome, published together, become one write
// of their row) and a partition is not a serial queue of commits. A
// malformed message is rejected (the consumer logs, counts and skips it).
// An error (nothing was
// committed for some event) has the whole batch handed over again, which is
// harmless: events at or below a row's seq are skipped.
func (p *Projector) handle(ctx context.Context, msgs []*kafka.Message) (kafka.Durable, error) {
	ctxs := make([]context.Context, 0, len(msgs))
	envs := make([]events.Envelope, 0, len(msgs))
	spans := make([]trace.Span, 0, len(msgs))
	for _, msg := range msgs {
		env, ok := msg.Event()
		if !ok {
			continue
		}
		mctx := msg.Context(ctx)
		mctx, span := p.tracer.Start(mctx, "projector.project",
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				semconv.OperationKey.String(env.OperationKey),
				semconv.EventType.String(string(env.Type)),
				semconv.Seq.Int64(env.Seq),
			))
		ctxs, envs, spans = append(ctxs, mctx), append(envs, env), append(spans, span)
	}
	if len(envs) == 0 {
		return nil, nil
	}
	var gen uint64
	if p.watch != nil {
		gen = p.watch.begin()
	}
	var failed error
	for i, res := range p.batcher.submit(ctxs, envs) {
		env, span := envs[i], spans[i]
		if res.err != nil {
			span.RecordError(res.err)
			span.SetStatus(codes.Error, "not committed")
			span.End()
			if failed == nil {
				failed = fmt.Errorf("projecting %s seq %d: %w", env.OperationKey, env.Seq, res.err)
			}
			continue
		}
		span.SetAttributes(semconv.ProjectionOutcome.String(res.outcome.String()))
		if res.outcome == outcomeRejected {
			span.SetStatus(codes.Error, "rejected")
			p.log.ErrorContext(ctxs[i], "projector: dropped an event that does not apply to its operation",
				"operation_key", env.OperationKey, "seq", env.Seq, "type", env.Type, "event_id", env.EventID,
				"error", res.reason)
		}
		span.End()
	}
	// A batch that failed in part is delivered again whole; the events that
	// committed are skipped then (their rows are at or past them).
	if failed != nil || p.watch == nil {
		return nil, failed
	}
	return p.watch.after(gen), nil
}

// Reasons a workflow message is rejected.
const (
	// RejectWorkflowKeyMismatch: the message key is not the event's
	// workflow id, so it may sit in another partition than the run's other
	// events, out of their order.
	RejectWorkflowKeyMismatch = "key_mismatch"
)

// handleWorkflows projects the workflow events of one partition fetched
// together, as handle does the operations': one group of the workflow
// batcher, offsets committed once the rows are durable.
func (p *Projector) handleWorkflows(ctx context.Context, msgs []*kafka.Message) (kafka.Durable, error) {
	ctxs := make([]context.Context, 0, len(msgs))
	evs := make([]workflowEvent, 0, len(msgs))
	spans := make([]trace.Span, 0, len(msgs))
	for _, msg := range msgs {
		env, err := events.DecodeWorkflow(msg.Value)
		if err != nil {
			reason := kafka.RejectInvalidEnvelope
			if !json.Valid(msg.Value) {
				reason = kafka.RejectNotJSON
			}
			msg.Reject(reason, err)
			continue
		}
		if string(msg.Key) != env.WorkflowID {
			msg.Reject(RejectWorkflowKeyMismatch, fmt.Errorf("message key %q is not the workflow id %q", msg.Key, env.WorkflowID))
			continue
		}
		// The header as the publisher wrote it, whatever propagator this
		// process has; ContextWith and FromContext keep only a valid one.
		tp := traceparent.FromContext(traceparent.ContextWith(context.Background(), msg.Headers.Get("traceparent")))
		mctx, span := p.tracer.Start(msg.Context(ctx), "projector.project_workflow",
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				semconv.WorkflowID.String(env.WorkflowID),
				semconv.EventType.String(string(env.Type)),
				semconv.Seq.Int64(env.Seq),
			))
		ctxs, evs, spans = append(ctxs, mctx), append(evs, workflowEvent{env: env, trace: tp}), append(spans, span)
	}
	if len(evs) == 0 {
		return nil, nil
	}
	var gen uint64
	if p.watch != nil {
		gen = p.watch.begin()
	}
	var failed error
	for i, res := range p.workflows.submit(ctxs, evs) {
		e, span := evs[i].env, spans[i]
		if res.err != nil {
			span.RecordError(res.err)
			span.SetStatus(codes.Error, "not committed")
			span.End()
			if failed == nil {
				failed = fmt.Errorf("projecting workflow %s seq %d: %w", e.WorkflowID, e.Seq, res.err)
			}
			continue
		}
		span.SetAttributes(semconv.ProjectionOutcome.String(res.outcome.String()))
		if res.outcome == outcomeRejected {
			span.SetStatus(codes.Error, "rejected")
			p.log.ErrorContext(ctxs[i], "projector: dropped a workflow event that does not apply to its run",
				"workflow_id", e.WorkflowID, "seq", e.Seq, "type", e.Type, "event_id", e.EventID, "error", res.reason)
		}
		span.End()
	}
	if failed != nil || p.watch == nil {
		return nil, failed
	}
	return p.watch.after(gen), nil
}
