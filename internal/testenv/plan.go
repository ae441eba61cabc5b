package testenv

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// GenericPlan prepares query on the database at url and returns the text
// of its generic plan (EXPLAIN (COSTS OFF) EXECUTE with every parameter
// NULL under plan_cache_mode = force_generic_plan).
//
// Why the generic plan: pgx prepares each statement once per connection,
// and after five executions PostgreSQL may keep a plan made for no values
// in particular, with the statistics of the moment. On a fresh database
// those say the tables are tiny, and where autovacuum is off (or until its
// first ANALYZE) the plan is kept while the tables grow: twice a join
// planned that way scanned a whole table per row (docs/benchmarks.md,
// sessions 8 and 9). A test that reads this plan on a freshly migrated
// database catches that shape before a benchmark does.
func GenericPlan(t testing.TB, url, query string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dbConnectTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testenv: connecting to %s: %v", redact(url), err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	sd, err := conn.Prepare(ctx, "generic_plan", query)
	if err != nil {
		t.Fatalf("testenv: preparing %q: %v", query, err)
	}
	nulls := make([]string, len(sd.ParamOIDs))
	for i := range nulls {
		nulls[i] = "NULL"
	}
	explain := "EXPLAIN (COSTS OFF) EXECUTE generic_plan"
	if len(nulls) > 0 {
		explain += "(" + strings.Join(nulls, ", ") + ")"
	}
	rows, err := conn.Query(ctx, explain, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("testenv: %s: %v", explain, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("testenv: %s: %v", explain, err)
	}
	return strings.Join(lines, "\n")
}
