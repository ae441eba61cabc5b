package store

import (
	"context"
	"errors"
	"fmt"
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
func LockToolKeysTx(ctx context.Context, tx pgx.Tx, tool string, keys []string) ([]string, error) {
	return lockedKeys(ctx, tx, `SELECT operation_key FROM operations
	WHERE operation_key = ANY($1) AND tool = $2 AND pruned_at IS NULL
	ORDER BY operation_key
	FOR UPDATE`, keys, tool)
}

// LockByDownstreamIDTx locks the head rows of the operations of tool the
// downstream knows by id (index operations_downstream_id) and returns their
// keys.
func LockByDownstreamIDTx(ctx context.Context, tx pgx.Tx, tool, id string) ([]string, error) {
	return lockedKeys(ctx, tx, `SELECT operation_key FROM operations
	WHERE tool = $1 AND record->>'downstream_id' = $2
	ORDER BY operation_key
	FOR UPDATE`, tool, id)
}

func lockedKeys(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]string, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("locking operations: %w", interpretError(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("locking operations: %w", interpretError(err))
	}
	return keys, nil
}
