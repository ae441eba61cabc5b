package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Retention of runs (migration 0008_workflow_retention.sql), the way
// store/prune.go does it for operations.
//
// A settled run (completed, unwound, abandoned: nothing more happens to it)
// is pruned once its retention has passed since it settled: its events and
// its workflow_state row are deleted, and its head row in workflows becomes
// a tombstone holding what answers a late duplicate start (id, workflow,
// input hash, final status, principal, when it settled). A running,
// unwinding or escalated run is never pruned, whatever its age: it still
// waits on an operation or on a person.
//
// The race is the one the operations' retention closes. A duplicate start
// is recorded by write's INSERT … ON CONFLICT (workflow_id) DO NOTHING. Had
// the tombstone been a row of its own table, written in the transaction
// that deletes the head row, a duplicate could take its snapshot before
// that transaction commits (no tombstone yet) and meet the primary key
// after it (the head gone): the run would start again and its steps run
// under keys whose operations may already be tombstones themselves. So the
// head row is updated in place and never deleted; the id is held by one
// row throughout, live or tombstone, and a racing insert conflicts either
// way. Moving seq one on makes any write decided from the live record
// (write's UPDATE … WHERE seq = base) miss, and clearing awaiting keeps the
// tombstone out of the driver's sweep; a settled run has neither anyway.
//
// The run's step and undo operations are pruned by the operations' own
// retention, each after its tool's dedup window, in either order with the
// run: a settled run reads none of them again (its record holds every
// step's result and downstream id), and an operation reads nothing of its
// run. What must not be pruned under a run is the operation it still
// waits on; store/prune.go keeps that one (see awaitedStepsSQL there).

var (
	// ErrPruned is wrapped by every *PrunedError.
	ErrPruned = errors.New("workflow pruned")
)

// Tombstone is what remains of a pruned run.
type Tombstone struct {
	WorkflowID string                `json:"workflow_id"`
	Workflow   string                `json:"workflow"`
	InputHash  string                `json:"input_hash"`
	Principal  string                `json:"principal"`
	Status     events.WorkflowStatus `json:"status"`
	// Seq is the seq of the run's last event.
	Seq       int64     `json:"seq"`
	CreatedAt time.Time `json:"created_at"`
	SettledAt time.Time `json:"settled_at"`
	PrunedAt  time.Time `json:"pruned_at"`
}

// Record returns the tombstone as a run's record holding only what the
// tombstone keeps, marked Pruned: no input, steps or history.
func (t Tombstone) Record() events.Workflow {
	return events.Workflow{WorkflowID: t.WorkflowID, Workflow: t.Workflow, Status: t.Status, InputHash: t.InputHash,
		Principal: t.Principal, Steps: []events.WorkflowStep{}, Seq: t.Seq, CreatedAt: t.CreatedAt, UpdatedAt: t.SettledAt,
		Pruned: true}
}

// PrunedError says the run under an id was pruned; its tombstone is the
// answer. It wraps ErrPruned and ErrNotFound: a caller that does not know
// about retention sees a run that is no longer there.
type PrunedError struct {
	Tombstone Tombstone
}

func (e *PrunedError) Error() string {
	return fmt.Sprintf("workflow %s was pruned at %s (settled %s at %s)", e.Tombstone.WorkflowID,
		e.Tombstone.PrunedAt.Format(time.RFC3339), e.Tombstone.Status, e.Tombstone.SettledAt.Format(time.RFC3339))
}

func (e *PrunedError) Unwrap() []error { return []error{ErrPruned, ErrNotFound} }

// AsPruned returns the tombstone err carries, if it reports a pruned run.
func AsPruned(err error) (Tombstone, bool) {
	var pe *PrunedError
	if errors.As(err, &pe) {
		return pe.Tombstone, true
	}
	return Tombstone{}, false
}

// A tombstone's record column holds only what the row's columns do not:
// {"tombstone": {"principal", "seq"}}. Its members sit under "tombstone",
// so a reader that decodes the column as a run's record (the driver's
// advance) finds a run that waits on nothing.
const tombstoneSQL = `SELECT workflow_id, workflow, input_hash, status, created_at, updated_at, pruned_at,
       coalesce(record #>> '{tombstone,principal}', ''), coalesce((record #>> '{tombstone,seq}')::bigint, 0)
  FROM workflows WHERE workflow_id = $1 AND pruned_at IS NOT NULL`

// loadTombstone reads the tombstone of id, for load, which found the row
// pruned.
func loadTombstone(ctx context.Context, q querier, id string) error {
	var t Tombstone
	var status string
	err := q.QueryRow(ctx, tombstoneSQL, id).Scan(&t.WorkflowID, &t.Workflow, &t.InputHash, &status,
		&t.CreatedAt, &t.SettledAt, &t.PrunedAt, &t.Principal, &t.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		// Expired between the two reads.
		return fmt.Errorf("loading workflow %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("loading workflow %s: %w", id, store.InterpretError(err))
	}
	t.Status = events.WorkflowStatus(status)
	return &PrunedError{Tombstone: t}
}

// settledRunPredicate is the statuses a prune may take: every terminal
// one (events.WorkflowStatus.Terminal). Keep it in step with the predicate
// of the workflows_settled index.
const settledRunPredicate = `w.status IN ('completed', 'unwound', 'abandoned') AND w.pruned_at IS NULL`

// pruneRunsSQL prunes up to $3 settled runs of workflow $1 that settled
// before $2, oldest first, in one statement: the candidates are locked
// with SKIP LOCKED (two pruners take disjoint sets), each head row becomes
// its tombstone, and the events and read-model rows of exactly those runs
// are deleted. A run with events the driver has not yet published to the
// workflows topic is left for a later round: the publisher reads them from
// the journal. Unlike the operations' prune it reads no other colocation
// group, so under Citus it can run per shard as it stands, as the
// tombstone expiry does (docs/design.md, "Beyond one primary").
const pruneRunsSQL = `
WITH victims AS (
    SELECT w.workflow_id FROM workflows w
     WHERE w.workflow = $1 AND w.updated_at < $2 AND ` + settledRunPredicate + `
       AND NOT EXISTS (SELECT 1 FROM workflow_events e WHERE e.workflow_id = w.workflow_id AND NOT e.published)
     ORDER BY w.updated_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), tomb AS (
    UPDATE workflows w
       SET pruned_at = $4, seq = w.seq + 1, awaiting = NULL,
           record = jsonb_build_object('tombstone', jsonb_strip_nulls(jsonb_build_object(
               'principal', w.record->'principal', 'seq', w.seq)))
      FROM victims v
     WHERE w.workflow_id = v.workflow_id
    RETURNING w.workflow_id
), ev AS (
    DELETE FROM workflow_events e USING tomb t WHERE e.workflow_id = t.workflow_id
), st AS (
    DELETE FROM workflow_state s USING tomb t WHERE s.workflow_id = t.workflow_id
)
SELECT count(*) FROM tomb`

// settledWorkflowsSQL lists the workflows that have settled runs not yet
// pruned, one index probe per workflow (a loose index scan over
// workflows_settled), so a workflow no longer in the tools file is still
// pruned, under the default retention.
const settledWorkflowsSQL = `
WITH RECURSIVE t(workflow) AS (
    SELECT min(w.workflow) FROM workflows w WHERE ` + settledRunPredicate + `
    UNION ALL
    SELECT (SELECT min(w.workflow) FROM workflows w WHERE w.workflow > t.workflow AND ` + settledRunPredicate + `)
      FROM t WHERE t.workflow IS NOT NULL
)
SELECT workflow FROM t WHERE workflow IS NOT NULL`

// expireRunsSQL deletes up to $2 run tombstones made before $1.
const expireRunsSQL = `
WITH victims AS (
    SELECT workflow_id FROM workflows
     WHERE pruned_at < $1
     ORDER BY pruned_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM workflows w USING victims v WHERE w.workflow_id = v.workflow_id
    RETURNING 1
)
SELECT count(*) FROM gone`

// SettledWorkflows returns the names of the workflows that have settled
// runs not yet pruned.
func (j *Journal) SettledWorkflows(ctx context.Context) ([]string, error) {
	rows, err := j.pool.Query(ctx, settledWorkflowsSQL)
	if err != nil {
		return nil, fmt.Errorf("listing workflows with settled runs: %w", store.InterpretError(err))
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing workflows with settled runs: %w", store.InterpretError(err))
	}
	return names, nil
}

// PruneSettled prunes up to limit runs of workflow that settled before
// settledBefore, stamping the tombstones with now, and returns how many it
// pruned. It is one bounded statement; call it again while it returns
// limit.
func (j *Journal) PruneSettled(ctx context.Context, workflow string, settledBefore, now time.Time, limit int) (int, error) {
	var n int
	if err := j.pool.QueryRow(ctx, pruneRunsSQL, workflow, settledBefore, limit, now).Scan(&n); err != nil {
		return 0, fmt.Errorf("pruning settled runs of %s: %w", workflow, store.InterpretError(err))
	}
	return n, nil
}

// ExpireTombstones deletes up to limit run tombstones made before
// prunedBefore and returns how many it deleted. Their ids are free again.
func (j *Journal) ExpireTombstones(ctx context.Context, prunedBefore time.Time, limit int) (int, error) {
	var n int
	if err := j.pool.QueryRow(ctx, expireRunsSQL, prunedBefore, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("expiring workflow tombstones: %w", store.InterpretError(err))
	}
	return n, nil
}

// CountTombstones counts the runs pruned to tombstones. It scans the
// tombstones: for reports and tests.
func (j *Journal) CountTombstones(ctx context.Context) (int64, error) {
	var n int64
	if err := j.pool.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE pruned_at IS NOT NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting workflow tombstones: %w", store.InterpretError(err))
	}
	return n, nil
}
