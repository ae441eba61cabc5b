package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/pacing"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// Publisher sends records to Kafka and returns once the brokers have
// acknowledged all of them, or with an error when any of them failed. Some
// may have been written anyway, but never a record without every record
// before it in records that goes to the same partition: a failed Send leaves
// each partition with a prefix of its records. *kafka.Producer satisfies it.
type Publisher interface {
	Send(ctx context.Context, records []kafka.Record) error
}

// RelayConfig tunes a Relay.
type RelayConfig struct {
	// BatchSize is how many outbox rows one transaction claims. Default 500.
	BatchSize int
	// PollInterval is how often the relay looks at the outbox when nothing
	// woke it: the latency of events committed by other processes when
	// nobody notifies. Default 100ms.
	PollInterval time.Duration
	// MaxBackoff caps the wait between attempts while publishing fails.
	// Default 5s.
	MaxBackoff time.Duration
	// Listen makes the relay LISTEN on NotifyChannel on a connection of its
	// own, so writers that call Notify wake it at once. Off by default; see
	// Relay for what NOTIFY costs.
	Listen bool
	// Base is where the component logs, traces and counts, and its clock
	// and randomness; unset fields default (service.Base.WithDefaults).
	service.Base

	// IntentsTopic is the full name of the intents topic, the only one an
	// intent is published to with its args whole (the executor needs
	// them). Every other copy of an intent (the one on the outcomes topic)
	// is events.PublicIntent: args redacted by RedactArgs. Default
	// "effectline.intents"; a deployment with another topic prefix must set
	// it, or its intents topic gets the redacted copy too, which the
	// executor refuses to run: a mistake that fails closed.
	IntentsTopic string
	// RedactArgs redacts an intent's args for its public copy, knowing the
	// tool (tool.Scrub with the tool's spec). Default: redaction by field
	// names only, which misses what only a tool's schema marks sensitive.
	RedactArgs func(tool string, args json.RawMessage) json.RawMessage

	// Window keeps the relay's cycles that far apart while events arrive
	// steadily (internal/pacing, as the journal's committer paces its
	// commits): a wake-up within the window of the previous cycle waits
	// for the rest of it, and what commits meanwhile goes out in the same
	// cycle. Fewer cycles mean fewer produce requests, fewer fetches for
	// every consumer and fewer read-model flushes: at 500 operations/s an
	// 8 ms window took 7 % of the CPU per operation for ~5.5 ms more median
	// latency (docs/benchmarks.md, session 17). A cycle that found a full
	// batch goes on at once, and after a quiet spell nothing waits. Zero,
	// the default, never holds.
	Window time.Duration

	// RotateEvery is how long one outbox partition stays the one writers
	// fill before the relay moves them on to the next
	// (store.RotateOutbox); between batches, every RotateEvery/10, the
	// relay also truncates the partitions it has drained, which is how the
	// outbox gives its space back. Several relays on one database take
	// turns (an advisory lock). Default 5s; negative leaves rotation to
	// other relays (a relay that never rotates still publishes every
	// partition).
	RotateEvery time.Duration
}

// Defaults of RelayConfig.
const (
	DefaultBatchSize    = 500
	DefaultPollInterval = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	// DefaultRotateEvery keeps a partition at about 10k rows at 2,000 rows
	// a second (500 operations/s): the dead index entries the claim can
	// walk over between truncates, against ~100k in the unpartitioned
	// outbox between autovacuum passes.
	DefaultRotateEvery = 5 * time.Second
)

// baseBackoff is the first wait after a failure; it doubles per failure up
// to MaxBackoff.
const baseBackoff = 100 * time.Millisecond

// WithDefaults fills unset fields.
func (c RelayConfig) WithDefaults() RelayConfig {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.RotateEvery == 0 {
		c.RotateEvery = DefaultRotateEvery
	}
	c.Base = c.Base.WithDefaults()
	if c.IntentsTopic == "" {
		c.IntentsTopic = events.DefaultTopicPrefix + events.TopicIntents
	}
	if c.RedactArgs == nil {
		c.RedactArgs = func(_ string, args json.RawMessage) json.RawMessage { return tool.Scrub(nil, args, args) }
	}
	return c
}

func (c RelayConfig) validate() error {
	// The claim's LIMIT and the arrays of the guard grow with the batch; past
	// this a batch only makes the transaction (and its locks) longer.
	if c.BatchSize > 10_000 {
		return fmt.Errorf("outbox relay: BatchSize %d is over 10000", c.BatchSize)
	}
	if c.Window < 0 || c.Window > time.Second {
		return fmt.Errorf("outbox relay: Window %v is not from 0 to 1s", c.Window)
	}
	return nil
}

// Relay publishes the outbox to Kafka. Several relays may run on one
// database (in one process or many): they claim disjoint rows, and the
// order guard in store.RelayBatch keeps each operation's events in order.
//
// A relay runs at start, and then whenever one of three things wakes it:
//
//   - store.OnAppend, for commits made through its own process's store (the
//     executor's outcomes): a non-blocking send on a 1-buffered channel, so
//     a burst of commits costs one extra batch, not one each;
//   - a tick every PollInterval, the fallback that always works, for commits
//     by other processes (agent services calling Append, other replicas). An
//     empty poll is one index scan of a table that only holds the backlog;
//   - with Listen, a NOTIFY on NotifyChannel, sent by writers that call
//     Notify.
//
// NOTIFY is never sent per row, and Append never sends it on its own: a
// notifying transaction takes a database-wide lock before it commits and
// holds it through the flush of its commit record, so notifying
// transactions commit one at a time. BenchmarkAppendNotify (8 writers each
// committing one Append per transaction, a LISTENer draining, local
// PostgreSQL 15 on 2 cores) measured 1,500–2,000 commits/s without Notify
// and 500–800 with it. BenchmarkRelayLatency measured, from commit to a
// consumer receiving the intent, p50 2ms for in-process commits and for
// notified ones, against about half of PollInterval (p50 ~50ms at the
// default) for polled ones. So Notify is for writers that need that
// latency at a modest rate; a busy agent service leaves it off.
type Relay struct {
	store  *store.Store
	pub    Publisher
	cfg    RelayConfig
	log    *slog.Logger
	tracer trace.Tracer

	wake    chan struct{}
	running atomic.Bool
	backlog *backlogGauges
	// pace is the loop goroutine's alone (RelayConfig.Window).
	pace pacing.Pace

	published atomic.Int64
	skipped   atomic.Int64
	cycles    atomic.Int64
	batches   atomic.Int64
	errors    atomic.Int64
	batchTime atomic.Int64 // nanoseconds
	sendTime  atomic.Int64 // nanoseconds

	// The rotator's state and counters; lastRotate and rotateFailing are
	// the loop goroutine's alone.
	lastRotate    time.Time
	rotateFailing bool
	rotations     atomic.Int64
	truncates     atomic.Int64
	truncateBusy  atomic.Int64
}

// RelayStats are a relay's counters since it was made.
type RelayStats struct {
	// Published counts outbox rows acknowledged by Kafka and marked.
	Published int64
	// Skipped counts claimed rows held back by the order guard.
	Skipped int64
	// Cycles counts the loop's runs (each claims batches until one is not
	// full); Batches counts batches published.
	Cycles, Batches int64
	// Errors counts failed batches (each retry of a streak counts).
	Errors int64
	// BatchTime is the time spent in batches, claim to commit, and
	// SendTime the part of it spent waiting for Kafka: the difference is
	// PostgreSQL's share, so a slow relay says which side slowed it.
	BatchTime, SendTime time.Duration
	// Rotations counts the times this relay moved the outbox's current
	// partition on, Truncates the partitions it truncated, and
	// TruncateBusy the truncates that gave up waiting for a partition's
	// lock (tried again later).
	Rotations, Truncates, TruncateBusy int64
}

// NewRelay returns a relay over st publishing with pub. It panics on a nil
// store or publisher or an invalid config: wiring mistakes.
func NewRelay(st *store.Store, pub Publisher, cfg RelayConfig) *Relay {
	if st == nil || pub == nil {
		panic("outbox: NewRelay needs a store and a publisher")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	r := &Relay{
		store:  st,
		pub:    pub,
		cfg:    cfg,
		log:    cfg.Logger.With("component", "outbox_relay"),
		tracer: cfg.TracerProvider.Tracer("github.com/effectline/effectline/outbox"),
		wake:   make(chan struct{}, 1),
		pace:   pacing.New(cfg.Window),
	}
	var err error
	if r.backlog, err = newBacklogGauges(st, cfg.MeterProvider); err != nil {
		panic(fmt.Sprintf("outbox: creating the backlog gauges: %v", err))
	}
	st.OnAppend(r.signal)
	return r
}

// signal wakes the loop without ever blocking the committer that calls it:
// one pending wake-up is as good as many.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Published: r.published.Load(),
		Skipped:   r.skipped.Load(),
		Cycles:    r.cycles.Load(),
		Batches:   r.batches.Load(),
		Errors:    r.errors.Load(),
		BatchTime: time.Duration(r.batchTime.Load()),
		SendTime:  time.Duration(r.sendTime.Load()),

		Rotations:    r.rotations.Load(),
		Truncates:    r.truncates.Load(),
		TruncateBusy: r.truncateBusy.Load(),
	}
}

// Run publishes the outbox until ctx is done, then returns nil once every
// goroutine it started has stopped. It runs at once, then whenever woken
// (OnAppend, NOTIFY) or every PollInterval, draining while batches come
// back full.
//
// When publishing fails (the brokers are down, PostgreSQL restarts) it
// waits with exponential backoff and jitter up to MaxBackoff and tries
// again, logging once when the streak starts and once when it ends. Nothing
// is lost meanwhile: unacknowledged rows stay in the outbox.
//
// Publisher.Send takes no context, so when ctx ends during a Send, Run
// returns once that Send does (the producer's own timeouts bound it); the
// batch is then marked if it was acknowledged, and republished later if
// not. Close the producer after Run has returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox relay: already running")
	}
	defer r.running.Store(false)

	// The backlog is reported while this relay runs: a stopped relay's
	// gauges would go on saying the outbox drains.
	stopGauges, err := r.backlog.register()
	if err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	defer stopGauges()

	var wg sync.WaitGroup
	defer wg.Wait()
	if r.cfg.Listen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx)
		}()
	}

	service.Loop{
		Name: "outbox relay: publishing", Did: "outbox relay: published", DidLevel: slog.LevelDebug,
		Interval: r.cfg.PollInterval,
		Backoff:  service.Backoff{Base: baseBackoff, Max: r.cfg.MaxBackoff},
		Wake:     r.wake,
		RunOnce: func(ctx context.Context) (service.Counts, error) {
			published, err := r.runOnce(ctx)
			return service.Counts{{Name: "events", N: published}}, err
		},
		OnError: func(error) { r.errors.Add(1) },
		Base:    service.Base{Logger: r.log},
	}.Run(ctx)
	return nil
}

type errStreak struct {
	failures int
	since    time.Time
}

func (s *errStreak) fail() {
	if s.failures == 0 {
		s.since = time.Now()
	}
	s.failures++
}

// runOnce publishes batches while they come back full and returns how many
// events it published.
func (r *Relay) runOnce(ctx context.Context) (total int, err error) {
	if hold := r.pace.Hold(time.Now()); hold > 0 {
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return 0, nil
		}
	}
	r.cycles.Add(1)
	cycle := time.Now()
	defer func() { r.pace.Flushed(cycle, total) }()
	for {
		// Checked per batch, not per run: a relay that is behind drains in
		// one long run, and the partitions must go on rotating meanwhile.
		r.maybeRotate(ctx)
		began := time.Now()
		published, skipped, err := r.store.RelayBatch(ctx, r.cfg.BatchSize, func(evs []store.OutboxEvent) error {
			return r.publish(ctx, evs)
		})
		r.batchTime.Add(int64(time.Since(began)))
		r.skipped.Add(int64(skipped))
		if err != nil {
			return total, err
		}
		total += published
		if published > 0 {
			r.published.Add(int64(published))
			r.batches.Add(1)
		}
		// A batch that was not full drained the outbox (as far as this
		// relay may take it). One whose rows were all held back by the
		// guard is waiting for another relay: polling again at once
		// would spin on the same locked rows.
		if published == 0 || published+skipped < r.cfg.BatchSize || ctx.Err() != nil {
			return total, nil
		}
	}
}

// maybeRotate runs store.RotateOutbox when RotateEvery/10 has passed since
// the last time. Its errors do not stop publishing: a rotation that fails
// leaves the rows where they are, all of them still published, and the
// outbox only grows until a later one succeeds. They are logged once per
// streak.
func (r *Relay) maybeRotate(ctx context.Context) {
	if r.cfg.RotateEvery < 0 {
		return
	}
	now := r.cfg.Now()
	if !r.lastRotate.IsZero() && now.Sub(r.lastRotate) < r.cfg.RotateEvery/10 {
		return
	}
	r.lastRotate = now
	res, err := r.store.RotateOutbox(ctx, store.RotateOptions{Every: r.cfg.RotateEvery})
	r.truncates.Add(int64(res.Truncated))
	r.truncateBusy.Add(int64(res.Busy))
	if res.Rotated {
		r.rotations.Add(1)
	}
	if err != nil {
		if !r.rotateFailing && ctx.Err() == nil {
			r.log.WarnContext(ctx, "outbox relay: rotating the outbox partitions failed; publishing goes on", "error", err)
		}
		r.rotateFailing = true
		return
	}
	if r.rotateFailing {
		r.log.InfoContext(ctx, "outbox relay: rotating the outbox partitions again")
		r.rotateFailing = false
	}
	if res.Rotated || res.Truncated > 0 {
		r.log.DebugContext(ctx, "outbox relay: rotated the outbox", "slot", res.Slot, "rotated", res.Rotated,
			"truncated", res.Truncated, "busy", res.Busy, "undrained", res.Undrained)
	}
}

// publish sends one claimed batch, sorted by topic, operation key and seq,
// in one Send. The Publisher's contract (never a record without every
// earlier record of its partition in the same Send) means that when the
// Send fails in part, Kafka holds each operation's events in order with at
// most a repeated prefix, and republishing the batch repeats, never
// reorders: a consumer reads 1 2 1 2 3 4, not 1 2 4 1 2 3 4.
func (r *Relay) publish(ctx context.Context, evs []store.OutboxEvent) error {
	records := make([]kafka.Record, len(evs))
	spans := make([]trace.Span, len(evs))
	for i, e := range evs {
		// The span continues the trace stored with the event, and the
		// message carries the span's context, so the consumer's span is a
		// child of this publish. Without an SDK the tracer is a no-op that
		// passes the stored context through unchanged.
		sctx, span := r.tracer.Start(traceparent.ContextWith(ctx, e.Traceparent), "relay publish",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystem.String(semconv.MessagingSystemKafka),
				semconv.MessagingDestination.String(e.Topic),
				semconv.OperationKey.String(e.Envelope.OperationKey),
				semconv.EventType.String(string(e.Envelope.Type)),
				semconv.Seq.Int64(e.Envelope.Seq),
			))
		spans[i] = span
		env, raw := e.Envelope, e.Raw
		if env.Type == events.IntentRecorded && e.Topic != r.cfg.IntentsTopic {
			var err error
			if env, raw, err = r.publicIntent(env); err != nil {
				for _, s := range spans[:i+1] {
					s.End()
				}
				return err
			}
		}
		// The headers carry sctx's trace context as the process's
		// propagator writes it (traceparent, tracestate, baggage).
		records[i] = kafka.EventRecord(sctx, e.Topic, env, raw)
	}
	sent := time.Now()
	err := r.pub.Send(ctx, records)
	r.sendTime.Add(int64(time.Since(sent)))
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "publish failed")
		}
		s.End()
	}
	return err
}

// publicIntent is the copy of an intent for topics other than the intents
// topic: args redacted (events.PublicIntent). A journaled intent always
// decodes, so an error is a bug; the batch is then not published, rather
// than published with the args whole.
func (r *Relay) publicIntent(e events.Envelope) (events.Envelope, []byte, error) {
	pub, err := events.PublicIntent(e, func(args json.RawMessage) json.RawMessage { return r.cfg.RedactArgs(e.Tool, args) })
	if err != nil {
		return e, nil, fmt.Errorf("outbox relay: redacting the intent of %s: %w", e.OperationKey, err)
	}
	raw, err := events.Encode(pub)
	if err != nil {
		return e, nil, fmt.Errorf("outbox relay: encoding the public intent of %s: %w", e.OperationKey, err)
	}
	return pub, raw, nil
}

// listen keeps a LISTEN connection open until ctx is done, reconnecting
// with backoff. Every (re)connection wakes the loop once, since
// notifications sent while it was away are lost.
func (r *Relay) listen(ctx context.Context) {
	var streak errStreak
	for {
		err := r.listenOnce(ctx, func() {
			if streak.failures > 0 {
				r.log.InfoContext(ctx, "outbox relay: listening again", "failed_attempts", streak.failures)
				streak = errStreak{}
			}
			r.signal()
		})
		if ctx.Err() != nil {
			return
		}
		if streak.failures == 0 {
			r.log.WarnContext(ctx, "outbox relay: LISTEN connection lost; polling until it is back", "error", err)
		}
		streak.fail()
		if !service.Sleep(ctx, service.Backoff{Base: baseBackoff, Max: r.cfg.MaxBackoff}.After(streak.failures, rand.Float64)) {
			return
		}
	}
}

// listenOnce opens a connection of its own (not one of the pool's: it is
// held for good and must not starve the claims), LISTENs, and wakes the
// loop per notification until the connection fails.
func (r *Relay) listenOnce(ctx context.Context, listening func()) error {
	cfg := r.store.Pool().Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connecting for LISTEN: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel}.Sanitize()); err != nil {
		return fmt.Errorf("LISTEN %s: %w", NotifyChannel, err)
	}
	listening()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("waiting for notifications: %w", err)
		}
		r.signal()
	}
}
