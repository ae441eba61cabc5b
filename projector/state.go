package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/store"
)

// This file holds every statement that writes operation_state and the one
// mapping from an events.Operation to a row. The live projector and Rebuild
// both go through upsertSQL and rowsOf, so a rebuilt row cannot differ from a
// projected one by how its columns were derived.

// lockRowsSQL loads the current records of a batch's operations and locks
// them for the rest of the flush transaction. The row locks are what make a
// concurrent Rebuild (which holds an EXCLUSIVE table lock) and a second
// projector replica (briefly owning the same partition during a rebalance)
// wait instead of folding onto a record that is being replaced. ORDER BY
// fixes the locking order so two flushes never deadlock on each other.
const lockRowsSQL = `
SELECT record FROM operation_state
 WHERE operation_key = ANY($1)
 ORDER BY operation_key
   FOR UPDATE`

// upsertSQL writes rows given as parallel arrays, one statement for the whole
// batch. The WHERE clause of the update is the idempotence guard: a row is
// only ever replaced by one with a higher last_seq. Since every row is the
// fold of its operation's events up to last_seq, whichever writer gets there
// writes the same row, and a writer that lost a race (a replica that still
// held a partition during a rebalance) cannot move a row backwards.
const upsertSQL = `
INSERT INTO operation_state (
    operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
    lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
    escalation, last_seq, record, created_at, updated_at, projected_at)
SELECT u.operation_key, u.tool, u.effect_class, u.payload_hash, u.principal, u.status, u.phase, u.attempt,
       u.lease_until, u.result::jsonb, u.downstream_id, u.undo_ref, u.last_error_class, u.compensations, u.evidence,
       u.escalation::jsonb, u.last_seq, u.record::jsonb, u.created_at, u.updated_at, now()
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[],
              $9::timestamptz[], $10::text[], $11::text[], $12::text[], $13::text[], $14::integer[], $15::integer[],
              $16::text[], $17::bigint[], $18::text[], $19::timestamptz[], $20::timestamptz[])
       AS u(operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
            lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
            escalation, last_seq, record, created_at, updated_at)
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
    created_at       = EXCLUDED.created_at,
    updated_at       = EXCLUDED.updated_at,
    projected_at     = EXCLUDED.projected_at
 WHERE operation_state.last_seq < EXCLUDED.last_seq`

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
	records                                                    []string
	created, updated                                           []time.Time
}

// rowsOf maps operations to rows. Only records that have been through
// events.Apply are written, so a failure here is a bug, not bad input.
func rowsOf(ops []events.Operation) (*rows, error) {
	r := &rows{}
	for _, op := range ops {
		record, err := json.Marshal(op)
		if err != nil {
			return nil, fmt.Errorf("encoding the record of %s: %w", op.Key, err)
		}
		// jsonb cannot hold NUL; the journal keeps the exact bytes.
		record = store.JSONBSafe(record)
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
		r.records = append(r.records, string(record))
		r.created = append(r.created, op.CreatedAt)
		r.updated = append(r.updated, op.UpdatedAt)
	}
	return r, nil
}

func (r *rows) args() []any {
	return []any{r.keys, r.tools, r.classes, r.hashes, r.principals, r.statuses, r.phases, r.attempts,
		r.leases, r.results, r.downstreamIDs, r.undoRefs, r.errorClasses, r.compensations, r.evidence,
		r.escalations, r.seqs, r.records, r.created, r.updated}
}

// upsertTx writes ops inside tx and returns how many rows changed.
func upsertTx(ctx context.Context, tx pgx.Tx, ops []events.Operation) (int64, error) {
	if len(ops) == 0 {
		return 0, nil
	}
	r, err := rowsOf(ops)
	if err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, upsertSQL, r.args()...)
	if err != nil {
		return 0, fmt.Errorf("writing %d operation states: %w", len(ops), err)
	}
	return tag.RowsAffected(), nil
}

// lockRecordsTx loads and locks the stored records of keys; operations not
// projected yet are absent from the map. It is the first statement of a
// flush transaction and shares its round trip with the commit mode.
func lockRecordsTx(ctx context.Context, tx pgx.Tx, keys []string, syncCommit bool) (map[string]events.Operation, error) {
	var b pgx.Batch
	if !syncCommit {
		// The read model is derived data: a write lost to a database crash
		// after its commit returned is redone from the event store (see
		// Config.SynchronousCommit), so it does not need its own WAL flush.
		// Without one, a commit costs no fsync and the projector keeps pace
		// with the executors' synchronous commits on the same server.
		b.Queue(`SET LOCAL synchronous_commit = off`)
	}
	b.Queue(lockRowsSQL, keys)
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	if !syncCommit {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("setting the commit mode: %w", err)
		}
	}
	rs, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("loading %d operation states: %w", len(keys), err)
	}
	records, err := pgx.CollectRows(rs, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("loading %d operation states: %w", len(keys), err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("loading %d operation states: %w", len(keys), err)
	}
	ops := make(map[string]events.Operation, len(records))
	for _, rec := range records {
		var op events.Operation
		if err := json.Unmarshal(rec, &op); err != nil {
			return nil, fmt.Errorf("decoding a stored operation state: %w", err)
		}
		ops[op.Key] = op
	}
	return ops, nil
}
