package app

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
)

// planJudge reads generic plans on a freshly migrated database.
type planJudge struct {
	t    *testing.T
	conn *pgx.Conn
	// parents maps a partition to its partitioned table.
	parents map[string]string
	// keyColumn is the position of operation_key in each co-located
	// table's rows, dropped columns counted: where an insert's plan puts it.
	keyColumn map[string]int
}

func newPlanJudge(t *testing.T) *planJudge {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, storedb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	// With sequential scans available the planner reads a fresh table's
	// few pages whatever the statement's conditions; without them it uses
	// an index wherever the conditions allow one, so a plan shows which
	// access the statement allows. Every co-located table has an index
	// that leads with operation_key, so a key condition is never left
	// unused for want of one.
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	j := &planJudge{t: t, conn: conn, parents: map[string]string{}, keyColumn: map[string]int{}}
	rows, err := conn.Query(ctx, `SELECT c.relname, p.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent`)
	if err != nil {
		t.Fatal(err)
	}
	var child, parent string
	if _, err := pgx.ForEachRow(rows, []any{&child, &parent}, func() error {
		j.parents[child] = parent
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for table := range coLocated {
		var n int
		if err := conn.QueryRow(ctx, `SELECT attnum FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'operation_key'`,
			table).Scan(&n); err != nil {
			t.Fatalf("the operation_key column of %s: %v", table, err)
		}
		j.keyColumn[table] = n - 1
	}
	return j
}

// planNode is a node of EXPLAIN (FORMAT JSON), with the members judged.
type planNode struct {
	NodeType    string     `json:"Node Type"`
	Operation   string     `json:"Operation"`
	Relation    string     `json:"Relation Name"`
	Schema      string     `json:"Schema"`
	Alias       string     `json:"Alias"`
	Parent      string     `json:"Parent Relationship"`
	IndexName   string     `json:"Index Name"`
	IndexCond   string     `json:"Index Cond"`
	RecheckCond string     `json:"Recheck Cond"`
	Filter      string     `json:"Filter"`
	TIDCond     string     `json:"TID Cond"`
	Output      []string   `json:"Output"`
	Plans       []planNode `json:"Plans"`
}

func (n *planNode) walk(fn func(*planNode)) {
	fn(n)
	for i := range n.Plans {
		n.Plans[i].walk(fn)
	}
}

// problems says why sql does not name its operation keys, or nothing.
func (j *planJudge) problems(sql string) []string {
	raw, err := testenv.GenericPlanJSON(context.Background(), j.conn, sql)
	if err != nil {
		return []string{fmt.Sprintf("  it has no plan: %v", err)}
	}
	// A utility statement (TRUNCATE, LOCK TABLE) has no plan either: its
	// EXPLAIN is ["Utility Statement"]. It acts on a table as a whole.
	var utility []string
	if json.Unmarshal(raw, &utility) == nil {
		return []string{"  a utility statement: it acts on the whole table"}
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		j.t.Fatalf("decoding the plan of %q: %v\n%s", sql, err, raw)
	}
	root := &plans[0].Plan
	// The aliases of what a statement unnests from its parameters: a key
	// read from one is a key the statement was given.
	given := map[string]bool{}
	root.walk(func(n *planNode) {
		if n.NodeType == "Function Scan" || n.NodeType == "Values Scan" {
			given[n.Alias] = true
		}
	})
	var out []string
	root.walk(func(n *planNode) {
		if n.Relation == "" || n.Schema == "pg_catalog" {
			return
		}
		table := n.Relation
		if p, ok := j.parents[table]; ok {
			table = p
		}
		switch {
		case referenceTables[table]:
			if n.NodeType == "ModifyTable" {
				out = append(out, fmt.Sprintf("  it writes %s, a reference table: every node's copy", n.Relation))
			}
		case !coLocated[table]:
			out = append(out, fmt.Sprintf("  it reads or writes %s, which is not co-located on operation_key", n.Relation))
		case n.NodeType == "ModifyTable":
			// An update's or a delete's rows come from scans judged on
			// their own; an insert's key comes from its source.
			if n.Operation != "Insert" {
				return
			}
			if key := insertedKey(n, j.keyColumn[table]); !keyValue(key, "", given) {
				out = append(out, fmt.Sprintf("  it inserts into %s an operation_key of %q", n.Relation, key))
			}
		case n.NodeType == "Seq Scan":
			out = append(out, fmt.Sprintf("  Seq Scan on %s", n.Relation))
		default:
			conds := []string{n.IndexCond, n.RecheckCond, n.Filter, n.TIDCond}
			indexes := []string{n.IndexName}
			if n.NodeType == "Bitmap Heap Scan" {
				for _, c := range n.Plans {
					if c.Parent == "Outer" {
						conds, indexes = bitmapConds(&c, conds, indexes)
					}
				}
			}
			if !keyedScan(n.Alias, conds, given) {
				have := strings.Join(nonEmpty(conds), "; ")
				if have == "" {
					have = "none"
				}
				out = append(out, fmt.Sprintf("  %s on %s (%s) pins operation_key to no key it was given; its conditions: %s",
					n.NodeType, n.Relation, strings.Join(nonEmpty(indexes), ", "), have))
			}
		}
	})
	return out
}

// bitmapConds adds the index conditions of a bitmap heap scan's bitmap to
// conds: those of its bitmap index scans, through BitmapAnd; not those
// under a BitmapOr, whose rows any one arm may find.
func bitmapConds(n *planNode, conds, indexes []string) ([]string, []string) {
	switch n.NodeType {
	case "Bitmap Index Scan":
		return append(conds, n.IndexCond), append(indexes, n.IndexName)
	case "BitmapAnd":
		for i := range n.Plans {
			conds, indexes = bitmapConds(&n.Plans[i], conds, indexes)
		}
	}
	return conds, indexes
}

// insertedKey is the expression an insert writes into operation_key: its
// source's output column at the column's position.
func insertedKey(n *planNode, col int) string {
	for _, c := range n.Plans {
		if c.Parent == "Outer" && col < len(c.Output) {
			return c.Output[col]
		}
	}
	return ""
}

var (
	casts = regexp.MustCompile(`::[a-z ]+(\[\])?`)
	// equality matches a = b and a = ANY (b) once casts and parentheses
	// are gone.
	equality = regexp.MustCompile(`([\w.$]+) = (?:ANY )?([\w.$]+)`)
	param    = regexp.MustCompile(`^\$[0-9]+$`)
)

// normalize strips casts and parentheses from a plan's expression.
func normalize(s string) string {
	return strings.NewReplacer("(", "", ")", "").Replace(casts.ReplaceAllString(s, ""))
}

// keyedScan reports whether one of conds pins the scanned rows'
// operation_key to given keys: an equality, outside any OR, of the node's
// operation_key (alias.operation_key) to a key value.
func keyedScan(alias string, conds []string, given map[string]bool) bool {
	for _, c := range conds {
		if c == "" || strings.Contains(c, " OR ") {
			continue
		}
		for _, m := range equality.FindAllStringSubmatch(normalize(c), -1) {
			if own(m[1], alias) && keyValue(m[2], alias, given) || own(m[2], alias) && keyValue(m[1], alias, given) {
				return true
			}
		}
	}
	return false
}

// own reports whether expr is the scanned node's operation_key.
func own(expr, alias string) bool { return expr == "operation_key" || expr == alias+".operation_key" }

// keyValue reports whether expr is a key the statement was given: a
// parameter, the operation_key of another (co-located) row, or a column of
// what it unnests from its parameters.
func keyValue(expr, alias string, given map[string]bool) bool {
	expr = normalize(expr)
	if param.MatchString(expr) {
		return true
	}
	rel, col, ok := strings.Cut(expr, ".")
	if !ok {
		return false
	}
	return col == "operation_key" && rel != alias || given[rel]
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// TestPlanJudge checks the judge of TestStatementsAreDistributable on
// statements written to pass or fail it, so that its passing says
// something.
func TestPlanJudge(t *testing.T) {
	t.Parallel()
	j := newPlanJudge(t)
	keyed := []string{
		`SELECT record FROM operations WHERE operation_key = $1`,
		`SELECT record FROM operations WHERE operation_key = ANY($1) AND pruned_at IS NULL`,
		`SELECT e.envelope FROM unnest($1::text[]) AS k(key) JOIN events e ON e.operation_key = k.key`,
		`SELECT o.record FROM operations o JOIN events e ON e.operation_key = o.operation_key WHERE o.operation_key = $1`,
		`INSERT INTO outbox (operation_key, seq, topic) VALUES ($1, $2, $3)`,
		`INSERT INTO outbox (operation_key, seq, topic) SELECT k, 1, 't' FROM unnest($1::text[]) AS u(k)`,
		`UPDATE operation_state SET status = $2 WHERE operation_key = $1`,
		`DELETE FROM outbox WHERE operation_key = ANY($2::text[]) AND id = ANY($1::bigint[])`,
		`SELECT slot FROM outbox_slot`,
	}
	// Each with a part of the problem it must be judged to have.
	unkeyed := []struct{ sql, want string }{
		{`SELECT count(*) FROM operations`, "on operations"},
		{`SELECT record FROM operations WHERE operation_key = $1 OR tool = $2`, "on operations"},
		{`SELECT record FROM operations WHERE operation_key > $1`, "pins operation_key to no key"},
		{`SELECT record FROM operations WHERE record->>'downstream_id' = $1`, "operations_downstream_id"},
		{`SELECT e.envelope FROM outbox_1 b JOIN events e ON e.operation_key = b.operation_key`, "on outbox_1"},
		// A key read from a table of another colocation group is not given.
		{`SELECT o.record FROM workflows w JOIN operations o ON o.operation_key = w.awaiting WHERE w.workflow_id = $1`, "on operations"},
		{`INSERT INTO outbox (operation_key, seq, topic) SELECT w.awaiting, 1, 't' FROM workflows w WHERE w.workflow_id = $1`, "inserts into outbox"},
		{`UPDATE outbox_slot SET slot = 1`, "reference table"},
		{`TRUNCATE outbox_0`, "utility statement"},
	}
	for _, sql := range keyed {
		if p := j.problems(sql); len(p) > 0 {
			t.Errorf("%s: judged unkeyed:\n%s", sql, strings.Join(p, "\n"))
		}
	}
	for _, c := range unkeyed {
		if p := strings.Join(j.problems(c.sql), "\n"); !strings.Contains(p, c.want) {
			t.Errorf("%s: judged %q, want a problem with %q", c.sql, p, c.want)
		}
	}
}
