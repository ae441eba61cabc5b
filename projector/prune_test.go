package projector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
)

// TestReplayKeepsPrunedOperationsPruned: the outcomes topic still holds
// the events of operations pruned since (a replay from offset 0 after the
// dedup window); replaying them brings back no read-model row, and the
// operations that were not pruned are projected as usual.
func TestReplayKeepsPrunedOperationsPruned(t *testing.T) {
	t.Parallel()
	h := setup(t)
	var published []store.StoredEvent
	for i := range 3 {
		key := fmt.Sprintf("pruned-%d", i)
		h.journal(events.Operation{}, newFlow(t, key, "payments.charge", events.Irreversible, epoch).intent().started(1).succeeded(1).evs...)
		published = append(published, h.stored(key)...)
	}
	h.journal(events.Operation{}, newFlow(t, "kept", "payments.charge", events.Irreversible, epoch).intent().evs...)
	published = append(published, h.stored("kept")...)
	if _, err := h.pool.Exec(t.Context(), `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	far := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	if n, err := h.store.PruneSettled(t.Context(), "payments.charge", far, far, 10); err != nil || n != 3 {
		t.Fatalf("pruned %d (err %v), want 3", n, err)
	}

	h.publish(published...)
	run := h.start("replay-after-prune")
	h.waitSeqs(map[string]int64{"kept": 1})
	waitUntil(t, "every event to be handled", func() bool {
		return run.count(t, projector.OutcomeApplied)+run.count(t, projector.OutcomeSkipped)+
			run.count(t, projector.OutcomeRejected) >= int64(len(published))
	})
	var rows int
	if err := h.pool.QueryRow(t.Context(), `SELECT count(*) FROM operation_state WHERE operation_key LIKE 'pruned-%'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d read-model rows of pruned operations came back", rows)
	}
}
