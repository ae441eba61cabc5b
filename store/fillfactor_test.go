package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// TestHeadRowsKeepTheirUpdatesOnTheirPage: the head rows of a burst of
// operations are inserted together, then claimed, then settled, as
// traffic does it. Migration 0010's fillfactor leaves each page room for
// the new versions, so most of them stay on the page the insert used,
// which the insert has just brought into the cache. At the default
// fillfactor the inserts fill each page and every update's version goes
// wherever the free-space map finds room (on a long history: cold pages).
func TestHeadRowsKeepTheirUpdatesOnTheirPage(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const n = 200
	block := func(key string) int64 {
		var b int64
		if err := s.Pool().QueryRow(ctx, `SELECT (ctid::text::point)[0]::bigint FROM operations WHERE operation_key = $1`, key).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	ops := make([]events.Operation, n)
	inserted := make([]int64, n)
	for i := range ops {
		ops[i] = create(t, s, fmt.Sprintf("burst/%03d", i))
		inserted[i] = block(ops[i].Key)
	}
	for i, op := range ops {
		op, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w")}})
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	same := 0
	for i, op := range ops {
		ev, err := events.New(events.AttemptSucceeded, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
			events.AttemptSucceededData{Result: json.RawMessage(`{"id":"ch_1","status":"succeeded"}`), DownstreamID: "ch_1"}, t0.Add(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{ev}}); err != nil {
			t.Fatal(err)
		}
		if block(op.Key) == inserted[i] {
			same++
		}
	}
	// Measured: 8 of 200 at the default fillfactor, 91 at 70. All 200
	// inserted before any update is the worst case for the reserve (a
	// page's rows all want room at once); traffic interleaves them.
	if same < n/3 {
		t.Fatalf("%d of %d settled head rows are on the page their insert used; want at least a third", same, n)
	}
}

// TestHotTablesLeaveRoomForUpdates: both tables whose rows every operation
// updates in place keep the reserve migration 0010 gives them (the read
// model's row is upserted by the projector at each event, like the head
// row by each append).
func TestHotTablesLeaveRoomForUpdates(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, table := range []string{"operations", "operation_state"} {
		var opts []string
		err := s.Pool().QueryRow(context.Background(), `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(opts, "fillfactor=70") {
			t.Errorf("%s has options %v, want fillfactor=70", table, opts)
		}
	}
}
