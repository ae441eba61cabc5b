package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DueOperations returns the keys of operations whose next executor step is
// due at now, oldest first. It takes no locks: the step itself is claimed by
// a conditional append, so two pollers that read the same key race safely
// and one of them wins.
func (s *Store) DueOperations(ctx context.Context, now time.Time, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT operation_key FROM operations
		WHERE due_at <= $1 ORDER BY due_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("finding due operations: %w", interpretError(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("finding due operations: %w", interpretError(err))
	}
	return keys, nil
}

// ExpiredLeases returns the keys of operations whose running step's lease
// ended before now: their worker died or was cut off holding it.
func (s *Store) ExpiredLeases(ctx context.Context, now time.Time, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT operation_key FROM operations
		WHERE status = 'in_progress' AND lease_until < $1 ORDER BY lease_until LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("finding expired leases: %w", interpretError(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("finding expired leases: %w", interpretError(err))
	}
	return keys, nil
}

// Unresolved returns the keys of operations waiting for reconciliation whose
// last change is older than olderThan, oldest first.
func (s *Store) Unresolved(ctx context.Context, olderThan time.Time, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT operation_key FROM operations
		WHERE status = 'needs_reconciliation' AND updated_at <= $1 ORDER BY updated_at LIMIT $2`, olderThan, limit)
	if err != nil {
		return nil, fmt.Errorf("finding unresolved operations: %w", interpretError(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("finding unresolved operations: %w", interpretError(err))
	}
	return keys, nil
}

// ExtendLease moves the lease of a running step forward, for calls that run
// longer than one lease. It changes only the lease column, not the journal:
// a heartbeat is not an event, and the sweep reads the column. It reports
// false when the step is no longer the one at seq (the lease was lost).
func (s *Store) ExtendLease(ctx context.Context, key string, seq int64, until time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE operations SET lease_until = $3
		WHERE operation_key = $1 AND seq = $2 AND status = 'in_progress'`, key, seq, until)
	if err != nil {
		return false, fmt.Errorf("extending the lease of %s: %w", key, interpretError(err))
	}
	return tag.RowsAffected() == 1, nil
}
