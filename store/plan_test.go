package store

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/internal/testenv"
)

// TestHotStatementsProbeByKey reads the generic plans of the relay's claim
// on a freshly migrated database: each claimed row reads its event through
// the journal's key index, never by a join over the journal (see
// claimOutboxSQL). With no statistics and default settings the probe is
// a bitmap scan; TestTheRelayReadsEventsByIndexWithoutStatistics has the
// relay's settings.
func TestHotStatementsProbeByKey(t *testing.T) {
	t.Parallel()
	url, _ := migrated(t)
	plan := testenv.GenericPlan(t, url, claimOutboxSQL)
	for _, bad := range []string{"Seq Scan on events", "Hash Join", "Materialize"} {
		if strings.Contains(plan, bad) {
			t.Errorf("the generic plan of claimOutboxSQL has %q:\n%s", bad, plan)
		}
	}
	if !strings.Contains(plan, "events_operation_key") {
		t.Errorf("the generic plan of claimOutboxSQL does not probe events_operation_key:\n%s", plan)
	}
}

// TestTheRebuildPagesTheJournalByIndex reads the generic plan of the
// rebuild's page of the journal on a journal of 30,000 events: it starts
// in the key index where the last page ended and reads it in order,
// sorting only each operation's few events by seq (an Incremental Sort).
// A Seq Scan and a full Sort would read the whole journal for every page.
func TestTheRebuildPagesTheJournalByIndex(t *testing.T) {
	t.Parallel()
	url := analyzedJournal(t)
	plan := testenv.GenericPlan(t, url, journalPageSQL)
	if !strings.Contains(plan, "Index Scan using events_operation_key") {
		t.Errorf("the journal's page does not read events_operation_key:\n%s", plan)
	}
	for _, line := range strings.Split(plan, "\n") {
		if node := strings.TrimLeft(line, " ->"); strings.HasPrefix(node, "Seq Scan") || node == "Sort" {
			t.Errorf("the journal's page reads the whole journal (%s):\n%s", node, plan)
		}
	}
}

// TestTheRelayReadsEventsByIndexWithoutStatistics: each row the relay
// claims reads its event by key. On a journal never analyzed PostgreSQL
// guesses 0.5 % of the table per key and plans a bitmap scan of them;
// under relayPlanningSQL, which the relay's transaction sets first, the
// claim reads the key index directly.
func TestTheRelayReadsEventsByIndexWithoutStatistics(t *testing.T) {
	t.Parallel()
	db := newSession(t)
	db.exec(journalOf10000Operations)
	db.exec(`INSERT INTO outbox (operation_key, seq, topic) SELECT 'op-' || i, 1, 'effectline.intents' FROM generate_series(1, 100) i`)
	db.exec(`PREPARE claim(int) AS ` + claimOutboxSQL)
	if p := db.explain(`EXECUTE claim(500)`); !strings.Contains(p, "Bitmap Heap Scan on events") {
		t.Fatalf("without statistics and the relay's settings the claim does not bitmap-scan the journal, so this test shows nothing:\n%s", p)
	}
	db.exec(`BEGIN`)
	db.exec(relayPlanningSQL)
	p := db.explain(`EXECUTE claim(500)`)
	db.exec(`ROLLBACK`)
	if !strings.Contains(p, "Index Scan using events_operation_key on events") || strings.Contains(p, "Bitmap Heap Scan") {
		t.Errorf("under relayPlanningSQL the claim does not read its events through events_operation_key:\n%s", p)
	}
}

// TestTheIntentProbeReadsTheIndexWithoutStatistics: the executor's append
// after an intent probes the journal for the intent's event. In a batch
// that starts with intentProbePlanningSQL it reads the key index directly,
// even on a journal never analyzed (where PostgreSQL guesses 0.5 % of the
// table per key and plans a bitmap scan), and the setting ends with the
// batch's transaction, leaving the connection as it was.
func TestTheIntentProbeReadsTheIndexWithoutStatistics(t *testing.T) {
	t.Parallel()
	_, pool := migrated(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, journalOf10000Operations); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const probe = `EXPLAIN (COSTS OFF) SELECT EXISTS (SELECT 1 FROM events i WHERE i.operation_key = 'op-7' AND i.seq = 1 AND i.event_id = '')`
	plan := func(b *pgx.Batch) string {
		t.Helper()
		b.Queue(probe)
		b.Queue(`SELECT 1`) // a statement after the plan, as an append batch has
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		for range b.Len() - 2 {
			if _, err := br.Exec(); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := br.Query()
		return testenv.PlanText(t, rows, err)
	}
	if p := plan(&pgx.Batch{}); !strings.Contains(p, "Bitmap Heap Scan on events") {
		t.Fatalf("without statistics and the setting the probe is not a bitmap scan, so this test shows nothing:\n%s", p)
	}
	var b pgx.Batch
	b.Queue(intentProbePlanningSQL)
	if p := plan(&b); !strings.Contains(p, "Index Scan using events_operation_key on events") {
		t.Errorf("after intentProbePlanningSQL the probe does not read events_operation_key:\n%s", p)
	}
	var setting string
	if err := conn.QueryRow(ctx, `SHOW enable_bitmapscan`).Scan(&setting); err != nil || setting != "on" {
		t.Errorf("after the batch enable_bitmapscan is %q (%v), want on: the setting outlived its transaction", setting, err)
	}
}

// analyzedJournal is a migrated database whose journal holds 30,000
// events of 10,000 operations, analyzed.
func analyzedJournal(t *testing.T) string {
	t.Helper()
	url, pool := migrated(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, journalOf10000Operations); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE events`); err != nil {
		t.Fatal(err)
	}
	return url
}

// TestTheCallbackLookupReadsTheDownstreamIndex: a callback that names only
// the downstream's id finds its operations through the index of ids
// (migration 0017; the tool is checked on the rows found) and the old
// expression index, never by reading the head table.
func TestTheCallbackLookupReadsTheDownstreamIndex(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t)
	ctx := t.Context()
	for _, sql := range []string{
		`INSERT INTO operations (operation_key, tool, effect_class, payload_hash, status, seq, body, downstream_id, created_at, updated_at)
		 SELECT 'op-' || i, 'tool-' || (i % 20), 'irreversible', '', 'completed', 3, '\x00', 'ch_' || i, now(), now()
		   FROM generate_series(1, 20000) i`,
		`ANALYZE operations`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	plan := testenv.GenericPlan(t, url, byDownstreamIDSQL)
	if !strings.Contains(plan, "operations_by_downstream_id") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("the callback lookup does not read operations_by_downstream_id:\n%s", plan)
	}
}

// TestTheRelayPlansWithThePartitionsItFinds: a VACUUM of the empty outbox
// partitions records zero rows, and a generic plan of the claim made then,
// by cost, scans a partition for every claimed row's order guard; it still
// does once the partition holds thousands of rows, as a connection keeps
// it. The relay's claim and delete, planned under relayPlanningSQL at
// the same moment and kept as the relay keeps them, read every table by
// index once the partition has filled.
func TestTheRelayPlansWithThePartitionsItFinds(t *testing.T) {
	t.Parallel()
	db := newSession(t)
	db.exec(`VACUUM outbox_0, outbox_1, outbox_2`)
	db.exec(`SET plan_cache_mode = force_generic_plan`)
	db.exec(`PREPARE claim(int) AS ` + claimOutboxSQL)
	db.exec(`EXPLAIN EXECUTE claim(500)`) // the generic plan, made while the partitions are empty
	// The relay's statements, first planned in a relay's transaction while
	// the partitions are empty.
	db.exec(`PREPARE relay_claim(int) AS ` + claimOutboxSQL)
	db.exec(`PREPARE relay_delete(bigint[], text[]) AS ` + deleteOutboxSQL)
	inRelayTx := func(sql string) string {
		db.exec(`BEGIN`)
		db.exec(relayPlanningSQL)
		defer db.exec(`ROLLBACK`)
		return db.explain(sql)
	}
	inRelayTx(`EXECUTE relay_claim(500)`)
	inRelayTx(`EXECUTE relay_delete('{1,2}', '{op-1,op-2}')`)

	db.exec(`INSERT INTO outbox (operation_key, seq, topic) SELECT 'op-' || i, 1, 'effectline.intents' FROM generate_series(1, 20000) i`)
	var slot int
	if err := db.conn.QueryRow(db.t.Context(), `SELECT outbox_current_slot()`).Scan(&slot); err != nil {
		t.Fatal(err)
	}
	full := "Seq Scan on " + outboxPartition(slot) + " "
	if p := db.explain(`EXECUTE claim(500)`); !strings.Contains(p, full) {
		t.Fatalf("the cached generic plan does not scan the partition that filled, so this test shows nothing:\n%s", p)
	}
	for _, stmt := range []string{`EXECUTE relay_claim(500)`, `EXECUTE relay_delete('{1,2}', '{op-1,op-2}')`} {
		p := inRelayTx(stmt)
		for _, line := range strings.Split(p, "\n") {
			if node := strings.TrimLeft(line, " ->"); strings.HasPrefix(node, "Seq Scan") || strings.HasPrefix(node, "Bitmap") {
				t.Errorf("%s, planned under relayPlanningSQL while the partitions were empty, reads a table without its index (%s):\n%s", stmt, node, p)
			}
		}
	}
}

// session is one connection to a migrated database, for a test whose
// settings and prepared statements must stay in one session.
type session struct {
	t    *testing.T
	conn *pgxpool.Conn
}

func newSession(t *testing.T) *session {
	t.Helper()
	_, pool := migrated(t)
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return &session{t: t, conn: conn}
}

func (s *session) exec(sql string) {
	s.t.Helper()
	if _, err := s.conn.Exec(s.t.Context(), sql); err != nil {
		s.t.Fatal(err)
	}
}

// explain returns the plan of sql, EXPLAIN (COSTS OFF), one node a line.
func (s *session) explain(sql string) string {
	s.t.Helper()
	return testenv.Explain(s.t, s.conn, sql)
}

// journalOf10000Operations journals three events for each of 10,000
// operations, op-0 to op-9999.
const journalOf10000Operations = `INSERT INTO events (operation_key, seq, event_id, type, envelope, occurred_at)
	SELECT 'op-' || (i / 3), i % 3 + 1, '', '', '\x00', now() FROM generate_series(0, 29999) i`

// migrated returns a new database with every migration applied, and a
// pool on it.
func migrated(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.NewDatabase(t)
	pool := testenv.NewPool(t, url)
	if _, err := Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return url, pool
}
