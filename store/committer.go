package store

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/pacing"
)

// MetricCommitAppends is the number of appends per synchronous commit of a
// Committer; its count is the journal's commits.
const MetricCommitAppends = "effectline.journal.commit.appends"

// ErrCommitterStopped is returned for appends submitted after the committer
// stopped.
var ErrCommitterStopped = errors.New("committer stopped")

// Committer is a group commit in front of AppendBatch: appends submitted by
// many goroutines at once share one transaction and one synchronous commit.
// A flusher takes whatever is queued when it is free, so under load batches
// grow by themselves while the previous commit is in flight.
//
// At a moderate steady rate that is not enough: on a fast disk each commit
// finishes before the next append arrives, and every append commits alone.
// So while appends arrive steadily (internal/pacing), the first flusher keeps its
// commits at least Window apart and gathers what arrives in between, as
// PostgreSQL's commit_delay does for backends. After a quiet spell an append
// commits at once, so a lone operation is not slowed.
//
// One flusher runs all the time. The others help only while there is a
// backlog (a flusher just took at least BacklogBatch appends): a second
// transaction in flight at moderate load only splits the batches, one more
// synchronous commit each, while under a backlog one backend executing
// every append in turn is the pipeline's bottleneck.
type Committer struct {
	store    *Store
	reqs     chan *commitReq
	maxBatch int
	flushers int
	queue    *pacing.Queue[*commitReq, *commitReq]
	appends  metric.Int64Histogram
	done     chan struct{}
}

type commitReq struct {
	ctx  context.Context
	a    Append
	resp chan AppendResult
}

// DefaultCommitWindow is the committer's Window unless configured.
const DefaultCommitWindow = 4 * time.Millisecond

// CommitterConfig tunes a Committer.
type CommitterConfig struct {
	// MaxBatch caps appends per transaction. Default 256.
	MaxBatch int
	// Flushers is how many transactions may be in flight at once. Default 4.
	Flushers int
	// BacklogBatch is the batch size from which flushers beyond the first
	// help. Default 32.
	BacklogBatch int
	// Window is the least time between the first flusher's commits while
	// appends arrive steadily; it bounds what pacing adds to an append's
	// latency. Default 4ms; negative turns pacing off.
	Window time.Duration
	// MeterProvider records MetricCommitAppends; default the otel global.
	MeterProvider metric.MeterProvider
}

func (c CommitterConfig) withDefaults() CommitterConfig {
	if c.MaxBatch <= 0 {
		c.MaxBatch = 256
	}
	if c.Flushers <= 0 {
		c.Flushers = 4
	}
	if c.BacklogBatch <= 0 {
		c.BacklogBatch = 32
	}
	if c.Window == 0 {
		c.Window = DefaultCommitWindow
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// NewCommitter returns a committer; Run must be running for Append to return.
func (s *Store) NewCommitter(cfg CommitterConfig) *Committer {
	cfg = cfg.withDefaults()
	appends, err := cfg.MeterProvider.Meter("github.com/effectline/effectline/store").Int64Histogram(MetricCommitAppends,
		metric.WithUnit("{append}"),
		metric.WithDescription("Appends per synchronous commit of the journal's group commit; its count is the journal's commits."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256))
	if err != nil {
		// Only an invalid name fails, and this one is a constant.
		appends = noop.Int64Histogram{}
	}
	c := &Committer{
		store:    s,
		reqs:     make(chan *commitReq, cfg.MaxBatch*cfg.Flushers),
		maxBatch: cfg.MaxBatch,
		flushers: cfg.Flushers,
		appends:  appends,
		done:     make(chan struct{}),
	}
	c.queue = pacing.NewQueue(c.reqs, func(b []*commitReq, r *commitReq) []*commitReq { return append(b, r) },
		cfg.Flushers, cfg.MaxBatch, cfg.BacklogBatch, cfg.Window)
	return c
}

// Run flushes batches until ctx is done, then fails what is still queued.
// A batch already sent is finished even after ctx is done, so a step that
// committed is always reported as committed.
func (c *Committer) Run(ctx context.Context) error {
	finished := make(chan struct{}, c.flushers)
	for i := 0; i < c.flushers; i++ {
		go func() {
			defer func() { finished <- struct{}{} }()
			c.flushLoop(ctx, i == 0)
		}()
	}
	for i := 0; i < c.flushers; i++ {
		<-finished
	}
	close(c.done)
	for {
		select {
		case r := <-c.reqs:
			r.resp <- AppendResult{Err: ErrCommitterStopped}
		default:
			return nil
		}
	}
}

// flushLoop is one flusher. The first one always takes work; the others
// take one batch per backlog signal: the appends that arrive while the
// flusher that saw the backlog commits.
func (c *Committer) flushLoop(ctx context.Context, first bool) {
	batch := make([]*commitReq, 0, c.maxBatch)
	for {
		var ok bool
		if batch, ok = c.queue.Next(ctx, first, batch); !ok {
			return
		}
		c.flush(ctx, batch)
	}
}

func (c *Committer) flush(ctx context.Context, batch []*commitReq) {
	live := batch[:0:0]
	as := make([]Append, 0, len(batch))
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.resp <- AppendResult{Err: err}
			continue
		}
		live = append(live, r)
		as = append(as, r.a)
	}
	if len(as) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	res, committed := c.store.appendBatchCommitted(fctx, as)
	if committed {
		c.appends.Record(fctx, int64(len(as)))
	}
	for i, r := range live {
		r.resp <- res[i]
	}
}

// Append submits one step and waits for its commit. If ctx ends while the
// step is queued it is dropped; once its batch is sent, Append waits for the
// commit so the caller learns the truth.
func (c *Committer) Append(ctx context.Context, a Append) (events.Operation, error) {
	r := &commitReq{ctx: ctx, a: a, resp: make(chan AppendResult, 1)}
	select {
	case c.reqs <- r:
	case <-c.done:
		return events.Operation{}, ErrCommitterStopped
	case <-ctx.Done():
		return events.Operation{}, ctx.Err()
	}
	select {
	case res := <-r.resp:
		return res.Op, res.Err
	case <-c.done:
		// The flushers have stopped, so every request they took has its
		// answer; one still queued (possibly ours, enqueued as Run finished
		// draining) is failed here.
		for {
			select {
			case q := <-c.reqs:
				q.resp <- AppendResult{Err: ErrCommitterStopped}
			default:
				res := <-r.resp
				return res.Op, res.Err
			}
		}
	}
}

// CommitterOrOwn returns shared when a process shares one committer among
// its components; otherwise it starts one of its own. stop ends an own
// committer (after its last batch) and does nothing for a shared one. The
// own committer runs on a context detached from ctx, so outcomes journaled
// during a component's shutdown still commit.
func (s *Store) CommitterOrOwn(ctx context.Context, shared *Committer) (c *Committer, stop func()) {
	if shared != nil {
		return shared, func() {}
	}
	c = s.NewCommitter(CommitterConfig{})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(runCtx) }()
	return c, func() { cancel(); <-done }
}
