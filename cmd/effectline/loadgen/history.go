package loadgen

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

// History: `bench -history N` measures a run against a database that
// already holds N settled operations, the state a deployment reaches after
// weeks of traffic inside the tools' dedup windows, without spending hours
// of real traffic to get there (5 million operations at 500/s is 2.8 h).
//
// The history is copied from operations the pipeline really ran (the
// warm-up's), so every row has the shape, the sizes and the JSON that
// real traffic leaves: the head row in operations, each event in events,
// the read-model row in operation_state. Each copy gets a key of its own
// (a hash, so the keys land all over the primary keys' B-trees as random
// agent keys do, not appended in order), a downstream id of its own (the
// downstream-id index sees distinct values, as it would), fresh event ids,
// and timestamps spread over the past at the given rate, older than any
// run. The copies are settled and have no outbox rows, no due time and no
// lease, so no component has work for them; they are what every index,
// every plan and every cache has to live with.
//
// After the copy, the tables are vacuumed and analyzed and a checkpoint is
// taken: a production server's autovacuum does both to insert-only tables
// (PostgreSQL 13 on), and the checkpoint keeps the seeding's WAL from
// being written out during the measured run. The shared CI server runs
// with autovacuum off, so without this the run would measure a state no
// production server is in.

// historyBatch is how many operations one seeding transaction copies: big
// enough that the statements' overhead vanishes, small enough that
// progress shows and a transaction stays a few seconds long.
const historyBatch = 50_000

// historyTemplatesSQL numbers the settled operations the copies are made
// of.
const historyTemplatesSQL = `
CREATE TEMPORARY TABLE history_template ON COMMIT PRESERVE ROWS AS
SELECT (row_number() OVER (ORDER BY operation_key) - 1)::bigint AS idx,
       operation_key AS src, coalesce(downstream_id, record->>'downstream_id') AS did
  FROM operations
 WHERE starts_with(operation_key, $1) AND status IN ('completed', 'failed', 'compensated')`

// historyCopiesSQL names copies $1 … $2-1: copy i is made of template
// i mod $6 and dated $3 - ($4 - i) × $5, so the last copy is the newest and
// still older than $3.
const historyCopiesSQL = `
CREATE TEMPORARY TABLE history_copy ON COMMIT DROP AS
SELECT t.src, t.did, 'history/' || md5(i::text) AS key, 'hist_' || i AS newdid,
       $3::timestamptz - ($4::bigint - i) * $5::interval AS at
  FROM generate_series($1::bigint, $2::bigint - 1) i
  JOIN history_template t ON t.idx = i % $6`

// historyRewrite replaces, in a JSON text x, the template's key with the
// copy's and its downstream id (when it has one) with the copy's. Both
// appear in JSON only as whole quoted strings.
func historyRewrite(x string) string {
	return `replace(CASE WHEN c.did IS NULL OR c.did = '' THEN ` + x +
		` ELSE replace(` + x + `, '"' || c.did || '"', '"' || c.newdid || '"') END, '"' || c.src || '"', '"' || c.key || '"')`
}

var historyCopySQL = []string{
	// A template written compact has its record packed in body, which
	// historyRows rewrote in Go; one written plain has it in record.
	`INSERT INTO operations (operation_key, tool, effect_class, payload_hash, status, seq, record, body, principal, downstream_id,
       created_at, updated_at)
SELECT c.key, o.tool, o.effect_class, o.payload_hash, o.status, o.seq,
       CASE WHEN o.record IS NULL THEN NULL ELSE ` + historyRewrite(`o.record::text`) + `::jsonb END, h.body, o.principal,
       CASE WHEN o.downstream_id IS NULL THEN NULL ELSE c.newdid END,
       c.at, c.at + (o.updated_at - o.created_at)
  FROM history_copy c JOIN operations o ON o.operation_key = c.src
  LEFT JOIN history_head h ON h.operation_key = c.key`,
	// The envelopes are rewritten in Go (historyRows): the journal
	// stores them packed, which SQL cannot rewrite.
	`INSERT INTO events (operation_key, seq, event_id, type, envelope, traceparent, occurred_at)
SELECT c.key, e.seq, h.event_id, e.type, h.envelope, e.traceparent, c.at + (e.occurred_at - o.created_at)
  FROM history_copy c JOIN operations o ON o.operation_key = c.src
  JOIN events e ON e.operation_key = c.src
  JOIN history_envelope h ON h.operation_key = c.key AND h.seq = e.seq`,
	`INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
       result, downstream_id, undo_ref, last_error_class, compensations, evidence, escalation, last_seq, record, body,
       created_at, updated_at, projected_at)
SELECT c.key, s.tool, s.effect_class, s.payload_hash, s.principal, s.status, s.phase, s.attempt,
       ` + historyRewrite(`s.result::text`) + `::jsonb, CASE WHEN s.downstream_id = '' THEN '' ELSE c.newdid END,
       s.undo_ref, s.last_error_class, s.compensations, s.evidence, s.escalation, s.last_seq,
       CASE WHEN s.record IS NULL THEN NULL ELSE ` + historyRewrite(`s.record::text`) + `::jsonb END, h.state,
       c.at, c.at + (s.updated_at - s.created_at), c.at + (s.projected_at - s.created_at)
  FROM history_copy c JOIN operation_state s ON s.operation_key = c.src
  LEFT JOIN history_head h ON h.operation_key = c.key`,
}

// historyTables are the tables the history fills, vacuumed after it.
var historyTables = []string{"operations", "events", "operation_state"}

// analyzeWarmup gives the tables the warm-up filled their first
// statistics, as a production server's autovacuum does once 50 rows of a
// new table changed (within its first minute): the measured run then plans
// as production would. Without them PostgreSQL guesses that an equality
// matches 0.5 % of a table, and the journal's lookups of one operation's
// events (its index is not unique, migration 0016) would be planned as
// bitmap scans for as long as the CI server, whose autovacuum is off,
// never analyzes. -history analyzes anyway (seedHistory).
func analyzeWarmup(ctx context.Context, pool *pgxpool.Pool) error {
	for _, t := range historyTables {
		if _, err := pool.Exec(ctx, "ANALYZE "+t); err != nil {
			return fmt.Errorf("bench: analyzing %s after the warm-up: %w", t, err)
		}
	}
	return nil
}

// seedHistory copies the settled operations whose keys start with prefix
// into n operations of history, dated back at rate per second before now,
// then vacuums, analyzes and checkpoints; it shows its progress on
// progressTo and reports what it did to out.
func seedHistory(ctx context.Context, pool *pgxpool.Pool, prefix string, n, rate int, progressTo, out io.Writer) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("seeding history: %w", err)
	}
	defer conn.Release()
	// The temporary table lives on this connection only; drop it before
	// the connection goes back to the pool.
	defer conn.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS history_template`)
	tag, err := conn.Exec(ctx, historyTemplatesSQL, prefix)
	if err != nil {
		return fmt.Errorf("seeding history: numbering the templates: %w", err)
	}
	templates := tag.RowsAffected()
	if templates == 0 {
		return fmt.Errorf("seeding history: no settled operation under %q to copy", prefix)
	}
	now := time.Now()
	step := time.Second / time.Duration(max(rate, 1))
	start := time.Now()
	var journals []historyTemplate
	for lo := 0; lo < n; lo += historyBatch {
		hi := min(lo+historyBatch, n)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("seeding history: %w", err)
		}
		if _, err := tx.Exec(ctx, historyCopiesSQL, lo, hi, now, n, step, templates); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("seeding history: naming copies %d-%d: %w", lo, hi, err)
		}
		if journals == nil {
			if journals, err = loadHistoryTemplates(ctx, tx, templates); err != nil {
				tx.Rollback(ctx)
				return fmt.Errorf("seeding history: reading the templates' journals: %w", err)
			}
		}
		if err := historyRows(ctx, tx, journals, lo, hi); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("seeding history: writing the packed rows of %d-%d: %w", lo, hi, err)
		}
		for _, q := range historyCopySQL {
			if _, err := tx.Exec(ctx, q); err != nil {
				tx.Rollback(ctx)
				return fmt.Errorf("seeding history: copying %d-%d: %w", lo, hi, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("seeding history: %w", err)
		}
		progress(progressTo, hi, n, time.Since(start))
	}
	fmt.Fprintln(progressTo)
	copied := time.Since(start)
	start = time.Now()
	for _, t := range historyTables {
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			return fmt.Errorf("seeding history: vacuuming %s: %w", t, err)
		}
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("seeding history: checkpoint: %w", err)
	}
	fmt.Fprintf(out, "history: %d settled operations copied from %d the warm-up ran in %.1fs (%.0f/s), vacuumed, analyzed and checkpointed in %.1fs\n",
		n, templates, copied.Seconds(), float64(n)/copied.Seconds(), time.Since(start).Seconds())
	return nil
}

// printHistorySizes prints the tables' sizes after seeding and the disk
// each retained operation takes, which the warm-up's operations share.
func printHistorySizes(ctx context.Context, a *app.App, history, warmup int, out io.Writer) error {
	sizes, err := tableSizes(ctx, a)
	if err != nil {
		return fmt.Errorf("bench: reading table sizes: %w", err)
	}
	var total int64
	fmt.Fprint(out, "history: tables")
	for _, t := range historyTables {
		s := sizes[t]
		total += s.total
		fmt.Fprintf(out, " %s %.0f MB (idx %.0f MB)", t, mb(s.total), mb(s.indexes))
	}
	fmt.Fprintf(out, "; %.0f bytes per retained operation\n", float64(total)/float64(history+warmup))
	return nil
}

// historySamples is how many copies checkHistory folds.
const historySamples = 25

// checkHistory proves the copies are operations the components could have
// written: for copies spread over the history, the fold of the journaled
// events equals the head record, and the read-model record is what the
// projector stores for that fold. A rewrite that missed a key, an event id or
// a downstream id shows here.
func checkHistory(ctx context.Context, a *app.App, n int) error {
	for i := 0; i < historySamples; i++ {
		var key string
		idx := int64(i) * int64(n-1) / (historySamples - 1)
		if err := a.Pool.QueryRow(ctx, `SELECT 'history/' || md5($1::bigint::text)`, idx).Scan(&key); err != nil {
			return fmt.Errorf("bench: checking history: %w", err)
		}
		op, err := a.Store.Replay(ctx, key)
		if err != nil {
			return fmt.Errorf("bench: checking history: %w", err)
		}
		head, err := events.MarshalOperationBody(op)
		if err != nil {
			return err
		}
		read, err := projector.StoredRecord(op)
		if err != nil {
			return err
		}
		var (
			body, stateBody       []byte
			sameRecord, sameState *bool
			distinct              bool
		)
		err = a.Pool.QueryRow(ctx, `
SELECT o.body, s.body, o.record = $2::jsonb, s.record = $3::jsonb,
       (SELECT count(*) FROM operations d WHERE d.tool = o.tool AND (d.downstream_id = i.did OR d.record->>'downstream_id' = i.did)) = 1
  FROM operations o JOIN operation_state s USING (operation_key),
       LATERAL (SELECT coalesce(o.downstream_id, o.record->>'downstream_id') AS did) i
 WHERE o.operation_key = $1`, key, string(head), string(read)).Scan(&body, &stateBody, &sameRecord, &sameState, &distinct)
		if err != nil {
			return fmt.Errorf("bench: checking history copy %s: %w", key, err)
		}
		// A row holds its record packed in body (compared as the bytes the
		// store wrote) or as jsonb in record (compared by SQL).
		matches := func(body []byte, sameRecord *bool, want []byte) (bool, error) {
			if body == nil {
				return sameRecord != nil && *sameRecord, nil
			}
			unpacked, err := packed.Unpack(body, key)
			return string(unpacked) == string(want), err
		}
		same, err := matches(body, sameRecord, head)
		if err != nil {
			return fmt.Errorf("bench: checking history copy %s: %w", key, err)
		}
		sameRead, err := matches(stateBody, sameState, read)
		if err != nil {
			return fmt.Errorf("bench: checking history copy %s: %w", key, err)
		}
		if !same || !sameRead || !distinct {
			return fmt.Errorf("bench: history copy %s is not what the components would have written (head record is the fold: %t, read model: %t, downstream id its own: %t)",
				key, same, sameRead, distinct)
		}
	}
	return nil
}

// historyTemplate is a template operation's journal, its envelopes
// unpacked, for historyRows to rewrite.
type historyTemplate struct {
	src, did string
	events   []historyTemplateEvent
	// body and state are the head's record and the read model's,
	// unpacked, if the template's rows are compact (operations.body,
	// operation_state.body); "" if they are plain.
	body, state string
}

type historyTemplateEvent struct {
	seq      int64
	id, json string
}

// loadHistoryTemplates reads the journal of every template, and its head's
// packed record if it has one, indexed as history_template numbers them.
func loadHistoryTemplates(ctx context.Context, q pgx.Tx, count int64) ([]historyTemplate, error) {
	rows, err := q.Query(ctx, `SELECT t.idx, t.src, coalesce(t.did, ''), e.seq, e.envelope
  FROM history_template t JOIN events e ON e.operation_key = t.src ORDER BY t.idx, e.seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]historyTemplate, count)
	for rows.Next() {
		var (
			idx      int64
			src, did string
			seq      int64
			stored   []byte
		)
		if err := rows.Scan(&idx, &src, &did, &seq, &stored); err != nil {
			return nil, err
		}
		raw, err := packed.Unpack(stored, src)
		if err != nil {
			return nil, fmt.Errorf("template %s seq %d: %w", src, seq, err)
		}
		// The journal keeps only the intent's id in a column; every id is
		// in its envelope.
		env, err := events.Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("template %s seq %d: %w", src, seq, err)
		}
		t := &out[idx]
		t.src, t.did = src, did
		t.events = append(t.events, historyTemplateEvent{seq: seq, id: env.EventID, json: string(raw)})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, `SELECT t.idx, o.body, s.body FROM history_template t JOIN operations o ON o.operation_key = t.src
  JOIN operation_state s ON s.operation_key = t.src`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			idx         int64
			head, state []byte
		)
		if err := rows.Scan(&idx, &head, &state); err != nil {
			return nil, err
		}
		t := &out[idx]
		if t.body, err = unpackedOrEmpty(head, t.src); err != nil {
			return nil, fmt.Errorf("template %s: %w", t.src, err)
		}
		if t.state, err = unpackedOrEmpty(state, t.src); err != nil {
			return nil, fmt.Errorf("template %s: %w", t.src, err)
		}
	}
	return out, rows.Err()
}

// unpackedOrEmpty is the JSON a packed body of the row of key holds, or ""
// for a row without one.
func unpackedOrEmpty(body []byte, key string) (string, error) {
	if body == nil {
		return "", nil
	}
	json, err := packed.Unpack(body, key)
	return string(json), err
}

// historyRows writes the rows of copies lo … hi-1 that SQL cannot rewrite,
// because the store keeps them packed: into history_envelope their
// envelopes, and into history_head the head's record and the read model's
// of templates written compact. Each is the template's, with the copy's key, downstream id and
// (an envelope) a fresh event id in place of the template's (each appears
// in JSON only as a whole quoted string), stored as this process stores
// them. The copies are named as historyCopiesSQL names them.
func historyRows(ctx context.Context, tx pgx.Tx, templates []historyTemplate, lo, hi int) error {
	if _, err := tx.Exec(ctx, `CREATE TEMPORARY TABLE history_envelope
  (operation_key text, seq bigint, event_id text, envelope bytea) ON COMMIT DROP;
CREATE TEMPORARY TABLE history_head (operation_key text, body bytea, state bytea) ON COMMIT DROP`); err != nil {
		return err
	}
	var envs, heads [][]any
	for i := lo; i < hi; i++ {
		t := templates[i%len(templates)]
		sum := md5.Sum([]byte(strconv.Itoa(i)))
		key := "history/" + hex.EncodeToString(sum[:])
		rewrite := func(json string) string {
			if t.did != "" {
				json = strings.ReplaceAll(json, `"`+t.did+`"`, `"hist_`+strconv.Itoa(i)+`"`)
			}
			return strings.ReplaceAll(json, `"`+t.src+`"`, `"`+key+`"`)
		}
		for _, e := range t.events {
			id := events.NewID()
			env := strings.ReplaceAll(rewrite(e.json), `"`+e.id+`"`, `"`+id+`"`)
			envs = append(envs, []any{key, e.seq, store.EventIDColumn(e.seq, id), store.StoredEnvelope([]byte(env), key)})
		}
		if t.body != "" || t.state != "" {
			var body, state []byte
			if t.body != "" {
				body = packed.Pack([]byte(rewrite(t.body)), key)
			}
			if t.state != "" {
				state = packed.Pack([]byte(rewrite(t.state)), key)
			}
			heads = append(heads, []any{key, body, state})
		}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"history_envelope"}, []string{"operation_key", "seq", "event_id", "envelope"}, pgx.CopyFromRows(envs)); err != nil {
		return err
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"history_head"}, []string{"operation_key", "body", "state"}, pgx.CopyFromRows(heads))
	return err
}
