package workflow

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
)

// TestDueRunsProbeTheirOperationByKey reads the generic plan of the
// driver's round statement on a freshly migrated database: each waiting
// run must read its operation through the primary key. As a join it was a
// nested loop over a materialized scan of every settled operation, per
// waiting run (docs/benchmarks.md, session 9).
func TestDueRunsProbeTheirOperationByKey(t *testing.T) {
	t.Parallel()
	plan := testenv.GenericPlan(t, storedb.New(t), lockDueSQL)
	for _, bad := range []string{"Seq Scan on operations", "Materialize", "Hash Join"} {
		if strings.Contains(plan, bad) {
			t.Errorf("the generic plan of lockDueSQL has %q:\n%s", bad, plan)
		}
	}
	if !strings.Contains(plan, "Index Scan using operations_pkey") {
		t.Errorf("the generic plan of lockDueSQL does not probe operations_pkey:\n%s", plan)
	}
}

// TestThePublisherMarksByKey reads the generic plan of the publisher's
// mark on a freshly migrated database, in a transaction that began with
// publishLockSQL as the publisher's does: one primary-key probe per
// published event. Without the settings the plan hashes a sequential scan
// of the whole journal (checked first, or the test would show nothing).
func TestThePublisherMarksByKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, storedb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	explain := func(settings string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if settings != "" {
			if _, err := tx.Exec(ctx, settings, int64(publisherLock)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `PREPARE mark(text[], bigint[]) AS `+markPublishedSQL); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE mark`) }() // a session's, not the transaction's
		return testenv.Explain(t, tx, `EXECUTE mark(NULL, NULL)`)
	}
	if plan := explain(""); !strings.Contains(plan, "Seq Scan on workflow_events") {
		t.Fatalf("without the publisher's settings the mark does not scan the journal, so this test shows nothing:\n%s", plan)
	}
	plan := explain(publishLockSQL)
	if !strings.Contains(plan, "Index Scan using workflow_events_pkey") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Hash") {
		t.Errorf("after publishLockSQL the mark does not probe workflow_events_pkey per event:\n%s", plan)
	}
}
