package store

import (
	"context"
	"strings"
	"testing"

	"github.com/effectline/effectline/internal/testenv"
)

// TestHotStatementsProbeByKey reads the generic plans of the relay's claim
// on a freshly migrated database: each claimed row reads its event by
// primary key, never by a join over the journal (see claimOutboxSQL).
func TestHotStatementsProbeByKey(t *testing.T) {
	t.Parallel()
	url := testenv.NewDatabase(t)
	if _, err := Migrate(context.Background(), testenv.NewPool(t, url)); err != nil {
		t.Fatal(err)
	}
	plan := testenv.GenericPlan(t, url, claimOutboxSQL)
	for _, bad := range []string{"Seq Scan on events", "Hash Join", "Materialize"} {
		if strings.Contains(plan, bad) {
			t.Errorf("the generic plan of claimOutboxSQL has %q:\n%s", bad, plan)
		}
	}
	if !strings.Contains(plan, "events_pkey") {
		t.Errorf("the generic plan of claimOutboxSQL does not probe events_pkey:\n%s", plan)
	}
}
