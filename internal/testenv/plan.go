package testenv

import (
	"context"
	"fmt"
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
	plan, err := explainGeneric(ctx, conn, "EXPLAIN (COSTS OFF)", query)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return plan
}

// GenericPlanJSON is GenericPlan on an open connection, in EXPLAIN's JSON
// format and verbose (EXPLAIN (VERBOSE, COSTS OFF, FORMAT JSON)): the tree
// of plan nodes with each node's output columns, for a test that walks it
// rather than reads it. It plans under the connection's settings, which
// the caller may have changed (enable_seqscan, say). A statement that
// cannot be prepared or explained (a TRUNCATE, a LOCK) is an error, not a
// failure of the test.
func GenericPlanJSON(ctx context.Context, conn *pgx.Conn, query string) ([]byte, error) {
	plan, err := explainGeneric(ctx, conn, "EXPLAIN (VERBOSE, COSTS OFF, FORMAT JSON)", query)
	return []byte(plan), err
}

// explainGeneric runs explain (an EXPLAIN with its options) on the generic
// plan of query, prepared on conn and deallocated afterwards.
func explainGeneric(ctx context.Context, conn *pgx.Conn, explain, query string) (string, error) {
	const name = "generic_plan"
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		return "", err
	}
	sd, err := conn.Prepare(ctx, name, query)
	if err != nil {
		return "", fmt.Errorf("preparing %q: %w", query, err)
	}
	defer func() { _ = conn.Deallocate(context.WithoutCancel(ctx), name) }()
	nulls := make([]string, len(sd.ParamOIDs))
	for i := range nulls {
		nulls[i] = "NULL"
	}
	explain += " EXECUTE " + name
	if len(nulls) > 0 {
		explain += "(" + strings.Join(nulls, ", ") + ")"
	}
	rows, err := conn.Query(ctx, explain, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return "", fmt.Errorf("%s: %w", explain, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("%s: %w", explain, err)
	}
	return strings.Join(lines, "\n"), nil
}

// Querier runs a query: a connection, a pool, a pool's connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Explain returns the plan of sql on q (EXPLAIN (COSTS OFF)), one node a
// line, under q's settings. args are sql's, led by a pgx.QueryExecMode to
// say how it runs.
func Explain(t testing.TB, q Querier, sql string, args ...any) string {
	t.Helper()
	rows, err := q.Query(t.Context(), "EXPLAIN (COSTS OFF) "+sql, args...)
	return PlanText(t, rows, err)
}

// PlanText reads the rows of a text EXPLAIN, as a query returned them
// (rows and err), into one string, one node a line.
func PlanText(t testing.TB, rows pgx.Rows, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("testenv: EXPLAIN: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("testenv: EXPLAIN: %v", err)
	}
	return strings.Join(lines, "\n")
}
