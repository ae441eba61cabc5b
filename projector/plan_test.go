package projector

import (
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
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

// TestListByStatusUsesItsIndex: a list of the statuses that are not
// completed reads the small partial index operation_state_unsettled
// (migration 0014), and a list of completed operations, which are nearly
// all of a history, reads operation_state_created newest first. The
// partial index serves only a statement that shows the status to the
// planner, which List's does.
func TestListByStatusUsesItsIndex(t *testing.T) {
	t.Parallel()
	url := storedb.New(t)
	pool := testenv.NewPool(t, url)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal,
	       status, phase, attempt, last_seq, record, created_at, updated_at)
	SELECT 'op-' || i, 'cache.set', 'idempotent', 'h', 'agent', CASE WHEN i % 500 = 0 THEN 'failed' ELSE 'completed' END,
	       'attempt', 1, 3, '{}', now() - i * interval '1 ms', now()
	  FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE operation_state`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		status events.Status
		index  string
	}{
		{events.StatusFailed, "operation_state_unsettled"},
		{events.StatusNeedsReconciliation, "operation_state_unsettled"},
		{events.StatusCompleted, "operation_state_created"},
	} {
		sql, _, err := listStatement(events.ListFilter{Status: c.status}, events.DefaultListLimit)
		if err != nil {
			t.Fatal(err)
		}
		// The generic plan, as a statement pgx keeps prepared is run
		// after its first few executions.
		plan := testenv.GenericPlan(t, url, sql)
		if !strings.Contains(plan, c.index) {
			t.Errorf("listing %s does not read %s:\n%s", c.status, c.index, plan)
		}
	}
	if _, _, err := listStatement(events.ListFilter{Status: "done'; DROP TABLE operation_state; --"}, 1); err == nil {
		t.Error("a status outside the closed set was written into a statement")
	}
}
