package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// This file holds every statement that writes workflow_state and the one
// mapping from a run's record to a row. The live projection and Rebuild
// both go through upsertWorkflowsSQL and workflowRowsOf, and both fold with
// events.ApplyWorkflow, the function the workflow component computes each
// transition's head with: a row at seq N is the run's head at seq N.

// WorkflowJournal reads the workflow journal (workflow_events, which the
// workflow component writes and owns); *workflow.Journal is one. The
// projector fills gaps of the workflows topic from it and rebuilds
// workflow_state from it.
type WorkflowJournal interface {
	// WorkflowEvents returns the events of run id after afterSeq, in seq
	// order.
	WorkflowEvents(ctx context.Context, id string, afterSeq int64) ([]events.JournaledWorkflowEvent, error)
	// WorkflowJournalTx streams every journaled workflow event inside tx,
	// in (workflow_id, seq) order, pageSize per query.
	WorkflowJournalTx(ctx context.Context, tx pgx.Tx, pageSize int) iter.Seq2[events.JournaledWorkflowEvent, error]
}

// workflowEvent is a delivered workflow event and the trace context it
// came with (its traceparent header, or the journal's).
type workflowEvent struct {
	env   events.WorkflowEnvelope
	trace string
}

// workflowRow is a run's record and the trace it was started in: what a
// row of workflow_state holds.
type workflowRow struct {
	rec   events.Workflow
	trace string
}

// workflowStream is the workflow runs' stream for the batcher.
type workflowStream struct {
	wj WorkflowJournal
}

func (workflowStream) eventKey(e workflowEvent) string     { return e.env.WorkflowID }
func (workflowStream) eventSeq(e workflowEvent) int64      { return e.env.Seq }
func (workflowStream) eventTime(e workflowEvent) time.Time { return e.env.OccurredAt }
func (workflowStream) recordSeq(r workflowRow) int64       { return r.rec.Seq }

// complete: the first event sets the row's trace; delivered without one
// (the publisher's process propagates no trace context), it is read from
// the journal, which always holds it, so the row is the one Rebuild writes.
func (workflowStream) complete(e workflowEvent) bool { return e.env.Seq != 1 || e.trace != "" }

func (workflowStream) apply(r workflowRow, e workflowEvent) (workflowRow, error) {
	next, err := events.ApplyWorkflow(r.rec, e.env)
	if err != nil {
		return r, err
	}
	trace := r.trace
	if e.env.Seq == 1 {
		trace = e.trace
	}
	return workflowRow{rec: next, trace: trace}, nil
}

func (workflowStream) load(ctx context.Context, pool *pgxpool.Pool, ids []string) (map[string]workflowRow, error) {
	rs, err := pool.Query(ctx, `SELECT record, traceparent FROM workflow_state WHERE workflow_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("loading %d workflow states: %w", len(ids), store.InterpretError(err))
	}
	rows, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (workflowRow, error) {
		var (
			raw []byte
			r   workflowRow
		)
		if err := row.Scan(&raw, &r.trace); err != nil {
			return workflowRow{}, err
		}
		if err := json.Unmarshal(raw, &r.rec); err != nil {
			return workflowRow{}, fmt.Errorf("decoding a stored workflow state: %w", err)
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading %d workflow states: %w", len(ids), store.InterpretError(err))
	}
	out := make(map[string]workflowRow, len(rows))
	for _, r := range rows {
		out[r.rec.WorkflowID] = r
	}
	return out, nil
}

func (workflowStream) write(ctx context.Context, pool *pgxpool.Pool, recs []workflowRow) ([]string, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	// In key order, so two statements that meet on the same new ids wait
	// for each other instead of deadlocking.
	slices.SortFunc(recs, func(a, c workflowRow) int { return strings.Compare(a.rec.WorkflowID, c.rec.WorkflowID) })
	args, err := workflowRowsOf(recs)
	if err != nil {
		return nil, err
	}
	rs, err := pool.Query(ctx, upsertWorkflowsSQL+` RETURNING workflow_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("writing %d workflow states: %w", len(recs), store.InterpretError(err))
	}
	written, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("writing %d workflow states: %w", len(recs), store.InterpretError(err))
	}
	return written, nil
}

func (s workflowStream) journal(ctx context.Context, id string, afterSeq int64) ([]workflowEvent, error) {
	stored, err := s.wj.WorkflowEvents(ctx, id, afterSeq)
	if err != nil {
		return nil, err
	}
	out := make([]workflowEvent, len(stored))
	for i, e := range stored {
		out[i] = workflowEvent{env: e.WorkflowEnvelope, trace: e.Traceparent}
	}
	return out, nil
}

// upsertWorkflowsSQL writes rows given as parallel arrays, one statement
// per batch. As in upsertSQL, the WHERE clause is the idempotence guard: a
// row is only ever replaced by one with a higher seq, so a redelivered or
// late event, a replica that lost its partition, or a projector behind a
// rebuild cannot move a row back. The join on the run's head row keeps a
// pruned run pruned: the workflows topic may still hold its events after
// its retention (a replay from offset 0, a group reset), and without the
// guard they would bring back a row that nothing would ever prune again.
// A row it skips counts as not written, like a stale one.
//
// The head row is locked FOR KEY SHARE, not merely tested with NOT EXISTS
// as upsertSQL does for operations. A NOT EXISTS reads the statement's
// snapshot: a prune that commits after it (tombstone written, state row
// deleted) lets the insert find no conflicting row any more, and the run's
// row comes back; a live projector a moment behind the driver meets this
// whenever a run is pruned as soon as it settles. The lock conflicts only
// with the prune's FOR UPDATE (the driver and the journal's writes take
// FOR NO KEY UPDATE), so either the prune skips the run this round or the
// upsert waits for the prune and, reading the head row again under its
// lock (READ COMMITTED's recheck), finds it pruned and writes nothing.
// LIMIT 1 keeps the LATERAL a probe of the primary key per row: flattened
// into a join, a generic plan made while workflows was small hashes the
// whole table (see upsertSQL).
const upsertWorkflowsSQL = `
INSERT INTO workflow_state (workflow_id, workflow, status, principal, current_step, awaiting, seq, record,
                            traceparent, created_at, updated_at, projected_at)
SELECT u.workflow_id, u.workflow, u.status, u.principal, u.current_step, u.awaiting, u.seq, u.record::jsonb,
       u.traceparent, u.created_at, u.updated_at, now()
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[],
              $9::text[], $10::timestamptz[], $11::timestamptz[])
       AS u(workflow_id, workflow, status, principal, current_step, awaiting, seq, record,
            traceparent, created_at, updated_at)
  CROSS JOIN LATERAL (
       SELECT 1 FROM workflows w WHERE w.workflow_id = u.workflow_id AND w.pruned_at IS NULL
        LIMIT 1
          FOR KEY SHARE) w
ON CONFLICT (workflow_id) DO UPDATE SET
    workflow     = EXCLUDED.workflow,
    status       = EXCLUDED.status,
    principal    = EXCLUDED.principal,
    current_step = EXCLUDED.current_step,
    awaiting     = EXCLUDED.awaiting,
    seq          = EXCLUDED.seq,
    record       = EXCLUDED.record,
    traceparent  = EXCLUDED.traceparent,
    created_at   = EXCLUDED.created_at,
    updated_at   = EXCLUDED.updated_at,
    projected_at = EXCLUDED.projected_at
 WHERE workflow_state.seq < EXCLUDED.seq`

// workflowRowsOf maps records to the column arrays of upsertWorkflowsSQL.
// Only records that have been through events.ApplyWorkflow are written, so
// a failure here is a bug, not bad input.
func workflowRowsOf(recs []workflowRow) ([]any, error) {
	n := len(recs)
	var (
		ids, names, statuses, principals = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		currents, awaiting, records      = make([]string, n), make([]string, n), make([]string, n)
		traces                           = make([]string, n)
		seqs                             = make([]int64, n)
		created, updated                 = make([]time.Time, n), make([]time.Time, n)
	)
	for i, r := range recs {
		rec := r.rec
		rec.Events, rec.Operations = nil, nil
		raw, err := json.Marshal(rec)
		if err != nil {
			return nil, fmt.Errorf("encoding the record of workflow %s: %w", rec.WorkflowID, err)
		}
		ids[i], names[i], statuses[i], principals[i] = rec.WorkflowID, rec.Workflow, string(rec.Status), rec.Principal
		// jsonb cannot hold NUL; the journal keeps the exact bytes.
		currents[i], awaiting[i], records[i] = rec.Current, rec.Awaiting, string(store.JSONBSafe(raw))
		traces[i], seqs[i], created[i], updated[i] = r.trace, rec.Seq, rec.CreatedAt, rec.UpdatedAt
	}
	return []any{ids, names, statuses, principals, currents, awaiting, seqs, records, traces, created, updated}, nil
}

// upsertWorkflowsTx writes recs inside tx (Rebuild).
func upsertWorkflowsTx(ctx context.Context, tx pgx.Tx, recs []workflowRow) error {
	if len(recs) == 0 {
		return nil
	}
	args, err := workflowRowsOf(recs)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, upsertWorkflowsSQL, args...); err != nil {
		return fmt.Errorf("writing %d workflow states: %w", len(recs), store.InterpretError(err))
	}
	return nil
}

// newWorkflowCache returns the cache of workflow rows.
func newWorkflowCache(max int) *recordCache[workflowRow] {
	return newCache(max, func(r workflowRow) (string, int64, bool) {
		return r.rec.WorkflowID, r.rec.Seq, r.rec.Status.Terminal()
	})
}
