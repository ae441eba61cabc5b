package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// This file holds every statement that writes operation_state and the one
// mapping from an events.Operation to a row. The live projector and Rebuild
// both go through upsertSQL and rowsOf, so a rebuilt row cannot differ from a
// projected one by how its columns were derived.

// loadRowsSQL reads the stored folds of the operations a flush has not
// cached: the columns and the record of what they leave out (stateRecord).
// It takes no row locks: see recordCache for why a fold read here may be
// folded onto and written back without holding the row.
const loadRowsSQL = `SELECT ` + stateColumns + `, record, body FROM operation_state WHERE operation_key = ANY($1)`

// stateRecord is what operation_state.record holds: the fields of the fold
// that no column carries. The columns and it are the whole fold bar the
// args, which is what the projector folds the next events onto when its
// cache does not hold the operation (loadRecords). The record used to be the
// whole fold again, every column a second time: 770 of a row's 1,050
// bytes, on every retained operation and in the WAL of both of its
// upserts; this one is the attempt times and the downstream key, about 200.
//
// created_at, updated_at and lease_until come back from their columns at
// microseconds (timestamptz), while a fold from the journal keeps the
// events' nanoseconds. Nothing folded depends on them (events.Apply
// overwrites them, never compares them), and every reader reads the
// columns, so the loaded fold writes the same row. Every field of
// events.Operation is either a column or here, or the args, which the read
// model never holds (TestStateRecordCoversTheFold).
type stateRecord struct {
	LeaseOwner     string          `json:"lease_owner,omitempty"`
	DueAt          *time.Time      `json:"due_at,omitempty"`
	DownstreamKey  string          `json:"downstream_key,omitempty"`
	Approved       bool            `json:"approved,omitempty"`
	Approvals      []string        `json:"approvals,omitempty"`
	LastFailure    *events.Failure `json:"last_failure,omitempty"`
	FirstAttemptAt *time.Time      `json:"first_attempt_at,omitempty"`
	LastAttemptAt  *time.Time      `json:"last_attempt_at,omitempty"`
	LastOutcomeAt  *time.Time      `json:"last_outcome_at,omitempty"`
}

// StoredRecord returns the record operation_state keeps for op: the
// fields of the fold its columns leave out (stateRecord), as JSON jsonb can
// hold. rowsOf writes it, packed in body or as jsonb in record
// (store.StoredJSON); the load generator's history checks copies against
// it.
func StoredRecord(op events.Operation) ([]byte, error) {
	b, err := json.Marshal(stateRecord{
		LeaseOwner: op.LeaseOwner, DueAt: op.DueAt, DownstreamKey: op.DownstreamKey,
		Approved: op.Approved, Approvals: op.Approvals, LastFailure: op.LastFailure,
		FirstAttemptAt: op.FirstAttemptAt, LastAttemptAt: op.LastAttemptAt, LastOutcomeAt: op.LastOutcomeAt,
	})
	if err != nil {
		return nil, err
	}
	// jsonb cannot hold NUL; the journal keeps the exact bytes.
	return store.JSONBSafe(b), nil
}

// upsertSQL writes rows given as parallel arrays, one statement for the whole
// batch. The WHERE clause of the update is the idempotence guard: a row is
// only ever replaced by one with a higher last_seq. Since every row is the
// fold of its operation's events up to last_seq, whichever writer gets there
// writes the same row, and a writer that lost a race (a replica that still
// held a partition during a rebalance, a projector folding onto a cached
// record that Rebuild has since moved on) cannot move a row backwards.
// The WHERE keeps a pruned operation pruned: its events may still be on
// the outcomes topic after its tool's dedup window (a replay from offset 0,
// a group reset), and without the guard they would bring back its row, which
// nothing would ever prune again. The row it skips counts as not written,
// like a stale one; the events after it find neither a row nor a journal to
// fill the gap from, and are rejected (acked).
//
// The guard is a scalar subquery, one probe of the operations primary key
// per row, and not a NOT EXISTS: the planner turns a NOT EXISTS into an
// anti-join, and the generic plan of a statement prepared while operations
// was small (a fresh database; every connection prepares it again) hashed
// the whole table on every flush, for as long as the connection lived. On a
// fresh database growing at 500/s that made this statement 5× slower
// (docs/benchmarks.md, "Session 8"); a scalar subquery is never flattened
// into a join.
//
// Unlike the workflow upsert (workflow_state.go), this one locks no head
// row, so a write whose snapshot predates a prune's commit can still bring
// that one operation's row back. Only a replay can race that way: the live
// projector writes an operation seconds after its events, and the prune
// waits a whole dedup window after it settled. A FOR KEY SHARE here would
// be a heap write (and, beside the executor's update, a multixact) per
// projected row of the busiest table, for a window of one statement.
const upsertSQL = `
INSERT INTO operation_state (
    operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
    lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
    escalation, last_seq, record, body, created_at, updated_at, projected_at)
SELECT u.operation_key, u.tool, u.effect_class, u.payload_hash, u.principal, u.status, u.phase, u.attempt,
       u.lease_until, u.result::jsonb, u.downstream_id, u.undo_ref, u.last_error_class, u.compensations, u.evidence,
       u.escalation::jsonb, u.last_seq, u.record::jsonb, u.body, u.created_at, u.updated_at, now()
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[],
              $9::timestamptz[], $10::text[], $11::text[], $12::text[], $13::text[], $14::integer[], $15::integer[],
              $16::text[], $17::bigint[], $18::text[], $19::timestamptz[], $20::timestamptz[], $21::bytea[])
       AS u(operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
            lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
            escalation, last_seq, record, created_at, updated_at, body)
 WHERE (SELECT o.pruned_at FROM operations o WHERE o.operation_key = u.operation_key) IS NULL
ON CONFLICT (operation_key) DO UPDATE SET
    tool             = EXCLUDED.tool,
    effect_class     = EXCLUDED.effect_class,
    payload_hash     = EXCLUDED.payload_hash,
    principal        = EXCLUDED.principal,
    status           = EXCLUDED.status,
    phase            = EXCLUDED.phase,
    attempt          = EXCLUDED.attempt,
    lease_until      = EXCLUDED.lease_until,
    result           = EXCLUDED.result,
    downstream_id    = EXCLUDED.downstream_id,
    undo_ref         = EXCLUDED.undo_ref,
    last_error_class = EXCLUDED.last_error_class,
    compensations    = EXCLUDED.compensations,
    evidence         = EXCLUDED.evidence,
    escalation       = EXCLUDED.escalation,
    last_seq         = EXCLUDED.last_seq,
    record           = EXCLUDED.record,
    body             = EXCLUDED.body,
    created_at       = EXCLUDED.created_at,
    updated_at       = EXCLUDED.updated_at,
    projected_at     = EXCLUDED.projected_at
 WHERE operation_state.last_seq < EXCLUDED.last_seq`

// projectSQL is upsertSQL telling which rows it wrote: a row it did not
// write was already at or past the batch's seq, so the batch's events were
// in it and the projector's cached record of it is behind.
const projectSQL = upsertSQL + `
RETURNING operation_key`

// rows is a batch of operations as the column arrays of upsertSQL.
type rows struct {
	keys, tools, classes, hashes, principals, statuses, phases []string
	attempts                                                   []int32
	leases                                                     []*time.Time
	results                                                    []*string
	downstreamIDs, undoRefs, errorClasses                      []string
	compensations, evidence                                    []int32
	escalations                                                []*string
	seqs                                                       []int64
	records                                                    []*string
	bodies                                                     [][]byte
	created, updated                                           []time.Time
}

// rowsOf maps operations to rows. Only records that have been through
// events.Apply are written, so a failure here is a bug, not bad input.
func rowsOf(ops []events.Operation) (*rows, error) {
	r := &rows{}
	for _, op := range ops {
		// The read model holds no args, in no column and not in the
		// record: the outcomes topic carries them redacted and folds into a
		// record without them (events.PublicIntent), and a record folded
		// from the journal (a gap filled, a rebuild) must be the same row.
		record, err := StoredRecord(op)
		if err != nil {
			return nil, fmt.Errorf("encoding the record of %s: %w", op.Key, err)
		}
		var escalation *string
		if op.Escalation != nil {
			b, err := json.Marshal(op.Escalation)
			if err != nil {
				return nil, fmt.Errorf("encoding the escalation of %s: %w", op.Key, err)
			}
			s := string(store.JSONBSafe(b))
			escalation = &s
		}
		var result *string
		if len(op.Result) > 0 {
			s := string(store.JSONBSafe(op.Result))
			result = &s
		}
		var lease *time.Time
		if op.LeaseUntil != nil {
			l := *op.LeaseUntil
			lease = &l
		}
		r.keys = append(r.keys, op.Key)
		r.tools = append(r.tools, op.Tool)
		r.classes = append(r.classes, string(op.EffectClass))
		r.hashes = append(r.hashes, op.PayloadHash)
		r.principals = append(r.principals, op.Principal)
		r.statuses = append(r.statuses, string(op.Status))
		r.phases = append(r.phases, string(op.Phase))
		r.attempts = append(r.attempts, int32(op.Attempt))
		r.leases = append(r.leases, lease)
		r.results = append(r.results, result)
		r.downstreamIDs = append(r.downstreamIDs, op.DownstreamID)
		r.undoRefs = append(r.undoRefs, op.UndoRef)
		r.errorClasses = append(r.errorClasses, op.LastErrorClass)
		r.compensations = append(r.compensations, int32(op.Compensations))
		r.evidence = append(r.evidence, int32(op.Evidence))
		r.escalations = append(r.escalations, escalation)
		r.seqs = append(r.seqs, op.Seq)
		jsonb, body := store.StoredJSON(record, op.Key)
		var recordText *string
		if jsonb != nil {
			s := string(jsonb)
			recordText = &s
		}
		r.records = append(r.records, recordText)
		r.bodies = append(r.bodies, body)
		r.created = append(r.created, op.CreatedAt)
		r.updated = append(r.updated, op.UpdatedAt)
	}
	return r, nil
}

func (r *rows) args() []any {
	return []any{r.keys, r.tools, r.classes, r.hashes, r.principals, r.statuses, r.phases, r.attempts,
		r.leases, r.results, r.downstreamIDs, r.undoRefs, r.errorClasses, r.compensations, r.evidence,
		r.escalations, r.seqs, r.records, r.created, r.updated, r.bodies}
}

// upsertTx writes ops inside tx.
func upsertTx(ctx context.Context, tx pgx.Tx, ops []events.Operation) error {
	if len(ops) == 0 {
		return nil
	}
	r, err := rowsOf(ops)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, upsertSQL, r.args()...); err != nil {
		return fmt.Errorf("writing %d operation states: %w", len(ops), store.InterpretError(err))
	}
	return nil
}

// upsert writes ops in a statement of its own (an implicit transaction) and
// returns the keys of the rows it changed.
func upsert(ctx context.Context, pool *pgxpool.Pool, ops []events.Operation) ([]string, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	r, err := rowsOf(ops)
	if err != nil {
		return nil, err
	}
	rs, err := pool.Query(ctx, projectSQL, r.args()...)
	if err != nil {
		return nil, fmt.Errorf("writing %d operation states: %w", len(ops), store.InterpretError(err))
	}
	written, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("writing %d operation states: %w", len(ops), store.InterpretError(err))
	}
	return written, nil
}

// loadRecords reads the stored folds of keys; operations not projected yet
// are absent from the map.
func loadRecords(ctx context.Context, pool *pgxpool.Pool, keys []string) (map[string]events.Operation, error) {
	rs, err := pool.Query(ctx, loadRowsSQL, keys)
	if err != nil {
		return nil, fmt.Errorf("loading %d operation states: %w", len(keys), store.InterpretError(err))
	}
	loaded, err := pgx.CollectRows(rs, scanFold)
	if err != nil {
		return nil, fmt.Errorf("loading %d operation states: %w", len(keys), store.InterpretError(err))
	}
	ops := make(map[string]events.Operation, len(loaded))
	for _, op := range loaded {
		ops[op.Key] = op
	}
	return ops, nil
}

// scanFold reads a row of loadRowsSQL: the columns, then the record (in
// body, packed, or in record: plain rows and rows written before body)
// laid over them. A row written before the record was cut down holds the whole
// fold in it; laid over the columns it gives the same operation.
func scanFold(row pgx.CollectableRow) (events.Operation, error) {
	var record, body []byte
	op, err := scanStateAnd(row, &record, &body)
	if err != nil {
		return events.Operation{}, err
	}
	if record, err = store.LoadedJSON(record, body, op.Key); err != nil {
		return events.Operation{}, fmt.Errorf("the stored record of %s: %w", op.Key, err)
	}
	if err := json.Unmarshal(record, &op); err != nil {
		return events.Operation{}, fmt.Errorf("decoding the stored record of %s: %w", op.Key, err)
	}
	if string(op.Result) == "null" { // a whole fold's "result": null
		op.Result = nil
	}
	return op, nil
}

// operationStream is the operations' stream for the batcher: the outcomes
// topic folded with events.Apply into operation_state, gaps filled from the
// event store.
type operationStream struct {
	store *store.Store
}

func (operationStream) eventKey(e events.Envelope) string     { return e.OperationKey }
func (operationStream) eventSeq(e events.Envelope) int64      { return e.Seq }
func (operationStream) eventTime(e events.Envelope) time.Time { return e.OccurredAt }
func (operationStream) recordSeq(op events.Operation) int64   { return op.Seq }
func (operationStream) complete(events.Envelope) bool         { return true }
func (operationStream) apply(op events.Operation, e events.Envelope) (events.Operation, error) {
	return events.Apply(op, e)
}

func (operationStream) load(ctx context.Context, pool *pgxpool.Pool, keys []string) (map[string]events.Operation, error) {
	return loadRecords(ctx, pool, keys)
}

func (operationStream) write(ctx context.Context, pool *pgxpool.Pool, ops []events.Operation) ([]string, error) {
	// Rows are inserted in key order, so two statements that meet on the
	// same new keys (two flushers, or replicas during a rebalance) wait for
	// each other instead of deadlocking.
	slices.SortFunc(ops, func(a, c events.Operation) int { return strings.Compare(a.Key, c.Key) })
	return upsert(ctx, pool, ops)
}

func (s operationStream) journal(ctx context.Context, key string, afterSeq int64) ([]events.Envelope, error) {
	stored, err := s.store.Events(ctx, key, afterSeq)
	if err != nil {
		return nil, err
	}
	out := make([]events.Envelope, len(stored))
	for i, e := range stored {
		out[i] = e.Envelope
	}
	return out, nil
}
