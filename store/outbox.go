package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store/packed"
	"github.com/jackc/pgx/v5"
)

// OutboxEvent is one outbox row claimed for publishing: an event and the
// topic it goes to.
type OutboxEvent struct {
	// ID is the outbox row. It orders the claim for fairness only.
	ID    int64
	Topic string
	// Envelope is the decoded event; Raw is the exact bytes journaled, which
	// are what gets published.
	Envelope    events.Envelope
	Raw         []byte
	Traceparent string
}

// claimOutboxSQL locks up to $1 outbox rows that nobody else holds, oldest
// first, with the event each one publishes and whether the order guard lets
// it go now (see RelayBatch). LIMIT applies after SKIP
// LOCKED (the lock step runs under the limit), so rows held by another relay
// do not use up the batch. ORDER BY id is for fairness only: ids commit out
// of order, so nothing here treats them as a cursor; a row that commits late
// with a low id is simply picked up by the next claim.
//
// Each claimed row reads its event by primary key: LIMIT 1 keeps the
// LATERAL from being flattened into a join, which the planner, reusing a
// generic plan made while the tables were small, ran as a hash join over a
// sequential scan of the whole journal.
//
// The outbox is partitioned (migration 0009, store/rotate.go), so the claim
// is a Merge Append of the partitions' (id, slot) indexes. ids grow with
// time, so the oldest rows, in the partition drained after a rotation, go
// first and that partition empties soon enough to be truncated; an index
// scan of a truncated partition costs one page. What the claim walks over
// is the dead entries of the partitions not yet truncated: about one
// rotation period's rows, where the unpartitioned outbox walked everything
// deleted since autovacuum's last pass.
//
// The guard is one probe per claimed row and partition on the
// (operation_key, topic, seq) index: is there a lower seq of the same pair
// still in the outbox, in any partition, that this claim does not hold? So
// seq n waiting in the old partition holds back seq n+1 in the new one. It
// reads the statement's snapshot without locking, so rows held by another
// relay and rows beyond the LIMIT count as "not ours".
const claimOutboxSQL = `
WITH claim AS MATERIALIZED (
    SELECT o.id, o.operation_key, o.seq, o.topic
      FROM outbox o
     ORDER BY o.id
     LIMIT $1
       FOR UPDATE OF o SKIP LOCKED
)
SELECT c.id, c.operation_key, c.seq, c.topic, e.envelope, e.traceparent,
       NOT EXISTS (
           SELECT 1 FROM outbox b
            WHERE b.operation_key = c.operation_key AND b.topic = c.topic AND b.seq < c.seq
              AND b.id <> ALL (ARRAY(SELECT id FROM claim))) AS publishable
  FROM claim c
 CROSS JOIN LATERAL (
       SELECT e.envelope, e.traceparent FROM events e
        WHERE e.operation_key = c.operation_key AND e.seq = c.seq
        LIMIT 1) e`

// relayPlanningSQL sets how the relay's transaction plans its claim and
// its delete: once per connection, as generic plans, with plain index
// scans only.
//
// Statistics of the outbox partitions say little: each is truncated every
// rotation and fills again, and a VACUUM of an empty one (a database-wide
// VACUUM, the bench's after seeding a history) records zero rows. A plan
// made then, by cost, scans the partition for every claimed row's order
// guard and every delete, for as long as the connection keeps it, while
// the partition fills with a rotation period's rows: flat out fell to under
// half on a history database (docs/benchmarks.md, session 16). Planning
// each batch with its values (force_custom_plan, sessions 16 and 17)
// avoided that and cost more than running the statements: at 500
// operations/s the claim and the delete spent 0.18 ms of PostgreSQL's CPU
// per operation in the planner, 0.09 ms executing (pg_stat_statements,
// docs/benchmarks.md, session 18).
//
// Every table the two statements read has the index each lookup needs, and
// each lookup reads a few rows of one key or id (a claimed row's event,
// the order guard's lower seqs, the rows to delete): an index scan is the
// right plan whatever the partitions hold. So the plan is made without
// sequential scans (enable_seqscan off charges them so much that the
// planner takes the index) and without bitmap scans (noBitmapScans), and
// then reused (force_generic_plan) until an invalidation (a rotation's
// TRUNCATE) has it made again, under the same settings, which this
// transaction sets before either statement runs. PostgreSQL does not
// re-plan a cached statement when a setting changes, so these settings
// must come first in every transaction that runs either statement; only
// RelayBatch runs them.
const relayPlanningSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), ` + noBitmapScans

// noBitmapScans, in a SELECT, plans the rest of its transaction without
// bitmap scans (is_local: the setting ends with the transaction). The
// journal's index on operation_key is not unique (migration 0016), so the
// planner expects two or three events per key, or 0.5 % of the journal
// before its first ANALYZE, and at the default random_page_cost plans a
// bitmap scan of them; building and reading a bitmap for three rows cost
// flat out more than the smaller index saved (docs/benchmarks.md, session
// 17). The two transactions that look up single events on the hot path
// set it: the relay's (relayPlanningSQL) and an append batch holding an
// append after an intent (intentProbePlanningSQL).
const noBitmapScans = `set_config('enable_bitmapscan', 'off', true)`

// deleteOutboxSQL names the rows' operation keys beside their ids, which
// the ids alone would make redundant: on a distributed store the keys route
// the delete to the shards holding the rows (docs/design.md, "Beyond one
// primary").
const deleteOutboxSQL = `DELETE FROM outbox WHERE operation_key = ANY($2::text[]) AND id = ANY($1::bigint[])`

// RelayBatch publishes one batch of the outbox, at least once and in order
// per operation and topic, in one transaction of two round trips:
//
//  1. claim: BEGIN and, pipelined with it, one statement that locks up to
//     limit rows with FOR UPDATE SKIP LOCKED, so relays running side by side
//     take disjoint rows, and tells for each whether the order guard keeps
//     it: whether it is the lowest seq of its (operation_key, topic) still
//     in the outbox apart from the rows this claim holds (see below);
//  2. publish: call publish with the kept rows, sorted by topic, operation
//     key and seq; the row locks are held meanwhile, which is what keeps a
//     second relay from publishing the same rows at the same time;
//  3. mark: delete the published rows and COMMIT, pipelined.
//
// The guard closes this race: relays A and B claim concurrently, A locks
// seq 1 of an operation and B, skipping it, locks seq 2. Without the guard
// B could publish seq 2 before A publishes seq 1. With it B sees seq 1 still
// in the outbox, not held by B, and leaves seq 2 for a later round (its lock
// ends with B's transaction). The claim and the guard read one snapshot.
// Seq n+1 of an operation is only ever written after the transaction that
// wrote seq n committed (the append of n+1 is conditional on the head being
// at n), so if the snapshot holds seq n+1 it holds seq n too, unless seq n's
// delete had committed, after Kafka acknowledged it.
//
// publish is never called with an empty batch. If publish fails, nothing
// is deleted and the rows are published again by a later batch. If the
// process dies (or the database connection drops) after publish but before
// the commit, the rows are published again too: delivery is at least once,
// and consumers deduplicate by (operation_key, seq).
//
// skipped counts the claimed rows the guard held back.
func (s *Store) RelayBatch(ctx context.Context, limit int, publish func([]OutboxEvent) error) (published, skipped int, err error) {
	if limit <= 0 {
		return 0, 0, fmt.Errorf("relay batch: limit must be positive, got %d", limit)
	}
	if publish == nil {
		return 0, 0, errNoPublish
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("relay batch: %w", interpretError(err))
	}
	defer conn.Release()
	inTx := false
	// WithoutCancel: a cancelled ctx must still end the transaction, or its
	// locks linger until the pool notices the connection.
	defer func() {
		if !inTx {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
			// The connection's state is unknown: do not give it back.
			_ = conn.Conn().Close(rctx)
		}
	}()

	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(relayPlanningSQL)
	b.Queue(claimOutboxSQL, limit)
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec()
	inTx = err == nil
	if err == nil {
		_, err = br.Exec()
	}
	var kept []OutboxEvent
	if err == nil {
		kept, skipped, err = readClaim(br)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("relay batch: claiming: %w", interpretError(cerr))
	}
	if err != nil {
		return 0, 0, err
	}
	if len(kept) == 0 {
		return 0, skipped, nil
	}
	if err := publish(kept); err != nil {
		return 0, skipped, fmt.Errorf("relay batch: publishing %d events: %w", len(kept), err)
	}

	// Kafka has the events now. From here a cancelled ctx must not undo the
	// mark: that would only republish, but there is no reason to. The
	// timeout bounds a hung server.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	ids := make([]int64, len(kept))
	keys := make([]string, 0, len(kept))
	for i, e := range kept {
		ids[i] = e.ID
		if i == 0 || e.Envelope.OperationKey != kept[i-1].Envelope.OperationKey {
			keys = append(keys, e.Envelope.OperationKey)
		}
	}
	// synchronous_commit off for this transaction only: it wrote nothing
	// but the delete, and a delete lost in a crash only means the rows are
	// published once more, which consumers deduplicate by (key, seq). Not
	// waiting for the WAL flush takes a disk round trip off every batch.
	var m pgx.Batch
	m.Queue(`SET LOCAL synchronous_commit = off`)
	m.Queue(deleteOutboxSQL, ids, keys)
	m.Queue("COMMIT")
	if err := conn.SendBatch(mctx, &m).Close(); err != nil {
		return 0, skipped, fmt.Errorf("relay batch: marking %d events published: %w", len(kept), interpretError(err))
	}
	inTx = false
	return len(kept), skipped, nil
}

// readClaim reads the claim's rows and returns the ones the guard keeps,
// sorted by topic, operation key and seq, and how many it held back.
func readClaim(br pgx.BatchResults) (kept []OutboxEvent, held int, err error) {
	rows, err := br.Query()
	if err != nil {
		return nil, 0, fmt.Errorf("relay batch: claiming: %w", interpretError(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			e           OutboxEvent
			key         string
			seq         int64
			publishable bool
		)
		var stored []byte
		if err := rows.Scan(&e.ID, &key, &seq, &e.Topic, &stored, &e.Traceparent, &publishable); err != nil {
			return nil, 0, fmt.Errorf("relay batch: claiming: %w", err)
		}
		if !publishable {
			held++
			continue
		}
		e.Raw, err = packed.Unpack(stored, key)
		if err != nil {
			return nil, 0, fmt.Errorf("relay batch: outbox row %d (%s seq %d): %w", e.ID, key, seq, err)
		}
		// Raw is published as is; the relay needs the envelope's attributes
		// for the headers. The strict decoder is the cheap one (1.8 µs
		// against 7–8 µs for json.Unmarshal into an Envelope), so every row
		// is checked against the contract on its way out, and against its
		// own key and seq. A row that fails is not skipped silently: the
		// relay stops on it and says which row, because publishing around
		// it would break the order of its operation and dropping it would
		// lose an event.
		env, err := events.Decode(e.Raw)
		if err != nil {
			return nil, 0, fmt.Errorf("relay batch: outbox row %d (%s seq %d): decoding the event: %w", e.ID, key, seq, err)
		}
		e.Envelope = env
		if env.OperationKey != key || env.Seq != seq {
			return nil, 0, fmt.Errorf("relay batch: outbox row %d (%s seq %d): the journaled event is %s seq %d: %w",
				e.ID, key, seq, env.OperationKey, env.Seq, events.ErrInvalidEvent)
		}
		kept = append(kept, e)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("relay batch: claiming: %w", interpretError(err))
	}
	slices.SortFunc(kept, func(a, b OutboxEvent) int {
		return cmp.Or(
			cmp.Compare(a.Topic, b.Topic),
			cmp.Compare(a.Envelope.OperationKey, b.Envelope.OperationKey),
			cmp.Compare(a.Envelope.Seq, b.Envelope.Seq),
		)
	})
	return kept, held, nil
}

// OutboxBacklog returns how many rows wait in the outbox and when the
// oldest was written (the zero time when it is empty): the relay's lag. The
// count is exact; the outbox only holds the backlog, so it stays cheap.
func (s *Store) OutboxBacklog(ctx context.Context) (count int64, oldest time.Time, err error) {
	var at *time.Time
	if err := s.pool.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox`).Scan(&count, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("reading the outbox backlog: %w", interpretError(err))
	}
	if at != nil {
		oldest = *at
	}
	return count, oldest, nil
}

// errNoPublish reports a nil callback, a wiring mistake.
var errNoPublish = errors.New("relay batch: no publish function")
