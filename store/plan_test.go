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

// TestTheRebuildPagesTheJournalByIndex reads the generic plan of the
// rebuild's page of the journal on a journal of 30,000 events: it starts
// in the primary key where the last page ended and reads it in order. A
// Seq Scan and a full Sort would read the whole journal for every page.
func TestTheRebuildPagesTheJournalByIndex(t *testing.T) {
	t.Parallel()
	url := testenv.NewDatabase(t)
	pool := testenv.NewPool(t, url)
	ctx := t.Context()
	if _, err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO events (operation_key, seq, event_id, type, envelope, occurred_at)
	SELECT 'op-' || (i / 3), i % 3 + 1, '', '', '\x00', now() FROM generate_series(0, 29999) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE events`); err != nil {
		t.Fatal(err)
	}
	plan := testenv.GenericPlan(t, url, journalPageSQL)
	if !strings.Contains(plan, "events_pkey") {
		t.Errorf("the journal's page does not read events_pkey:\n%s", plan)
	}
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "Seq Scan") || (strings.Contains(line, "Sort") && !strings.Contains(line, "Incremental Sort") && !strings.Contains(line, "Sort Key") && !strings.Contains(line, "Presorted Key")) {
			t.Errorf("the journal's page reads the whole journal (%s):\n%s", strings.TrimSpace(line), plan)
		}
	}
}
