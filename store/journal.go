package store

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store/packed"
)

// JournalTx streams every journaled event inside the caller's transaction,
// in (operation_key, seq) order: each operation's events in seq order, one
// operation after the other. It reads pageSize events per query; each page
// is a range scan of the events table's primary key that starts where the
// last one ended, so the whole journal is read without an offset and
// without holding it in memory. The first error ends the sequence.
func JournalTx(ctx context.Context, tx pgx.Tx, pageSize int) iter.Seq2[events.Envelope, error] {
	return func(yield func(events.Envelope, error) bool) {
		var (
			afterKey string
			afterSeq int64
		)
		for {
			page, err := journalPage(ctx, tx, afterKey, afterSeq, pageSize)
			if err != nil {
				yield(events.Envelope{}, err)
				return
			}
			for _, e := range page {
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < pageSize {
				return
			}
			last := page[len(page)-1]
			afterKey, afterSeq = last.OperationKey, last.Seq
		}
	}
}

// journalPageSQL reads the journal after (key, seq): a range scan of the
// primary key from that row on, so a page costs the same however deep
// into the journal it starts.
const journalPageSQL = `SELECT operation_key, envelope FROM events
	WHERE (operation_key, seq) > ($1, $2)
	ORDER BY operation_key, seq
	LIMIT $3`

func journalPage(ctx context.Context, tx pgx.Tx, afterKey string, afterSeq int64, limit int) ([]events.Envelope, error) {
	rows, err := tx.Query(ctx, journalPageSQL, afterKey, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("reading events after %s/%d: %w", afterKey, afterSeq, interpretError(err))
	}
	page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (events.Envelope, error) {
		var (
			key    string
			stored []byte
		)
		if err := row.Scan(&key, &stored); err != nil {
			return events.Envelope{}, err
		}
		return journaledEvent(key, stored)
	})
	if err != nil {
		return nil, fmt.Errorf("reading events after %s/%d: %w", afterKey, afterSeq, interpretError(err))
	}
	return page, nil
}

// FirstEventTimes returns, for the operations named by keys, when each of
// types first occurred, by type and operation key. It is for benchmarks
// and reports, not for a hot path. It takes the keys rather than a prefix
// because a prefix match is a sequential scan of the whole journal (no
// index serves starts_with or LIKE under a non-"C" collation), which after
// millions of operations of history is gigabytes read per report; = ANY
// walks the primary key. Compact rows leave the type column empty
// (StoredEventType), so their type comes from the envelope.
func (s *Store) FirstEventTimes(ctx context.Context, keys []string, types ...events.Type) (map[events.Type]map[string]time.Time, error) {
	out := make(map[events.Type]map[string]time.Time, len(types))
	for _, t := range types {
		out[t] = map[string]time.Time{}
	}
	fail := func(err error) error {
		return fmt.Errorf("reading first event times of %d operations: %w", len(keys), interpretError(err))
	}
	rows, err := s.pool.Query(ctx, `SELECT operation_key, type, occurred_at, CASE WHEN type = '' THEN envelope END
		FROM events WHERE operation_key = ANY($1)`, keys)
	if err != nil {
		return nil, fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key    string
			typ    string
			at     time.Time
			stored []byte
		)
		if err := rows.Scan(&key, &typ, &at, &stored); err != nil {
			return nil, fail(err)
		}
		t, err := eventType(key, typ, stored)
		if err != nil {
			return nil, fail(err)
		}
		if byKey, ok := out[t]; ok {
			if first, seen := byKey[key]; !seen || at.Before(first) {
				byKey[key] = at
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fail(err)
	}
	return out, nil
}

// eventType is the type of a journal row of key: its type column, or,
// where a compact row left that empty, its envelope's.
func eventType(key, column string, stored []byte) (events.Type, error) {
	if column != "" {
		return events.Type(column), nil
	}
	e, err := journaledEvent(key, stored)
	return e.Type, err
}

// journaledEvent decodes an envelope as a journal row of key stores it.
func journaledEvent(key string, stored []byte) (events.Envelope, error) {
	raw, err := packed.Unpack(stored, key)
	if err != nil {
		return events.Envelope{}, fmt.Errorf("journaled event of %s: %w", key, err)
	}
	e, err := events.Decode(raw)
	if err != nil {
		return events.Envelope{}, fmt.Errorf("journaled event of %s: %w", key, err)
	}
	return e, nil
}
