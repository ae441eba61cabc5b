package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// TestHotTablesAreVacuumedByRowsNotBySize runs a server of its own with
// autovacuum on, as production runs, and checks what migration 0011 is
// for: a table of 100,000 settled operations (its history) that has just
// got 12,000 dead head rows, fewer than the default's 20 % of the live
// ones, is vacuumed anyway. The default would wait for 20,050 dead rows,
// and with five million operations of history for a million.
func TestHotTablesAreVacuumedByRowsNotBySize(t *testing.T) {
	t.Parallel()
	srv := testenv.NewPostgresServer(t, "autovacuum=on", "autovacuum_naptime=1s")
	pool := testenv.NewPool(t, srv.NewDatabase(t, "vacuum"))
	ctx := context.Background()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// The history, then the statistics autovacuum's threshold is taken
	// from (reltuples), as the first ANALYZE of a grown table gives them.
	if _, err := pool.Exec(ctx, `
INSERT INTO operations (operation_key, tool, effect_class, payload_hash, status, seq, record, created_at, updated_at)
SELECT 'history/' || i, 'payments.charge', 'irreversible', md5(i::text), 'completed', 3, '{}', now(), now()
  FROM generate_series(1, 100000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE operations`); err != nil {
		t.Fatal(err)
	}
	var before int64
	if err := pool.QueryRow(ctx, `SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'operations'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	// The hot path's dead rows: updates of the head rows.
	if _, err := pool.Exec(ctx, `UPDATE operations SET seq = seq + 1, updated_at = now() WHERE operation_key IN (SELECT 'history/' || i FROM generate_series(1, 12000) i)`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var count, dead int64
		if err := pool.QueryRow(ctx, `SELECT autovacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'operations'`).Scan(&count, &dead); err != nil {
			t.Fatal(err)
		}
		if count > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("autovacuum did not visit operations within a minute of 12,000 dead rows among 100,000 (n_dead_tup %d)", dead)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHotTablesVacuumByRows: every table whose rows the hot path updates
// carries migration 0011's thresholds.
func TestHotTablesVacuumByRows(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, table := range []string{"operations", "operation_state", "workflows", "workflow_state"} {
		var opts []string
		err := s.Pool().QueryRow(context.Background(), `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"autovacuum_vacuum_scale_factor=0": false, "autovacuum_vacuum_threshold=10000": false}
		for _, o := range opts {
			if _, ok := want[o]; ok {
				want[o] = true
			}
		}
		for o, ok := range want {
			if !ok {
				t.Errorf("%s has options %v, want %s", table, opts, o)
			}
		}
	}
}
