package projector

import (
	"strings"
	"testing"

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
