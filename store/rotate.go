package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The outbox is three partitions, outbox_0 to outbox_2, listed on the slot
// column (migration 0009). Writers fill the current slot, named by the one
// row of outbox_slot; RotateOutbox moves the current slot on and truncates
// the partitions the relay has drained, which gives their heap and index
// space back at once. VACUUM could not keep up with one insert and one
// delete per event and topic, and never shrank the indexes (issue #21).
//
// Why a truncate never takes a row that is not published:
//
//   - TRUNCATE only runs in a transaction that holds the partition's ACCESS
//     EXCLUSIVE lock and, after taking it, found the partition empty with a
//     statement of its own. Under READ COMMITTED that statement's snapshot
//     is taken after the lock was granted.
//   - Every insert into a partition holds ROW EXCLUSIVE on it until its
//     transaction ends, and PostgreSQL releases a transaction's locks only
//     after its commit is visible. So an insert that has not ended when the
//     truncate asks for the lock makes it wait (or give up at its
//     lock_timeout, to try again later); once granted, every insert into
//     the partition either rolled back or committed and shows in the
//     emptiness check, which then keeps the truncate from running.
//   - An insert that comes after the truncate (a writer whose snapshot
//     still named the old slot, waiting behind the lock) lands in a
//     partition that is still attached: the relay reads all three, and the
//     next truncate of that partition finds the row.
//
// So which slot is current matters for speed only (a truncate waits for
// the writers of its partition, and the current one always has some),
// never for safety. The partitions are never detached or dropped.
//
// The relay's delete of the rows it published commits asynchronously; a
// truncate that follows it is a synchronous commit later in the WAL, so a
// crash cannot keep the truncate and lose the delete; and losing either
// would only republish rows Kafka already has.
//
// TRUNCATE names no operation key: it is one of the allowed fan-out
// statements (docs/design.md, "Beyond one primary"); on a distributed store
// it runs per shard, as the relay does.

// outboxSlots is the number of outbox partitions: the current one, the one
// the relay drains after a rotation, and one truncated, ready to be
// current. Keep it in step with migration 0009.
const outboxSlots = 3

// rotateLockID is the transaction-scoped advisory lock that serializes the
// rotators of all the relays on a database, so they do not fight over the
// same partition locks.
const rotateLockID = 0x6f7574626f78 // "outbox"

// outboxPartition is the name of slot's partition, a trusted identifier.
func outboxPartition(slot int) string { return fmt.Sprintf("outbox_%d", slot) }

// RotateOptions tune one RotateOutbox call.
type RotateOptions struct {
	// Every is how long a slot stays current before it is moved on.
	Every time.Duration
	// LockTimeout bounds how long a truncate waits for a partition's lock.
	// While it waits, every claim and every writer of that partition waits
	// behind it, so it is short; a truncate that gives up is tried again
	// by the next call. Default 100ms.
	LockTimeout time.Duration
}

// DefaultRotateLockTimeout is RotateOptions.LockTimeout's default.
const DefaultRotateLockTimeout = 100 * time.Millisecond

// OutboxRotation is what one RotateOutbox call did.
type OutboxRotation struct {
	// Rotated says the current slot moved on; Slot is the current slot
	// after the call.
	Rotated bool
	Slot    int
	// Truncated counts the partitions truncated; Busy the ones whose lock
	// was not granted within LockTimeout; Undrained the ones that still
	// held rows (the relay has not published them yet).
	Truncated, Busy, Undrained int
	// Contended says another rotator held the lock, so this call did
	// nothing.
	Contended bool
}

// rotateStateSQL reads the current slot, whether it has been current for
// at least $1, and for each partition whether it was written since it was
// last truncated: a heap page, or an index grown past its metapage (an
// index of a freshly truncated table is the metapage alone).
const rotateStateSQL = `
SELECT s.slot, now() - s.rotated_at >= $1::interval,
       ARRAY(SELECT pg_relation_size(u.p) > 0
                    OR EXISTS (SELECT 1 FROM pg_index i
                                WHERE i.indrelid = u.p
                                  AND pg_relation_size(i.indexrelid) > current_setting('block_size')::bigint)
               FROM unnest($2::text[]::regclass[]) WITH ORDINALITY AS u(p, n)
              ORDER BY u.n)
  FROM outbox_slot s`

type rotateState struct {
	slot int
	due  bool
	used []bool
}

func readRotateState(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, every time.Duration) (rotateState, error) {
	names := make([]string, outboxSlots)
	for i := range names {
		names[i] = outboxPartition(i)
	}
	var st rotateState
	var slot int16
	if err := q.QueryRow(ctx, rotateStateSQL, every, names).Scan(&slot, &st.due, &st.used); err != nil {
		return rotateState{}, err
	}
	st.slot = int(slot)
	if len(st.used) != outboxSlots {
		return rotateState{}, fmt.Errorf("outbox has %d partitions, want %d", len(st.used), outboxSlots)
	}
	return st, nil
}

// RotateOutbox truncates the outbox partitions that are not current, were
// written since their last truncate and are drained, and then, if the
// current slot has been current for opts.Every and the next one is freshly
// truncated, makes the next one current. Each step is a transaction of its
// own under a transaction-scoped advisory lock, so rotators on several
// relays take turns and one that finds the lock taken does nothing
// (Contended). A partition that is busy or not drained is left for a later
// call; nothing here waits longer than opts.LockTimeout for a lock.
//
// The rotation does not wait for the old slot's writers: a writer that
// read the slot before the rotation commits into the old partition, which
// the relay still drains (see the comment at the top of this file).
func (s *Store) RotateOutbox(ctx context.Context, opts RotateOptions) (OutboxRotation, error) {
	if opts.Every <= 0 {
		return OutboxRotation{}, fmt.Errorf("rotating the outbox: Every must be positive, got %s", opts.Every)
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultRotateLockTimeout
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return OutboxRotation{}, fmt.Errorf("rotating the outbox: %w", interpretError(err))
	}
	defer conn.Release()

	// A first look without the lock picks the candidates; each is checked
	// again under it.
	st, err := readRotateState(ctx, conn, opts.Every)
	if err != nil {
		return OutboxRotation{}, fmt.Errorf("rotating the outbox: reading the slot: %w", interpretError(err))
	}
	var res OutboxRotation
	for p := range outboxSlots {
		if p == st.slot || !st.used[p] {
			continue
		}
		// Drained? Asked first without the partition's lock, so a partition
		// the relay has not emptied yet (its rows visible) costs no one a
		// wait; asked again under the lock, which is the check that counts.
		var busy bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+outboxPartition(p)+`)`).Scan(&busy); err != nil {
			return res, fmt.Errorf("rotating the outbox: reading %s: %w", outboxPartition(p), interpretError(err))
		}
		if busy {
			res.Undrained++
			continue
		}
		outcome, err := s.truncatePartition(ctx, conn, p, opts)
		if err != nil {
			return res, err
		}
		switch outcome {
		case truncated:
			res.Truncated++
		case lockBusy:
			res.Busy++
		case notDrained:
			res.Undrained++
		case contended:
			res.Contended = true
			return res, nil
		}
	}

	err = rotateTx(ctx, conn, func(tx pgx.Tx) error {
		st, err := readRotateState(ctx, tx, opts.Every)
		if err != nil {
			return err
		}
		res.Slot = st.slot
		next := (st.slot + 1) % outboxSlots
		// Only into a partition truncated since it was last written: one
		// that still holds its dead rows would stay current, and so
		// untruncatable, for another period.
		if !st.due || st.used[next] {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_slot SET slot = $1, rotated_at = now()`, next); err != nil {
			return err
		}
		res.Rotated, res.Slot = true, next
		return nil
	})
	if errors.Is(err, errRotateContended) {
		res.Contended = true
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("rotating the outbox: moving the slot: %w", interpretError(err))
	}
	return res, nil
}

type truncateOutcome int

const (
	truncated truncateOutcome = iota
	lockBusy
	notDrained
	contended
	current
)

// truncatePartition truncates partition p if it is empty once its ACCESS
// EXCLUSIVE lock is held (see the top of this file for why that is safe).
func (s *Store) truncatePartition(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, p int, opts RotateOptions) (truncateOutcome, error) {
	name := outboxPartition(p)
	outcome := truncated
	err := rotateTx(ctx, conn, func(tx pgx.Tx) error {
		// Still not current? Only a rotator moves the slot, and this one
		// holds the rotators' lock. (Truncating the current partition would
		// be just as safe, only slower for its writers.)
		var slot int16
		if err := tx.QueryRow(ctx, `SELECT slot FROM outbox_slot`).Scan(&slot); err != nil {
			return err
		}
		if int(slot) == p {
			outcome = current
			return nil
		}
		// lock_timeout covers the LOCK only in effect: the statements after
		// it run under the lock and wait for nobody.
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, opts.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+name+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
				outcome = lockBusy
				return errRotateGaveUp
			}
			return err
		}
		// A statement of its own, so its snapshot is taken now, under the
		// lock: every insert into the partition has ended and shows.
		var busy bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+name+`)`).Scan(&busy); err != nil {
			return err
		}
		if busy {
			outcome = notDrained
			return errRotateGaveUp
		}
		_, err := tx.Exec(ctx, `TRUNCATE `+name)
		return err
	})
	switch {
	case errors.Is(err, errRotateContended):
		return contended, nil
	case errors.Is(err, errRotateGaveUp):
		return outcome, nil
	case err != nil:
		return outcome, fmt.Errorf("rotating the outbox: truncating %s: %w", name, interpretError(err))
	}
	return outcome, nil
}

var (
	errRotateContended = errors.New("another rotator holds the lock")
	errRotateGaveUp    = errors.New("rolled back on purpose")
)

// rotateTx runs fn in a READ COMMITTED transaction that holds the rotators'
// advisory lock, or returns errRotateContended. READ COMMITTED explicitly,
// whatever default_transaction_isolation says: the emptiness check must
// take its snapshot after the partition's lock is granted, and under
// REPEATABLE READ the snapshot would be the transaction's first one.
func rotateTx(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(pgx.Tx) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	// WithoutCancel: a cancelled ctx must still end the transaction, or
	// its locks linger.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`); err != nil {
		return err
	}
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, rotateLockID).Scan(&got); err != nil {
		return err
	}
	if !got {
		return errRotateContended
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
