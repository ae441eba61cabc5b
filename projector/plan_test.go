package projector

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// TestUpsertsProbeTheirGuardsByKey reads the generic plans of the
// projector's upserts on a freshly migrated database: the tombstone guards
// must probe the head tables by primary key. As an anti-join the operations
// guard hashed a sequential scan of all of operations on every flush
// (docs/benchmarks.md, session 8).
func TestUpsertsProbeTheirGuardsByKey(t *testing.T) {
	t.Parallel()
	url := storedb.New(t)
	for name, q := range map[string]string{"projectSQL": projectSQL, "upsertWorkflowsSQL": upsertWorkflowsSQL} {
		plan := testenv.GenericPlan(t, url, q)
		for _, bad := range []string{"Seq Scan on operations", "Seq Scan on workflows", "Hash Anti Join", "Hash Join", "Materialize"} {
			if strings.Contains(plan, bad) {
				t.Errorf("the generic plan of %s has %q:\n%s", name, bad, plan)
			}
		}
	}
}

// TestListsUseTheirIndexes reads the plans of List's statements as List
// runs them (listExecMode: planned with their values), on 20,000
// operations of 20 common tools and one rare one. A list of the statuses
// that are not completed reads the small partial index
// operation_state_unsettled (migration 0014); a list of completed
// operations, which are nearly all of a history, and a list of a common
// tool read operation_state_created_at newest first; a rare tool's reads
// operation_state_tool_created_at. Since migration 0015 the indexes leave
// out the key that breaks ties, so a plan sorts the rows of one created_at
// (an Incremental Sort) or the few rows of a rare tool, never a whole list.
func TestListsUseTheirIndexes(t *testing.T) {
	t.Parallel()
	if listExecMode != pgx.QueryExecModeExec && listExecMode != pgx.QueryExecModeSimpleProtocol {
		t.Fatalf("List runs in %v, which keeps a generic plan of its statements", listExecMode)
	}
	url := storedb.New(t)
	pool := testenv.NewPool(t, url)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal,
	       status, phase, attempt, last_seq, record, created_at, updated_at)
	SELECT 'op-' || i, CASE WHEN i % 1000 = 7 THEN 'rare.tool' ELSE 'tool-' || (i % 20) END, 'idempotent', 'h', 'agent',
	       CASE WHEN i % 500 = 0 THEN 'failed' ELSE 'completed' END, 'attempt', 1, 3, '{}', now() - i * interval '1 ms', now()
	  FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE operation_state`); err != nil {
		t.Fatal(err)
	}
	after := encodeCursor(cursor{CreatedAt: time.Now().Add(-time.Second), Key: "op-1000"})
	for _, c := range []struct {
		filter   events.ListFilter
		index    string
		sortsFew bool
	}{
		{filter: events.ListFilter{Status: events.StatusFailed}, index: "operation_state_unsettled"},
		{filter: events.ListFilter{Status: events.StatusNeedsReconciliation}, index: "operation_state_unsettled"},
		{filter: events.ListFilter{Status: events.StatusCompleted}, index: "operation_state_created_at"},
		{filter: events.ListFilter{Status: events.StatusCompleted, Cursor: after}, index: "operation_state_created_at"},
		{filter: events.ListFilter{}, index: "operation_state_created_at"},
		{filter: events.ListFilter{Tool: "tool-3"}, index: "operation_state_created_at"},
		{filter: events.ListFilter{Tool: "rare.tool"}, index: "operation_state_tool_created_at", sortsFew: true},
		{filter: events.ListFilter{Tool: "rare.tool", Cursor: after}, index: "operation_state_tool_created_at", sortsFew: true},
		{filter: events.ListFilter{Tool: "no.such.tool"}, index: "operation_state_tool_created_at", sortsFew: true},
	} {
		lines := listPlan(t, pool, c.filter)
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, c.index) {
			t.Errorf("listing %+v does not read %s:\n%s", c.filter, c.index, plan)
		}
		for _, line := range lines {
			node := strings.TrimLeft(line, " ->")
			if strings.HasPrefix(node, "Seq Scan") || (node == "Sort" && !c.sortsFew) {
				t.Errorf("listing %+v reads the whole list (%s):\n%s", c.filter, node, plan)
			}
		}
	}
}

// TestAPrincipalsListTakesTheIndexAnOperatorBuilt: deploy/OPERATIONS.md
// tells operators with many principals to build an index on (principal,
// created_at); List, planned with its values, then reads it for a
// principal with few operations among many, and keeps reading
// operation_state_created_at for one with a large share.
func TestAPrincipalsListTakesTheIndexAnOperatorBuilt(t *testing.T) {
	t.Parallel()
	url := storedb.New(t)
	pool := testenv.NewPool(t, url)
	ctx := t.Context()
	for _, sql := range []string{
		`INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal,
		       status, phase, attempt, last_seq, record, created_at, updated_at)
		SELECT 'op-' || i, 'tool', 'idempotent', 'h', CASE WHEN i % 1000 = 7 THEN 'rare-agent' ELSE 'agent-' || (i % 4) END,
		       'completed', 'attempt', 1, 3, '{}', now() - i * interval '1 ms', now()
		  FROM generate_series(1, 20000) i`,
		`CREATE INDEX CONCURRENTLY operation_state_principal_created_at ON operation_state (principal, created_at)`,
		`ANALYZE operation_state`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for principal, index := range map[string]string{
		"rare-agent": "operation_state_principal_created_at",
		"agent-1":    "operation_state_created_at",
	} {
		if plan := strings.Join(listPlan(t, pool, events.ListFilter{Principal: principal}), "\n"); !strings.Contains(plan, index) {
			t.Errorf("listing %s's operations does not read %s:\n%s", principal, index, plan)
		}
	}
}

// listPlan is the plan of List's statement for f, as List runs it
// (listExecMode), one line of EXPLAIN each.
func listPlan(t *testing.T, pool *pgxpool.Pool, f events.ListFilter) []string {
	t.Helper()
	sql, args, err := listStatement(f, events.DefaultListLimit)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(testenv.Explain(t, pool, sql, append([]any{listExecMode}, args...)...), "\n")
}

// TestTheFlushesPlanOnceByIndex: the flushes' connections (writePlanning)
// run the upsert of one row, a flush at a moderate rate, on the plan they
// made first, where PostgreSQL would otherwise plan it anew each time; and
// a load of records planned on an empty, vacuumed operation_state still
// reads the key index once the table holds 20,000 rows, as a kept plan
// must.
func TestTheFlushesPlanOnceByIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := store.New(testenv.NewPool(t, storedb.New(t)))
	pool, closePool, err := openWritePool(ctx, st, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closePool)
	if _, err := pool.Exec(ctx, `VACUUM operation_state`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `PREPARE load_rows(text[]) AS `+loadRowsSQL); err != nil {
		t.Fatal(err)
	}
	explain := func() string { return testenv.Explain(t, pool, `EXECUTE load_rows('{op-1}')`) }
	explain() // the plan is made now, on the empty table

	const flushes = 8
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i := range flushes {
		op := events.Operation{Key: fmt.Sprintf("op-%d", i), Tool: "tool", EffectClass: events.Idempotent, PayloadHash: "h",
			Principal: "agent", Status: events.StatusPending, Seq: 1, CreatedAt: at, UpdatedAt: at}
		if written, err := upsert(ctx, pool, []events.Operation{op}); err != nil || len(written) != 1 {
			t.Fatalf("upsert %d = %v, %v", i, written, err)
		}
	}
	var generic, custom int64
	if err := pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		projectSQL).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic != flushes || custom != 0 {
		t.Errorf("the upsert ran %d times on its kept plan and %d on a plan made for its values; want %d and 0", generic, custom, flushes)
	}

	if _, err := pool.Exec(ctx, `INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal,
	       status, phase, attempt, last_seq, record, created_at, updated_at)
	SELECT 'bulk-' || i, 'tool', 'idempotent', 'h', 'agent', 'completed', 'attempt', 1, 3, '{}', now(), now()
	  FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if p := explain(); !strings.Contains(p, "operation_state_pkey") || strings.Contains(p, "Seq Scan") || strings.Contains(p, "Bitmap") {
		t.Errorf("the load of records, planned on the empty table, does not read the key index on 20,000 rows:\n%s", p)
	}
}
