package pacing

import (
	"context"
	"time"
)

// Queue hands the items of a group commit to its flushers. The first
// flusher always takes work and, while items arrive steadily, holds its
// batch open until a window has passed since its previous one began
// (Pace). The others take a batch only after a backlog (a batch of at
// least backlogBatch items was just taken): at a moderate rate a second
// transaction in flight only splits the batches, while under a backlog one
// flusher at a time is the bottleneck. The journal's committer
// (store.Committer) and the read model's batcher (projector) flush from
// one each.
//
// Items of type T arrive on a channel the owner keeps (it also drains it
// on shutdown) and are added to a batch of E by add: one request each for
// the committer, a group of events for the batcher. maxBatch and
// backlogBatch count the batch's E.
type Queue[T, E any] struct {
	items        <-chan T
	add          func([]E, T) []E
	maxBatch     int
	backlogBatch int
	backlog      chan struct{} // wakes a helping flusher
	pace         Pace          // the first flusher's only
}

// NewQueue returns the queue of items for flushers flushers.
func NewQueue[T, E any](items <-chan T, add func([]E, T) []E, flushers, maxBatch, backlogBatch int, window time.Duration) *Queue[T, E] {
	return &Queue[T, E]{items: items, add: add, maxBatch: maxBatch, backlogBatch: backlogBatch,
		backlog: make(chan struct{}, flushers), pace: New(window)}
}

// Next empties batch and fills it with a flusher's next batch; first says
// whether the caller is the first flusher (there is exactly one). It
// returns false when ctx ends before there is a batch. A batch it returns
// has left the queue, so the caller flushes it even when ctx ends
// meanwhile: nobody else would answer it.
func (q *Queue[T, E]) Next(ctx context.Context, first bool, batch []E) ([]E, bool) {
	batch = batch[:0]
	if !first {
		select {
		case <-ctx.Done():
			return batch, false
		case <-q.backlog:
		}
	}
	select {
	case <-ctx.Done():
		return batch, false
	case it := <-q.items:
		batch = q.add(batch, it)
	}
	if first {
		batch = q.gather(ctx, batch, q.pace.Hold(time.Now()))
	}
drain:
	for len(batch) < q.maxBatch {
		select {
		case it := <-q.items:
			batch = q.add(batch, it)
		default:
			break drain
		}
	}
	if len(batch) >= q.backlogBatch {
		select {
		case q.backlog <- struct{}{}:
		default:
		}
	}
	if first {
		q.pace.Flushed(time.Now(), len(batch))
	}
	return batch, true
}

// gather adds to batch what arrives within d, up to a full batch; it stops
// holding when ctx ends.
func (q *Queue[T, E]) gather(ctx context.Context, batch []E, d time.Duration) []E {
	if d <= 0 {
		return batch
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for len(batch) < q.maxBatch {
		select {
		case it := <-q.items:
			batch = q.add(batch, it)
		case <-t.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}
