package store

import (
	"context"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store/packed"
	"github.com/jackc/pgx/v5"
)

// Load returns the head record of an operation, or ErrNotFound. For a
// pruned operation the error is a *PrunedError holding its tombstone.
func (s *Store) Load(ctx context.Context, key string) (events.Operation, error) {
	return loadWith(ctx, s.pool, key)
}

// LoadTx is Load inside the caller's transaction.
func LoadTx(ctx context.Context, tx pgx.Tx, key string) (events.Operation, error) {
	return loadWith(ctx, tx, key)
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// HeadColumns are the columns of operations that make up the head's fold;
// a Head scans them in this order. The record is in body (packed, compact
// rows) or in record (plain rows, and rows written before body), and
// leaves out what the other columns hold (events.MarshalOperationBody); a
// record written before it did holds them too, with the same values.
const HeadColumns = `body, record, operation_key, tool, effect_class, payload_hash, status, seq`

// Head is a head row as selected by HeadColumns: scan into Dest, then
// Operation lays the columns over the record.
type Head struct {
	body, record                   []byte
	key, tool, class, hash, status string
	seq                            int64
}

// Dest returns the scan targets of HeadColumns, in order.
func (h *Head) Dest() []any {
	return []any{&h.body, &h.record, &h.key, &h.tool, &h.class, &h.hash, &h.status, &h.seq}
}

// Operation decodes the scanned row.
func (h *Head) Operation() (events.Operation, error) {
	record, err := LoadedJSON(h.record, h.body, h.key)
	if err != nil {
		return events.Operation{}, fmt.Errorf("loading operation %s: %w", h.key, err)
	}
	op, err := events.UnmarshalOperation(record)
	if err != nil {
		return events.Operation{}, fmt.Errorf("loading operation %s: decoding the record: %w", h.key, err)
	}
	op.Key, op.Tool, op.EffectClass, op.PayloadHash = h.key, h.tool, events.EffectClass(h.class), h.hash
	op.Status, op.Seq = events.Status(h.status), h.seq
	return op, nil
}

// CollectHeads reads rows selected as HeadColumns into operations, and
// closes them.
func CollectHeads(rows pgx.Rows) ([]events.Operation, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (events.Operation, error) {
		var h Head
		if err := row.Scan(h.Dest()...); err != nil {
			return events.Operation{}, err
		}
		return h.Operation()
	})
}

func loadWith(ctx context.Context, q querier, key string) (events.Operation, error) {
	var h Head
	var pruned bool
	if err := q.QueryRow(ctx, `SELECT `+HeadColumns+`, pruned_at IS NOT NULL FROM operations WHERE operation_key = $1`, key).
		Scan(append(h.Dest(), &pruned)...); err != nil {
		return events.Operation{}, fmt.Errorf("loading operation %s: %w", key, interpretError(err))
	}
	if pruned {
		return events.Operation{}, prunedError(ctx, q, key)
	}
	return h.Operation()
}

// LoadMany returns the head records of the operations that exist among keys.
// Pruned operations are absent; Tombstones returns theirs.
func (s *Store) LoadMany(ctx context.Context, keys []string) (map[string]events.Operation, error) {
	return loadMany(ctx, s.pool, keys)
}

// LoadManyTx is LoadMany inside the caller's transaction.
func LoadManyTx(ctx context.Context, tx pgx.Tx, keys []string) (map[string]events.Operation, error) {
	return loadMany(ctx, tx, keys)
}

func loadMany(ctx context.Context, q querier, keys []string) (map[string]events.Operation, error) {
	rows, err := q.Query(ctx, `SELECT `+HeadColumns+` FROM operations WHERE operation_key = ANY($1) AND pruned_at IS NULL`, keys)
	if err != nil {
		return nil, fmt.Errorf("loading %d operations: %w", len(keys), interpretError(err))
	}
	heads, err := CollectHeads(rows)
	if err != nil {
		return nil, fmt.Errorf("loading %d operations: %w", len(keys), interpretError(err))
	}
	ops := make(map[string]events.Operation, len(heads))
	for _, op := range heads {
		ops[op.Key] = op
	}
	return ops, nil
}

// StoredEvent is an event as journaled, with the trace context it belongs to.
type StoredEvent struct {
	events.Envelope
	Raw         []byte
	Traceparent string
}

// Events returns the events of an operation with seq greater than afterSeq,
// in order.
func (s *Store) Events(ctx context.Context, key string, afterSeq int64) ([]StoredEvent, error) {
	rows, err := s.pool.Query(ctx, `SELECT envelope, traceparent FROM events
		WHERE operation_key = $1 AND seq > $2 ORDER BY seq`, key, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("loading events of %s: %w", key, interpretError(err))
	}
	defer rows.Close()
	var out []StoredEvent
	for rows.Next() {
		var stored []byte
		var tp string
		if err := rows.Scan(&stored, &tp); err != nil {
			return nil, fmt.Errorf("loading events of %s: %w", key, err)
		}
		raw, err := packed.Unpack(stored, key)
		if err != nil {
			return nil, fmt.Errorf("loading events of %s: %w", key, err)
		}
		env, err := events.Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("loading events of %s: %w", key, err)
		}
		out = append(out, StoredEvent{Envelope: env, Raw: raw, Traceparent: tp})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("loading events of %s: %w", key, err)
	}
	return out, nil
}

// Replay folds the journaled events of an operation from scratch. It is the
// reference the head record and the projection must agree with.
func (s *Store) Replay(ctx context.Context, key string) (events.Operation, error) {
	evs, err := s.Events(ctx, key, 0)
	if err != nil {
		return events.Operation{}, err
	}
	if len(evs) == 0 {
		return events.Operation{}, fmt.Errorf("replaying %s: %w", key, ErrNotFound)
	}
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		envs[i] = e.Envelope
	}
	op, err := events.Fold(envs)
	if err != nil {
		return events.Operation{}, fmt.Errorf("replaying %s: %w", key, err)
	}
	return op, nil
}

// Traceparent returns the trace context stored with an operation's intent.
func (s *Store) Traceparent(ctx context.Context, key string) (string, error) {
	return traceparent(ctx, s.pool, key)
}

// TraceparentTx is Traceparent inside the caller's transaction.
func TraceparentTx(ctx context.Context, tx pgx.Tx, key string) (string, error) {
	return traceparent(ctx, tx, key)
}

func traceparent(ctx context.Context, q querier, key string) (string, error) {
	var tp string
	err := q.QueryRow(ctx, `SELECT traceparent FROM events WHERE operation_key = $1 AND seq = 1`, key).Scan(&tp)
	if err != nil {
		return "", fmt.Errorf("loading the trace context of %s: %w", key, interpretError(err))
	}
	return tp, nil
}

// KeyTimes collects rows of (operation key, time) into a map, and closes
// rows: the load generator's reads of when each operation got somewhere.
func KeyTimes(rows pgx.Rows) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	var (
		key string
		at  time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&key, &at}, func() error {
		out[key] = at
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
