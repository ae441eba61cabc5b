package workflow

import (
	"strings"
	"testing"

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
