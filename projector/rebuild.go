package projector

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Rebuild batch sizes: events read per query and rows written per statement.
// They bound memory, not transactions: the rebuild is one transaction.
const (
	rebuildReadPage  = 5000
	rebuildWriteRows = 1000
)

// rebuildEventsSQL pages through the whole journal in (operation_key, seq)
// order, the events table's primary key, so every page is an index range
// scan that starts where the last one ended.
//
// It reads the store's table directly: the store offers no scan over every
// operation, and one Store.Events call per operation would cost a round trip
// each.
const rebuildEventsSQL = `
SELECT operation_key, envelope FROM events
 WHERE (operation_key, seq) > ($1, $2)
 ORDER BY operation_key, seq
 LIMIT $3`

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
			afterKey string
			afterSeq int64
			op       events.Operation
			pending  = make([]events.Operation, 0, writeRows)
		)
		flush := func() error {
			if err := upsertTx(ctx, tx, pending); err != nil {
				return err
			}
			written += len(pending)
			pending = pending[:0]
			return nil
		}
		for {
			page, err := readEventsPage(ctx, tx, afterKey, afterSeq, readPage)
			if err != nil {
				return err
			}
			for _, e := range page {
				if op.Seq > 0 && e.OperationKey != op.Key {
					pending = append(pending, op)
					op = events.Operation{}
				}
				next, err := events.Apply(op, e)
				if err != nil {
					return fmt.Errorf("folding %s: %w", e.OperationKey, err)
				}
				op = next
			}
			if len(pending) >= writeRows {
				if err := flush(); err != nil {
					return err
				}
			}
			if len(page) < readPage {
				break
			}
			last := page[len(page)-1]
			afterKey, afterSeq = last.OperationKey, last.Seq
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

func readEventsPage(ctx context.Context, tx pgx.Tx, afterKey string, afterSeq int64, limit int) ([]events.Envelope, error) {
	rows, err := tx.Query(ctx, rebuildEventsSQL, afterKey, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("reading events after %s/%d: %w", afterKey, afterSeq, err)
	}
	page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (events.Envelope, error) {
		var (
			key string
			raw []byte
		)
		if err := row.Scan(&key, &raw); err != nil {
			return events.Envelope{}, err
		}
		e, err := events.Decode(raw)
		if err != nil {
			return events.Envelope{}, fmt.Errorf("journaled event of %s: %w", key, err)
		}
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading events after %s/%d: %w", afterKey, afterSeq, err)
	}
	return page, nil
}
