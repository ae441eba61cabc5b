package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
)

// Retention (migration 0005_retention.sql).
//
// A settled operation (completed, failed, compensated) is pruned once its
// tool's dedup window has passed since it settled: its events and its
// read-model row are deleted, and its head row in operations becomes a
// tombstone. The tombstone keeps what answers a late duplicate (key, tool,
// payload hash, final status, when it settled, the downstream id) and
// nothing else. Unsettled operations are never pruned, whatever their age.
//
// The race the design has to close is a late duplicate of the intent
// arriving while the operation is pruned. A duplicate is recorded by
// createSQL, an INSERT … ON CONFLICT (operation_key) DO NOTHING into
// operations. Were the tombstone a row of a table of its own, written in the
// transaction that deletes the head row, a duplicate's statement could take
// its snapshot before that transaction commits (no tombstone visible yet),
// then find the head row deleted by the time its insert checks the primary
// key (the insert waits for the deleting transaction, sees the row gone,
// and goes ahead): the operation would be created afresh and run again. The
// tombstone therefore stays in operations: pruning updates the head row in
// place and never deletes it, so the primary key that claims a new
// operation is held by the same row throughout, live or tombstone. An
// insert racing the prune finds the key taken whichever version of the row
// its unique check meets (the live one, being updated, or the tombstone) and
// conflicts, as it would have on the live row; no ordering of the two
// statements lets a duplicate through. (TestPruneRacesLateDuplicates runs
// them together.)
//
// The prune also moves seq one past the last event, and every append is
// conditional on the seq its writer read: a writer that loaded the live
// record before the prune (a late outcome of a lost lease, a decision) finds
// its append conflicting and, reloading, finds the tombstone (a
// *PrunedError). The executor's intent claim (appendAfterIntentSQL)
// conflicts on both counts: the seq moved and the intent's event is gone.
//
// Only an expired tombstone is deleted, after the tombstone retention;
// from then on the key is free again, as the retention promises.

var (
	// ErrPruned is wrapped by every *PrunedError.
	ErrPruned = errors.New("operation pruned")
)

// Tombstone is what remains of a pruned operation.
type Tombstone struct {
	OperationKey string             `json:"operation_key"`
	Tool         string             `json:"tool"`
	EffectClass  events.EffectClass `json:"effect_class"`
	PayloadHash  string             `json:"payload_hash"`
	// Principal is who asked for the operation, kept so that answering a
	// duplicate can be scoped to the caller as answering a live one is.
	Principal string        `json:"principal"`
	Status    events.Status `json:"status"`
	// DownstreamID is the downstream's id of the effect, "" if it gave none.
	DownstreamID string `json:"downstream_id"`
	// Seq is the seq of the operation's last event.
	Seq       int64     `json:"seq"`
	CreatedAt time.Time `json:"created_at"`
	SettledAt time.Time `json:"settled_at"`
	PrunedAt  time.Time `json:"pruned_at"`
}

// Operation returns the tombstone as an operation record holding only what
// the tombstone keeps.
func (t Tombstone) Operation() events.Operation {
	return events.Operation{
		Key: t.OperationKey, Tool: t.Tool, EffectClass: t.EffectClass, PayloadHash: t.PayloadHash,
		Principal: t.Principal, Status: t.Status, DownstreamID: t.DownstreamID,
		Seq: t.Seq, CreatedAt: t.CreatedAt, UpdatedAt: t.SettledAt,
	}
}

// PrunedError says the operation under a key was pruned; its tombstone is
// the answer. It wraps both ErrPruned and ErrNotFound: a caller that does
// not know about retention sees an operation that is no longer there.
type PrunedError struct {
	Tombstone Tombstone
}

func (e *PrunedError) Error() string {
	return fmt.Sprintf("operation %s was pruned at %s (settled %s at %s)", e.Tombstone.OperationKey,
		e.Tombstone.PrunedAt.Format(time.RFC3339), e.Tombstone.Status, e.Tombstone.SettledAt.Format(time.RFC3339))
}

func (e *PrunedError) Unwrap() []error { return []error{ErrPruned, ErrNotFound} }

// AsPruned returns the tombstone err carries, if it reports a pruned
// operation.
func AsPruned(err error) (Tombstone, bool) {
	var pe *PrunedError
	if errors.As(err, &pe) {
		return pe.Tombstone, true
	}
	return Tombstone{}, false
}

// A tombstone's record column holds only what the row's columns do not:
// {"tombstone": {"principal", "downstream_id", "seq"}}. The key, tool,
// effect class, payload hash and status stay in their columns, updated_at
// is when it settled, pruned_at when it was pruned; a tombstone row is about
// half the size of a live one. The members sit under "tombstone", so
// record->>'downstream_id' is null and the operations_downstream_id index
// (callbacks by the downstream's id) drops it: a callback about a pruned
// operation finds nothing to change.
const tombstonesSQL = `SELECT operation_key, tool, effect_class, payload_hash, status, created_at, updated_at, pruned_at,
       coalesce(record #>> '{tombstone,principal}', ''), coalesce(record #>> '{tombstone,downstream_id}', ''),
       coalesce((record #>> '{tombstone,seq}')::bigint, 0)
  FROM operations WHERE operation_key = ANY($1) AND pruned_at IS NOT NULL`

// prunedError loads the tombstone of key for Load, which found the row
// pruned: a second read, on a path that is rare by construction.
func prunedError(ctx context.Context, q querier, key string) error {
	ts, err := tombstones(ctx, q, []string{key})
	if err != nil {
		return fmt.Errorf("loading operation %s: %w", key, err)
	}
	t, ok := ts[key]
	if !ok {
		// Expired between the two reads.
		return fmt.Errorf("loading operation %s: %w", key, ErrNotFound)
	}
	return &PrunedError{Tombstone: t}
}

// Tombstones returns the tombstones among keys.
func (s *Store) Tombstones(ctx context.Context, keys []string) (map[string]Tombstone, error) {
	return tombstones(ctx, s.pool, keys)
}

// TombstonesTx is Tombstones inside the caller's transaction.
func TombstonesTx(ctx context.Context, tx pgx.Tx, keys []string) (map[string]Tombstone, error) {
	return tombstones(ctx, tx, keys)
}

func tombstones(ctx context.Context, q querier, keys []string) (map[string]Tombstone, error) {
	rows, err := q.Query(ctx, tombstonesSQL, keys)
	if err != nil {
		return nil, fmt.Errorf("loading tombstones: %w", interpretError(err))
	}
	defer rows.Close()
	out := map[string]Tombstone{}
	for rows.Next() {
		var t Tombstone
		var class, status string
		if err := rows.Scan(&t.OperationKey, &t.Tool, &class, &t.PayloadHash, &status, &t.CreatedAt, &t.SettledAt,
			&t.PrunedAt, &t.Principal, &t.DownstreamID, &t.Seq); err != nil {
			return nil, fmt.Errorf("loading tombstones: %w", err)
		}
		t.EffectClass, t.Status = events.EffectClass(class), events.Status(status)
		out[t.OperationKey] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("loading tombstones: %w", interpretError(err))
	}
	return out, nil
}

// settledStatuses are the statuses a prune may take; keep them in step
// with the predicate of the operations_settled index, or the planner
// cannot use it.
const settledPredicate = `o.status IN ('completed', 'failed', 'compensated') AND o.pruned_at IS NULL`

// pruneSQL prunes up to $3 settled operations of tool $1 that settled
// before $2, oldest first, in one statement: the candidates are locked with
// SKIP LOCKED (two pruners take disjoint sets; a row an append is writing
// is left for the next round), each head row becomes its tombstone, and the
// events and read-model rows of exactly the rows turned into tombstones are
// deleted. Under READ COMMITTED a candidate that an append changed after the
// statement's snapshot is re-read when locked and its predicate re-checked:
// that append moved updated_at forward (and perhaps the status), so the row
// drops out. An operation whose outcome events still wait in the outbox is
// left alone: the relay reads events it publishes from the journal.
//
// So is a step's or an undo's operation that its workflow run still awaits
// (workflows.awaiting, migration 0006): the workflow driver takes the
// run's next transition from the operation's record (its result and
// downstream id), and a driver that was down for longer than the tool's
// dedup window would otherwise find a tombstone and leave the run stuck.
// Such keys are "wf:<workflow id>/…" and a workflow id holds no '/', so the
// run is one primary-key probe away; once the run has moved on, the next
// round prunes the operation.
const pruneSQL = `
WITH victims AS (
    SELECT o.operation_key FROM operations o
     WHERE o.tool = $1 AND o.updated_at < $2 AND ` + settledPredicate + `
       AND o.due_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.operation_key = o.operation_key)
       AND NOT (starts_with(o.operation_key, 'wf:') AND EXISTS (SELECT 1 FROM workflows w
                 WHERE w.workflow_id = split_part(substr(o.operation_key, 4), '/', 1)
                   AND w.awaiting = o.operation_key))
     ORDER BY o.updated_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), tomb AS (
    UPDATE operations o
       SET pruned_at = $4, seq = o.seq + 1, lease_until = NULL, due_at = NULL,
           record = jsonb_build_object('tombstone', jsonb_strip_nulls(jsonb_build_object(
               'principal', o.record->'principal', 'downstream_id', o.record->'downstream_id', 'seq', o.seq)))
      FROM victims v
     WHERE o.operation_key = v.operation_key
    RETURNING o.operation_key
), ev AS (
    DELETE FROM events e USING tomb t WHERE e.operation_key = t.operation_key
), st AS (
    DELETE FROM operation_state s USING tomb t WHERE s.operation_key = t.operation_key
)
SELECT count(*) FROM tomb`

// settledToolsSQL lists the tools that have settled operations not yet
// pruned, one index probe per tool (a loose index scan over
// operations_settled), so a tool no longer in the tools file is still
// pruned, under the default window.
const settledToolsSQL = `
WITH RECURSIVE t(tool) AS (
    SELECT min(o.tool) FROM operations o WHERE ` + settledPredicate + `
    UNION ALL
    SELECT (SELECT min(o.tool) FROM operations o WHERE o.tool > t.tool AND ` + settledPredicate + `)
      FROM t WHERE t.tool IS NOT NULL
)
SELECT tool FROM t WHERE tool IS NOT NULL`

// expireSQL deletes up to $2 tombstones made before $1.
const expireSQL = `
WITH victims AS (
    SELECT operation_key FROM operations
     WHERE pruned_at < $1
     ORDER BY pruned_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM operations o USING victims v WHERE o.operation_key = v.operation_key
    RETURNING 1
)
SELECT count(*) FROM gone`

// SettledTools returns the tools that have settled operations not yet
// pruned.
func (s *Store) SettledTools(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, settledToolsSQL)
	if err != nil {
		return nil, fmt.Errorf("listing tools with settled operations: %w", interpretError(err))
	}
	tools, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing tools with settled operations: %w", interpretError(err))
	}
	return tools, nil
}

// PruneSettled prunes up to limit operations of tool that settled before
// settledBefore, stamping the tombstones with now, and returns how many it
// pruned. It is one bounded statement; call it again while it returns
// limit.
func (s *Store) PruneSettled(ctx context.Context, tool string, settledBefore, now time.Time, limit int) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, pruneSQL, tool, settledBefore, limit, now).Scan(&n); err != nil {
		return 0, fmt.Errorf("pruning settled operations of %s: %w", tool, interpretError(err))
	}
	return n, nil
}

// ExpireTombstones deletes up to limit tombstones made before prunedBefore
// and returns how many it deleted. Their keys are free again.
func (s *Store) ExpireTombstones(ctx context.Context, prunedBefore time.Time, limit int) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, expireSQL, prunedBefore, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("expiring tombstones: %w", interpretError(err))
	}
	return n, nil
}

// CountTombstones counts the operations pruned to tombstones. It scans the
// tombstones: for reports and benchmarks.
func (s *Store) CountTombstones(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE pruned_at IS NOT NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting tombstones: %w", interpretError(err))
	}
	return n, nil
}
