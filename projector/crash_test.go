package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/projector"
)

// TestProjectionSurvivesADatabaseCrash: the projector commits its rows
// asynchronously, so a database crash can take the last of them. Their
// offsets must not have been committed: after the crash the rows are
// projected again, and every operation's row ends at its journal's last
// event. Before the durability watch, the operations whose terminal row was
// lost stayed behind until someone ran Rebuild.
func TestProjectionSurvivesADatabaseCrash(t *testing.T) {
	t.Parallel()
	// The WAL writer flushes partial pages only every 10s, so the rows last
	// projected are still in shared memory when the server crashes.
	srv := testenv.NewPostgresServer(t, "wal_writer_delay=10s")
	dbURL := srv.NewDatabase(t, "crash")
	h := setupOn(t, dbURL, 4)
	run := h.start("crash-test")

	const n = 40
	want := map[string]int64{}
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range n {
		key := fmt.Sprintf("crash-%02d", i)
		evs := newFlow(t, key, "payments.charge", events.Irreversible, at).intent().started(1).succeeded(1).evs
		h.journal(events.Operation{}, evs...)
		want[key] = int64(len(evs))
	}
	// The journal's synchronous commits are flushed; from here on only the
	// projector writes.
	for key := range want {
		h.publish(h.stored(key)...)
	}
	h.waitSeqs(want)

	srv.Crash(t)
	srv.Start(t)
	h.pool.Reset() // the test's own connections died with the server
	lost := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, dbURL); err != nil {
		t.Logf("counting the rows the crash took: %v", err)
	} else {
		_ = conn.QueryRow(ctx, `SELECT $1::int - count(*) FROM operation_state WHERE last_seq = 3`, n).Scan(&lost)
		_ = conn.Close(ctx)
	}
	t.Logf("rows behind their journal right after the crash: %d of %d (the projector may already have repaired some)", lost, n)

	h.waitSeqs(want)
	if got := run.rewinds(t); got < 1 {
		t.Errorf("%s = %d after a crash, want at least 1", projector.MetricRewinds, got)
	}
}
