package projector

import (
	"sync"

	"github.com/effectline/effectline/events"
)

// recordCache holds the last committed record of recently projected
// operations, so that a flush folds onto it and writes at once instead of
// reading the rows first: at a moderate rate batches are small and the
// round trips of a flush, not its rows, are its cost.
//
// A cached record may disagree with the table and still be folded onto,
// because a row at seq N is the same whoever wrote it (events.Apply is a
// pure fold of the journaled events) and the upsert only ever replaces a row
// by one with a higher last_seq:
//
//   - The table is ahead of the cache (another replica owned the partition
//     for a while during a rebalance, or Rebuild ran): the upsert of a row at
//     or below the table's seq changes nothing, so the table never goes back.
//     RETURNING tells the flush, which reports the events as skipped and
//     drops the entry, so the next event reads the newer row.
//   - The table is behind the cache (an asynchronous commit lost in a
//     database crash, see Config.SynchronousCommit, or a row put back by
//     hand): the next event is folded onto the cached record, and its upsert
//     writes the whole row, which repairs it.
//   - An event more than one ahead of the cached seq (its predecessors went
//     to another replica) is a gap like any other, filled from the event
//     store.
//
// Rebuild holds an EXCLUSIVE lock on the table, which an upsert waits for,
// so no write lands between its DELETE and its inserts; after it, the
// first case applies. Nothing relies on row locks, so the read of an
// operation that is not cached is a plain SELECT.
//
// All of this rests on rows being folds of the journal. A row changed by
// other means (by hand, or by a projector folding with a different Apply)
// that a projector has read stays in its cache as it was read, and Rebuild
// repairs the table, not the caches: repair such damage by restarting the
// projectors, then running Rebuild.
//
// An entry is only ever the record a statement wrote or read after it
// returned, so the table is never behind it unless a commit was lost or a
// row was put back. A
// flush that failed drops its keys instead, since what it committed is
// unknown. Two flushers may hold the same operation at once (one partition's
// messages split across two batches); put keeps the higher seq whatever
// order they finish in.
//
// A database crash can take rows committed asynchronously (see
// durabilityWatch), and the partitions are then read again. Their events
// must be folded onto the rows as they are after the crash, not skipped
// as already in a cached record, so reset empties the cache and a flush
// that began before it caches nothing.
//
// The cache is generic over the record: the operations' and the workflow
// runs' projections each have one, with the same rules.
type recordCache[R any] struct {
	mu    sync.Mutex
	max   int
	epoch uint64 // bumped by reset
	ops   map[string]R
	// meta tells a record's key, seq and whether it is terminal.
	meta func(R) (key string, seq int64, terminal bool)
}

// newCache returns a cache of at most max records; max ≤ 0 caches nothing.
func newCache[R any](max int, meta func(R) (string, int64, bool)) *recordCache[R] {
	return &recordCache[R]{max: max, ops: make(map[string]R), meta: meta}
}

// newRecordCache returns a cache of operations.
func newRecordCache(max int) *recordCache[events.Operation] {
	return newCache(max, func(op events.Operation) (string, int64, bool) { return op.Key, op.Seq, op.Status.Terminal() })
}

// key returns r's key.
func (c *recordCache[R]) key(r R) string {
	k, _, _ := c.meta(r)
	return k
}

// get returns the cached records of keys and the keys it does not hold.
func (c *recordCache[R]) get(keys []string) (map[string]R, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	found := make(map[string]R, len(keys))
	var missing []string
	for _, k := range keys {
		if op, ok := c.ops[k]; ok {
			found[k] = op
		} else {
			missing = append(missing, k)
		}
	}
	return found, missing
}

// begin returns the epoch a flush starts in, for put.
func (c *recordCache[R]) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// reset forgets every record.
func (c *recordCache[R]) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	clear(c.ops)
}

// put caches the records committed by a flush that began in epoch, unless
// the cache was reset since.
func (c *recordCache[R]) put(epoch uint64, ops []R) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch {
		return
	}
	for _, r := range ops {
		k, seq, _ := c.meta(r)
		if old, ok := c.ops[k]; !ok {
			c.ops[k] = r
		} else if _, oldSeq, _ := c.meta(old); oldSeq < seq {
			c.ops[k] = r
		}
	}
	c.trim()
}

// drop forgets keys.
func (c *recordCache[R]) drop(keys []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.ops, k)
	}
}

// trim halves a cache that outgrew its cap, so the scan is paid once per
// max/2 new entries. Operations in a terminal status go first: another event
// for them is rare, and a miss costs only a read.
func (c *recordCache[R]) trim() {
	if len(c.ops) <= c.max {
		return
	}
	keep := c.max / 2
	for k, r := range c.ops {
		if len(c.ops) <= keep {
			return
		}
		if _, _, terminal := c.meta(r); terminal {
			delete(c.ops, k)
		}
	}
	for k := range c.ops {
		if len(c.ops) <= keep {
			return
		}
		delete(c.ops, k)
	}
}
