package projector

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Rebuild batch sizes: events read per query (the store's journal scan) and
// rows written per statement. They bound memory, not transactions: the
// rebuild is one transaction.
const (
	rebuildReadPage  = 5000
	rebuildWriteRows = 1000
)

// Rebuild replaces operation_state with the fold of every operation in the
// event store and returns how many operations it wrote. The result is the
// table the live projector produces: both fold with events.Apply and write
// through the same upsert.
//
// It runs in one transaction that takes an EXCLUSIVE lock on the table and
// deletes every row before writing the new ones. Readers are not blocked:
// they see the old rows until the commit and the new ones after it. Writers
// are: a projector's upsert waits on the lock, then writes only the rows it
// is ahead on. What it folded onto (a cached record, or a row read before
// the lock, since plain reads do not wait) is the fold of the same events to
// an earlier seq, so where it is ahead its row is the one Rebuild would have
// written, and Rebuild may run while projectors do. Events appended during
// the rebuild either are in the pages it has still to read or arrive through
// Kafka afterwards; both end the same.
func Rebuild(ctx context.Context, st *store.Store) (int, error) {
	return rebuild(ctx, st, rebuildReadPage, rebuildWriteRows)
}

// rebuild is Rebuild with its page sizes as parameters, so tests can make
// operations straddle pages.
func rebuild(ctx context.Context, st *store.Store, readPage, writeRows int) (int, error) {
	written := 0
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		written = 0
		// DELETE rather than TRUNCATE: TRUNCATE needs ACCESS EXCLUSIVE,
		// which would block every reader of the API for the whole rebuild.
		if _, err := tx.Exec(ctx, `LOCK TABLE operation_state IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("locking operation_state: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM operation_state`); err != nil {
			return fmt.Errorf("clearing operation_state: %w", err)
		}
		var (
			op      events.Operation
			pending = make([]events.Operation, 0, writeRows)
		)
		flush := func() error {
			if err := upsertTx(ctx, tx, pending); err != nil {
				return err
			}
			written += len(pending)
			pending = pending[:0]
			return nil
		}
		for e, err := range store.JournalTx(ctx, tx, readPage) {
			if err != nil {
				return err
			}
			if op.Seq > 0 && e.OperationKey != op.Key {
				pending = append(pending, op)
				op = events.Operation{}
				if len(pending) >= writeRows {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			next, err := events.Apply(op, e)
			if err != nil {
				return fmt.Errorf("folding %s: %w", e.OperationKey, err)
			}
			op = next
		}
		if op.Seq > 0 {
			pending = append(pending, op)
		}
		return flush()
	})
	if err != nil {
		return 0, fmt.Errorf("rebuilding operation_state: %w", err)
	}
	return written, nil
}
