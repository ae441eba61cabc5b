package projector

import (
	"fmt"
	"testing"

	"github.com/effectline/effectline/events"
)

func cachedOp(key string, seq int64, status events.Status) events.Operation {
	return events.Operation{Key: key, Seq: seq, Status: status}
}

// put never moves an entry back: two flushers of the same operation may
// finish in either order.
func TestRecordCacheKeepsTheHigherSeq(t *testing.T) {
	t.Parallel()
	c := newRecordCache(10)
	c.put(0, []events.Operation{cachedOp("a", 5, events.StatusInProgress)})
	c.put(0, []events.Operation{cachedOp("a", 3, events.StatusInProgress)})
	found, missing := c.get([]string{"a", "b"})
	if found["a"].Seq != 5 || len(missing) != 1 || missing[0] != "b" {
		t.Errorf("get = %v, %v; want a at seq 5 and b missing", found, missing)
	}
	c.drop([]string{"a"})
	if found, _ := c.get([]string{"a"}); len(found) != 0 {
		t.Errorf("a still cached after drop: %v", found)
	}
}

// A cache over its cap drops to half, terminal operations first.
func TestRecordCacheTrimsTerminalOperationsFirst(t *testing.T) {
	t.Parallel()
	c := newRecordCache(10)
	var ops []events.Operation
	for i := range 6 {
		ops = append(ops, cachedOp(fmt.Sprintf("live-%d", i), 2, events.StatusInProgress))
	}
	for i := range 4 {
		ops = append(ops, cachedOp(fmt.Sprintf("done-%d", i), 3, events.StatusCompleted))
	}
	c.put(0, ops)
	if len(c.ops) != 10 {
		t.Fatalf("%d cached at the cap, want 10", len(c.ops))
	}
	c.put(0, []events.Operation{cachedOp("new", 1, events.StatusPending)})
	if len(c.ops) != 5 {
		t.Fatalf("%d cached after going over the cap of 10, want 5", len(c.ops))
	}
	for k, op := range c.ops {
		if op.Status.Terminal() {
			t.Errorf("terminal %s kept while live operations were dropped", k)
		}
	}

	off := newRecordCache(-1)
	off.put(0, ops)
	if len(off.ops) != 0 {
		t.Errorf("a disabled cache holds %d records", len(off.ops))
	}
}

// After a reset (the database may have lost rows) the cache is empty, and
// a flush that began before it caches nothing: its records may be among
// the lost.
func TestRecordCacheResetOutlivesFlushesInFlight(t *testing.T) {
	t.Parallel()
	c := newRecordCache(10)
	c.put(c.begin(), []events.Operation{cachedOp("a", 2, events.StatusInProgress)})
	inFlight := c.begin()
	c.reset()
	if found, _ := c.get([]string{"a"}); len(found) != 0 {
		t.Fatalf("a cached after reset: %v", found)
	}
	c.put(inFlight, []events.Operation{cachedOp("a", 3, events.StatusCompleted)})
	if found, _ := c.get([]string{"a"}); len(found) != 0 {
		t.Fatalf("a flush begun before the reset cached %v", found)
	}
	c.put(c.begin(), []events.Operation{cachedOp("a", 3, events.StatusCompleted)})
	if found, _ := c.get([]string{"a"}); found["a"].Seq != 3 {
		t.Fatalf("a flush begun after the reset cached nothing: %v", found)
	}
}
