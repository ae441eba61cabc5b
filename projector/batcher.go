package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/internal/pacing"
	"github.com/effectline/effectline/store"
)

// errStopped answers events submitted after the batcher stopped; the
// handler returns it, so the message is not acked and is delivered again.
var errStopped = errors.New("projector stopped")

// errNotJournaled rejects a delivered event whose gap the journal cannot
// fill: the journal does not hold the event, so it is not effectline's.
var errNotJournaled = errors.New("event is not in the event store")

// outcome is what projecting one delivered event did.
type outcome int

const (
	outcomeApplied  outcome = iota // folded onto the row
	outcomeFilled                  // folded after the gap before it was filled from the event store
	outcomeSkipped                 // already in the row
	outcomeRejected                // cannot apply; acked and logged, the row is unchanged
)

func (o outcome) String() string {
	switch o {
	case outcomeApplied:
		return OutcomeApplied
	case outcomeFilled:
		return OutcomeGapFilled
	case outcomeSkipped:
		return OutcomeSkipped
	}
	return OutcomeRejected
}

// result is the committed effect of one delivered event.
type result struct {
	outcome outcome
	filled  int   // events loaded from the event store before it
	reason  error // why it was rejected
}

type request[E any] struct {
	ctx  context.Context
	env  E
	resp chan response
}

type response struct {
	result
	// err means nothing was committed for the event: the message must not
	// be acked, and it will be delivered again.
	err error
}

// stream is what a batcher needs to know of one kind of event stream: the
// operations' (events.Envelope folded into events.Operation, in
// operation_state) or the workflow runs' (into workflow_state). E is a
// delivered event, R the record of one stream key.
type stream[E, R any] interface {
	eventKey(e E) string
	eventSeq(e E) int64
	eventTime(e E) time.Time
	recordSeq(r R) int64
	// apply folds e onto r, which is at e's seq minus one.
	apply(r R, e E) (R, error)
	// complete reports whether e, delivered, holds everything its fold
	// needs; an event that does not is taken from the journal instead,
	// like an event after a gap.
	complete(e E) bool
	// load reads the stored records of keys; keys without a row are absent.
	load(ctx context.Context, pool *pgxpool.Pool, keys []string) (map[string]R, error)
	// write upserts recs, sorted by key, guarded by their seq, and returns
	// the keys of the rows it changed.
	write(ctx context.Context, pool *pgxpool.Pool, recs []R) ([]string, error)
	// journal returns the journaled events of key after afterSeq, in order.
	journal(ctx context.Context, key string, afterSeq int64) ([]E, error)
}

// batcher is a group commit for the handlers. watermill-kafka hands out one
// message per partition and waits for its ack before the next, so throughput
// is partitions × (1 / commit latency) unless the partitions share their
// commits. Each handler submits its event and waits; a flusher takes
// everything queued, folds it in memory onto the cached records, and writes
// every changed row in one statement, which commits on its own. Under load
// batches grow by themselves while the previous commit is in flight. At a
// moderate steady rate they do not: each write finished before the next
// event arrived, and the read model took a statement per event or two
// (most of the projector's CPU, and as much again in PostgreSQL). So, as
// the journal's committer does, the first flusher keeps its writes a
// window apart while events arrive steadily (internal/pacing) and folds
// what arrives in between, often an operation's claim and its outcome into
// one row version; after a quiet spell an event is written at once. The
// other flushers help only under a backlog.
type batcher[E, R any] struct {
	// pool runs the flushes' statements (see openWritePool); Run sets it.
	pool     *pgxpool.Pool
	stream   stream[E, R]
	cache    *recordCache[R]
	metrics  *streamMetrics
	log      *slog.Logger
	maxBatch int
	flushers int
	queue    *pacing.Queue[[]*request[E], *request[E]]
	timeout  time.Duration

	reqs chan []*request[E] // groups, see submit
	done chan struct{}
}

// run flushes until ctx is done, then fails what is still queued. A batch a
// flusher already took is finished even after ctx is done, so an event whose
// row committed is reported as committed.
func (b *batcher[E, R]) run(ctx context.Context) {
	finished := make(chan struct{}, b.flushers)
	for i := range b.flushers {
		go func() {
			defer func() { finished <- struct{}{} }()
			b.flushLoop(ctx, i == 0)
		}()
	}
	for range b.flushers {
		<-finished
	}
	close(b.done)
	b.failQueued()
}

// failQueued answers every request still queued. It runs once the flushers
// are gone, from run and from submitters that raced with it, so each request
// ends up answered exactly once (whoever receives it from the channel answers).
func (b *batcher[E, R]) failQueued() {
	for {
		select {
		case g := <-b.reqs:
			for _, r := range g {
				r.resp <- response{err: errStopped}
			}
		default:
			return
		}
	}
}

// submit queues events as one group and waits until their rows are
// committed (or it is known that nothing was). A group is never split
// between flushes, so the events of one operation delivered together (a
// claim and its outcome, published in one relay batch) are folded into one
// write of its row. ctxs[i] is the context of envs[i].
func (b *batcher[E, R]) submit(ctxs []context.Context, envs []E) []response {
	group := make([]*request[E], len(envs))
	for i, e := range envs {
		group[i] = &request[E]{ctx: ctxs[i], env: e, resp: make(chan response, 1)}
	}
	out := make([]response, len(group))
	fail := func(err error) []response {
		for i := range out {
			out[i] = response{err: err}
		}
		return out
	}
	select {
	case b.reqs <- group:
	case <-b.done:
		return fail(errStopped)
	case <-ctxs[0].Done():
		return fail(ctxs[0].Err())
	}
	for i, r := range group {
		select {
		case out[i] = <-r.resp:
		case <-b.done:
			// The flushers are gone, so every request they took is answered;
			// a group still queued (ours, if it slipped in while run was
			// draining) is answered here.
			b.failQueued()
			out[i] = <-r.resp
		}
	}
	return out
}

// flushLoop is one flusher: the first always takes work and paces its
// writes, the others help under a backlog (pacing.Queue).
func (b *batcher[E, R]) flushLoop(ctx context.Context, first bool) {
	batch := make([]*request[E], 0, b.maxBatch)
	for {
		var ok bool
		if batch, ok = b.queue.Next(ctx, first, batch); !ok {
			return
		}
		b.flush(ctx, batch)
	}
}

func (b *batcher[E, R]) flush(ctx context.Context, batch []*request[E]) {
	live := make([]*request[E], 0, len(batch))
	for _, r := range batch {
		// The subscriber cancels a message's context when it stops waiting
		// for the ack; projecting it now would be wasted, it comes back.
		if err := r.ctx.Err(); err != nil {
			r.resp <- response{err: err}
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
	defer cancel()

	b.metrics.observeBatch(fctx, len(live))
	keys, byKey := b.groupByKey(live)
	results, err := b.commit(fctx, live, keys, byKey)
	switch {
	case err == nil:
		b.answer(live, results)
	case errors.Is(err, store.ErrRejectedValue) && len(keys) > 1:
		// One event's row was refused (a value PostgreSQL will not store).
		// Retrying the batch would fail forever and stall every partition in
		// it, so each operation commits on its own and only the culprit's
		// events are rejected.
		for _, k := range keys {
			group := make([]*request[E], len(byKey[k]))
			for j, i := range byKey[k] {
				group[j] = live[i]
			}
			b.commitAlone(fctx, group)
		}
	case errors.Is(err, store.ErrRejectedValue):
		b.reject(live, err)
	default:
		b.log.WarnContext(fctx, "projector: committing a batch failed; its events will be delivered again",
			"events", len(live), "error", err)
		for _, r := range live {
			r.resp <- response{err: err}
		}
	}
}

// commitAlone commits the events of one operation.
func (b *batcher[E, R]) commitAlone(ctx context.Context, reqs []*request[E]) {
	keys, byKey := b.groupByKey(reqs)
	results, err := b.commit(ctx, reqs, keys, byKey)
	switch {
	case err == nil:
		b.answer(reqs, results)
	case errors.Is(err, store.ErrRejectedValue):
		b.reject(reqs, err)
	default:
		for _, r := range reqs {
			r.resp <- response{err: err}
		}
	}
}

func (b *batcher[E, R]) reject(reqs []*request[E], err error) {
	for _, r := range reqs {
		b.metrics.count(r.ctx, OutcomeRejected, 1)
		r.resp <- response{result: result{outcome: outcomeRejected, reason: fmt.Errorf("the database refused the row: %w", err)}}
	}
}

// answer records the metrics of a committed batch and releases its handlers.
func (b *batcher[E, R]) answer(reqs []*request[E], results []result) {
	now := time.Now()
	for i, r := range reqs {
		res := results[i]
		switch res.outcome {
		case outcomeApplied, outcomeFilled:
			b.metrics.count(r.ctx, OutcomeApplied, 1)
			b.metrics.count(r.ctx, OutcomeGapFilled, res.filled)
			b.metrics.observeLag(r.ctx, b.stream.eventTime(r.env), now)
		case outcomeSkipped:
			b.metrics.count(r.ctx, OutcomeSkipped, 1)
		case outcomeRejected:
			b.metrics.count(r.ctx, OutcomeRejected, 1)
		}
		r.resp <- response{result: res}
	}
}

// groupByKey returns the distinct keys of reqs in order of first appearance
// and, per key, the indexes of its requests in seq order.
func (b *batcher[E, R]) groupByKey(reqs []*request[E]) ([]string, map[string][]int) {
	var keys []string
	byKey := make(map[string][]int, len(reqs))
	for i, r := range reqs {
		k := b.stream.eventKey(r.env)
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	for _, idx := range byKey {
		slices.SortStableFunc(idx, func(a, c int) int {
			return compareInt64(b.stream.eventSeq(reqs[a].env), b.stream.eventSeq(reqs[c].env))
		})
	}
	return keys, byKey
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// commit projects reqs: it folds each operation's events in seq order onto
// its cached record (reading the rows of the operations not cached), writes
// every changed row in one statement and caches what it wrote. It returns
// the result of each request only once the write returned, so no message is
// acked before its row is stored. recordCache explains why folding onto a
// cached record or an unlocked read is safe.
//
// When every operation is cached, or new, the flush is one round trip.
func (b *batcher[E, R]) commit(ctx context.Context, reqs []*request[E], keys []string, byKey map[string][]int) (_ []result, err error) {
	defer func() {
		if err != nil {
			// The write may have committed or not; the next flush reads.
			b.cache.drop(keys)
		}
	}()
	epoch := b.cache.begin()
	current, missing := b.cache.get(keys)
	// A key whose first event here is seq 1 is folded from the empty
	// record without reading its row: if the row exists, it is at seq 1 or
	// later and the upsert leaves it alone.
	missing = slices.DeleteFunc(missing, func(k string) bool { return b.stream.eventSeq(reqs[byKey[k][0]].env) == 1 })
	if len(missing) > 0 {
		stored, err := b.stream.load(ctx, b.pool, missing)
		if err != nil {
			return nil, err
		}
		maps.Copy(current, stored)
	}

	results := make([]result, len(reqs))
	folded := make([]R, 0, len(keys))
	changed := make([]R, 0, len(keys))
	changedKeys := make([]string, 0, len(keys))
	for _, k := range keys {
		rec := current[k]
		base := b.stream.recordSeq(rec)
		for _, i := range byKey[k] {
			rec, results[i], err = b.project(ctx, k, rec, reqs[i].env)
			if err != nil {
				return nil, err
			}
		}
		if b.stream.recordSeq(rec) > base {
			changed = append(changed, rec)
			changedKeys = append(changedKeys, k)
		}
		if b.stream.recordSeq(rec) > 0 {
			folded = append(folded, rec)
		}
	}
	written, err := b.stream.write(ctx, b.pool, changed)
	if err != nil {
		return nil, err
	}
	if len(written) < len(changed) {
		stale := skipUnwritten(byKey, changedKeys, written, results)
		folded = slices.DeleteFunc(folded, func(r R) bool { return stale[b.cache.key(r)] })
		b.cache.drop(slices.Collect(maps.Keys(stale)))
	}
	b.cache.put(epoch, folded)
	return results, nil
}

// skipUnwritten handles the changed rows the upsert did not write because
// the table was at or past them: their events were already in the row, so
// they count as skipped. It returns those operations' keys.
func skipUnwritten(byKey map[string][]int, changed []string, written []string, results []result) map[string]bool {
	stale := make(map[string]bool, len(changed)-len(written))
	for _, k := range changed {
		stale[k] = true
	}
	for _, k := range written {
		delete(stale, k)
	}
	for k := range stale {
		for _, i := range byKey[k] {
			if o := results[i].outcome; o == outcomeApplied || o == outcomeFilled {
				results[i] = result{outcome: outcomeSkipped}
			}
		}
	}
	return stale
}

// project folds one delivered event onto rec, the record of key as of this
// batch. Only an error that may pass on a retry (the journal could not be
// read) is returned as an error; an event that can never apply is a
// rejected result, so it is acked and never stalls its partition.
func (b *batcher[E, R]) project(ctx context.Context, key string, rec R, e E) (R, result, error) {
	seq, at := b.stream.eventSeq(e), b.stream.recordSeq(rec)
	switch {
	case seq <= at:
		return rec, result{outcome: outcomeSkipped}, nil
	case seq == at+1 && b.stream.complete(e):
		next, err := b.stream.apply(rec, e)
		if err != nil {
			return rec, result{outcome: outcomeRejected, reason: err}, nil
		}
		return next, result{outcome: outcomeApplied}, nil
	}
	return b.fill(ctx, key, rec, seq)
}

// fill handles an event that is ahead of its row: a message was lost or
// reordered, or the topic's retention dropped a stream's first events
// before this consumer group read them. Rather than guess, it folds the
// journal's events from the row's seq through the delivered one. The
// delivered event itself is taken from the journal too: the journal is the
// truth, and the publisher sent exactly those bytes.
func (b *batcher[E, R]) fill(ctx context.Context, key string, rec R, seq int64) (R, result, error) {
	at := b.stream.recordSeq(rec)
	stored, err := b.stream.journal(ctx, key, at)
	if err != nil {
		return rec, result{}, fmt.Errorf("filling the gap of %s from seq %d to %d: %w", key, at, seq, err)
	}
	next := rec
	for _, s := range stored {
		if b.stream.eventSeq(s) > seq {
			break
		}
		n, err := b.stream.apply(next, s)
		if err != nil {
			return rec, result{outcome: outcomeRejected, reason: fmt.Errorf("journaled seq %d: %w", b.stream.eventSeq(s), err)}, nil
		}
		next = n
	}
	if got := b.stream.recordSeq(next); got != seq {
		return rec, result{outcome: outcomeRejected, reason: fmt.Errorf("%w (it holds seq %d to %d)", errNotJournaled, at+1, got)}, nil
	}
	return next, result{outcome: outcomeFilled, filled: int(seq - at - 1)}, nil
}
