package projector

import (
	"context"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
)

// SettledRow is when an operation's terminal row got where it is.
type SettledRow struct {
	Status events.Status
	// UpdatedAt is when its last event occurred: the outcome journaled.
	UpdatedAt time.Time
	// ProjectedAt is when the row was last written.
	ProjectedAt time.Time
}

// settledSQL reads only the rows it is asked for, by primary key: the load
// generator asks it about the operations it has in flight, so the cost of
// its progress check depends on what is in flight, never on how many rows
// the table holds (a count(*) over the table scanned it all).
const settledSQL = `SELECT operation_key, status, updated_at, projected_at FROM operation_state
 WHERE operation_key = ANY($1) AND status = ANY($2)`

// Settled returns the rows of those of keys that the read model holds in a
// terminal status (completed, failed, compensated).
func (r *Reader) Settled(ctx context.Context, keys []string) (map[string]SettledRow, error) {
	var terminal []string
	for _, s := range events.Statuses() {
		if s.Terminal() {
			terminal = append(terminal, string(s))
		}
	}
	rows, err := r.pool.Query(ctx, settledSQL, keys, terminal)
	if err != nil {
		return nil, fmt.Errorf("reading %d settled operations: %w", len(keys), err)
	}
	defer rows.Close()
	out := make(map[string]SettledRow, len(keys))
	for rows.Next() {
		var (
			key, status string
			s           SettledRow
		)
		if err := rows.Scan(&key, &status, &s.UpdatedAt, &s.ProjectedAt); err != nil {
			return nil, fmt.Errorf("reading settled operations: %w", err)
		}
		s.Status = events.Status(status)
		out[key] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading settled operations: %w", err)
	}
	return out, nil
}
