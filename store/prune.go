package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// record->>'downstream_id' is null, and the downstream_id column is set
// null: the indexes of callbacks by the downstream's id drop it, and a
// callback about a pruned operation finds nothing to change. (The
// principal column stays; it is the tombstone's principal too.)
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

// settledPredicate names the operations a prune may take; keep them in step
// with the predicate of the operations_settled index, or the planner
// cannot use it.
const settledPredicate = `o.status IN ('completed', 'failed', 'compensated') AND o.pruned_at IS NULL`

// A prune is a page of candidates read without locks, then those
// candidates locked and tombstoned by key, so that every statement that
// locks or writes names its operation keys and each runs within one
// colocation group (docs/design.md, "Beyond one primary").
//
// pruneCandidatesSQL reads the page: up to $5 settled operations of tool $1
// that settled before $2, oldest first, after the cursor ($3, $4). The
// cursor moves past every candidate read, pruned or not, so a page of
// operations that cannot go yet (awaited by their runs, or locked) never
// holds the pass back on them; the key breaks ties between operations that
// settled in the same microsecond, so none is skipped or read twice.
// Operations whose outcome events still wait in the outbox are left alone:
// the relay reads the events it publishes from the journal.
const pruneCandidatesSQL = `
SELECT o.operation_key, o.updated_at FROM operations o
 WHERE o.tool = $1 AND o.updated_at < $2 AND ` + settledPredicate + `
   AND o.updated_at >= $3 AND (o.updated_at > $3 OR o.operation_key > $4)
   AND o.due_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.operation_key = o.operation_key)
 ORDER BY o.updated_at, o.operation_key
 LIMIT $5`

// awaitedStepsSQL locks FOR SHARE the runs of a page's step operations
// that have not settled, in id order, and returns what each awaits (""
// for nothing). A step's or an undo's operation that its run still awaits
// (workflows.awaiting, migration 0006) is not pruned: the workflow driver
// takes the run's next transition from the operation's record (its result
// and downstream id), and a driver down for longer than the tool's dedup
// window would otherwise find a tombstone and leave the run stuck. Once
// the run has moved on, a later pass prunes the operation.
//
// The share lock, held until the prune commits, keeps a run from starting
// to await a candidate between this check and the prune. A run starts
// awaiting an operation only in a transition that records the operation's
// intent, so it starts awaiting one that exists already, settled, only
// when the transition adopts a key recorded before it (by hand, say;
// docs/design.md, "Workflows"). Every transition of a run that exists
// takes the run's row lock first (the driver's lockDueSQL, a decision's
// load FOR NO KEY UPDATE) and so waits for the prune. Hence every run that
// has not settled is locked, an escalated one too though it awaits
// nothing: a decision moves it on. A settled run never moves again. No
// lock covers a run's start, which inserts the row: a start that adopts a
// settled step operation as the prune takes it finds the tombstone and
// fails, or, if it commits between this check and the prune, leaves its
// new run awaiting a tombstone, which the driver reports as a RunError and
// leaves alone.
//
// Nothing waits in a cycle on these locks: the driver locks its runs with
// SKIP LOCKED and passes over a run locked here, a decision locks its one
// run before anything else, and the prune, while it holds them, locks its
// operations with SKIP LOCKED.
const awaitedStepsSQL = `
SELECT coalesce(awaiting, '') FROM workflows
 WHERE workflow_id = ANY($1) AND status NOT IN ('completed', 'unwound', 'abandoned')
 ORDER BY workflow_id
   FOR SHARE`

// pruneKeysSQL tombstones the candidates $1 in one statement: they are
// locked with SKIP LOCKED (a row an append is writing is left for the next
// pass; so is one another pruner took), each head row becomes its
// tombstone, and the events and read-model rows of exactly the rows turned
// into tombstones are deleted. The page was read without locks, so the
// predicate is checked again here, on the locked rows, which are the
// latest: a row appended to since the read is pruned only if it still
// qualifies (still settled before the window, its new events relayed),
// and one another pruner took since has pruned_at set and drops out.
const pruneKeysSQL = `
WITH victims AS (
    SELECT o.operation_key FROM operations o
     WHERE o.operation_key = ANY($1) AND o.updated_at < $2 AND ` + settledPredicate + `
       AND o.due_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.operation_key = o.operation_key)
       FOR UPDATE SKIP LOCKED
), tomb AS (
    UPDATE operations o
       SET pruned_at = $3, seq = o.seq + 1, lease_until = NULL, due_at = NULL,
           record = jsonb_build_object('tombstone', jsonb_strip_nulls(jsonb_build_object(
               'principal', coalesce(to_jsonb(o.principal), o.record->'principal'),
               'downstream_id', coalesce(to_jsonb(o.downstream_id), o.record->'downstream_id'), 'seq', o.seq))),
           body = NULL, downstream_id = NULL
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

// PruneCursor is where a prune pass over one tool has got to: the last
// candidate a page read. The zero cursor starts from the oldest.
type PruneCursor struct {
	SettledAt time.Time
	Key       string
}

// PrunePage is what one page of a prune did.
type PrunePage struct {
	// Pruned is how many operations it turned into tombstones.
	Pruned int
	// Full says the page read as many candidates as it was allowed, so
	// more may follow after Next, however few it pruned.
	Full bool
	// Next is the cursor of the next page of the pass.
	Next PruneCursor
}

// PruneSettledPage prunes one page of the operations of tool that settled
// before settledBefore: it reads at most limit candidates, oldest first
// after the cursor, and prunes those it may, stamping the tombstones with
// now. A pass starts from the zero cursor and goes on from Next while the
// page was Full. A page is a few bounded statements: the candidates read,
// then, in one transaction if any of them is a workflow's step, the runs of
// those steps locked and the candidates their runs do not await pruned.
func (s *Store) PruneSettledPage(ctx context.Context, tool string, after PruneCursor, settledBefore, now time.Time, limit int) (PrunePage, error) {
	keys, page, err := s.pruneCandidates(ctx, tool, after, settledBefore, limit)
	if err == nil && len(keys) > 0 {
		page.Pruned, err = s.pruneKeys(ctx, keys, settledBefore, now)
	}
	if err != nil {
		return PrunePage{}, fmt.Errorf("pruning settled operations of %s: %w", tool, interpretError(err))
	}
	return page, nil
}

// pruneCandidates reads a page of candidates: their keys, and the page
// without its Pruned.
func (s *Store) pruneCandidates(ctx context.Context, tool string, after PruneCursor, settledBefore time.Time, limit int) ([]string, PrunePage, error) {
	rows, err := s.pool.Query(ctx, pruneCandidatesSQL, tool, settledBefore, after.SettledAt, after.Key, limit)
	if err != nil {
		return nil, PrunePage{}, err
	}
	var page PrunePage
	var keys []string
	for rows.Next() {
		var c PruneCursor
		if err := rows.Scan(&c.Key, &c.SettledAt); err != nil {
			rows.Close()
			return nil, PrunePage{}, err
		}
		keys = append(keys, c.Key)
		page.Next = c
	}
	if err := rows.Err(); err != nil {
		return nil, PrunePage{}, err
	}
	page.Full = len(keys) == limit
	return keys, page, nil
}

// pruneKeys prunes those of the candidates keys that still qualify when
// locked and that no run awaits, and returns how many it pruned.
func (s *Store) pruneKeys(ctx context.Context, keys []string, settledBefore, now time.Time) (int, error) {
	var runs []string
	for _, k := range keys {
		if id, ok := events.StepWorkflowID(k); ok {
			runs = append(runs, id)
		}
	}
	var n int
	prune := func(q querier, keys []string) error {
		return q.QueryRow(ctx, pruneKeysSQL, keys, settledBefore, now).Scan(&n)
	}
	if len(runs) == 0 {
		// No step among them: nothing to check in the workflows' colocation
		// group, and the prune is one statement.
		if err := prune(s.pool, keys); err != nil {
			return 0, err
		}
		return n, nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, awaitedStepsSQL, runs)
		if err != nil {
			return err
		}
		awaited, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(awaited) > 0 {
			held := make(map[string]bool, len(awaited))
			for _, k := range awaited {
				held[k] = true
			}
			keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return held[k] })
		}
		if len(keys) == 0 {
			return nil
		}
		return prune(tx, keys)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// PruneSettled prunes the operations of tool that settled before
// settledBefore, stamping the tombstones with now, one page of at most
// limit candidates after another without a pause, and returns how many it
// pruned: a whole pass, for callers that want one at once. The pruner
// calls PruneSettledPage instead, pausing between pages.
func (s *Store) PruneSettled(ctx context.Context, tool string, settledBefore, now time.Time, limit int) (int, error) {
	var cur PruneCursor
	total := 0
	for {
		page, err := s.PruneSettledPage(ctx, tool, cur, settledBefore, now, limit)
		total += page.Pruned
		if err != nil || !page.Full {
			return total, err
		}
		cur = page.Next
	}
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
