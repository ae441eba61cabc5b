package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Row locks on the head records, for writers that decide inside a
// transaction of their own (the reconciler's lease expiry and webhooks) and
// must keep every other writer off the row between their read and their
// AppendTx.

// LockLeaseTx locks the head row of an operation still in_progress at seq
// and returns its lease_until column, which the executor's heartbeats renew
// without a new record (so the record's own lease may be stale). An
// operation that moved on is a *ConflictError.
func LockLeaseTx(ctx context.Context, tx pgx.Tx, key string, seq int64) (*time.Time, error) {
	var leaseUntil *time.Time
	err := tx.QueryRow(ctx, `SELECT lease_until FROM operations
	WHERE operation_key = $1 AND seq = $2 AND status = 'in_progress'
	FOR UPDATE`, key, seq).Scan(&leaseUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &ConflictError{OperationKey: key, ExpectedSeq: seq}
	}
	if err != nil {
		return nil, fmt.Errorf("locking the lease of %s: %w", key, interpretError(err))
	}
	return leaseUntil, nil
}

// LockToolKeysTx locks the head rows of those of keys that are operations of
// tool, in key order (so two callers never deadlock), and returns their keys.
//
// Each row is locked by a statement naming its one key, pipelined in one
// round trip: a distributed store (docs/design.md, "Beyond one primary")
// locks rows only in a statement routed to one shard, and a statement over
// a set of keys may span several.
func LockToolKeysTx(ctx context.Context, tx pgx.Tx, tool string, keys []string) ([]string, error) {
	return lockEach(ctx, tx, keys, lockToolKeySQL, tool)
}

const lockToolKeySQL = `SELECT operation_key FROM operations
	WHERE operation_key = $1 AND tool = $2 AND pruned_at IS NULL
	FOR UPDATE`

// LockByDownstreamIDTx locks the head rows of the operations of tool the
// downstream knows by id and returns their keys, in key order. The id is in
// the downstream_id column of compact rows (index
// operations_by_downstream_id, migration 0017) and in the record of plain
// rows and rows written before the column (index operations_downstream_id):
// migration 0013.
//
// The keys are found first without a lock and then locked one by one, the
// condition checked again under each lock, for the same reason as in
// LockToolKeysTx: the lookup by id is the one that cannot name a key. A
// row that comes to match between the two is missed, as the single
// statement missed a row that came to match after its snapshot.
func LockByDownstreamIDTx(ctx context.Context, tx pgx.Tx, tool, id string) ([]string, error) {
	rows, err := tx.Query(ctx, byDownstreamIDSQL, tool, id)
	if err != nil {
		return nil, fmt.Errorf("locking operations: %w", interpretError(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("locking operations: %w", interpretError(err))
	}
	return lockEach(ctx, tx, keys, lockDownstreamIDSQL, tool, id)
}

const byDownstreamIDSQL = `SELECT operation_key FROM operations
	WHERE tool = $1 AND (downstream_id = $2 OR record->>'downstream_id' = $2)`

const lockDownstreamIDSQL = `SELECT operation_key FROM operations
	WHERE operation_key = $1 AND tool = $2 AND (downstream_id = $3 OR record->>'downstream_id' = $3)
	FOR UPDATE`

// lockEach runs sql (its $1 the key, then args) once per distinct key, in
// key order, in one pipelined round trip, and returns the keys it locked.
// The statements of a pipeline run one after the other, so the locks are
// taken in key order as a single ORDER BY … FOR UPDATE took them.
func lockEach(ctx context.Context, tx pgx.Tx, keys []string, sql string, args ...any) ([]string, error) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if len(keys) == 0 {
		return nil, nil
	}
	var b pgx.Batch
	for _, k := range keys {
		b.Queue(sql, append([]any{k}, args...)...)
	}
	br := tx.SendBatch(ctx, &b)
	var locked []string
	for range keys {
		var k string
		err := br.QueryRow().Scan(&k)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("locking operations: %w", interpretError(err))
		}
		locked = append(locked, k)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("locking operations: %w", interpretError(err))
	}
	return locked, nil
}
