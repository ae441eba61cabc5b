package pruner

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// leader elects the one replica that prunes in the background, the way the
// reconciler elects its sweeper: a session-level advisory lock
// (pg_try_advisory_lock) on a connection taken out of the pool for as long
// as the replica leads. The lock needs no table, no renewal and no clock
// agreement; it ends with the session, so a leader that crashes or is cut
// off loses it, and the others try again at every interval.
//
// The lock only saves work: the prune statements lock their rows with SKIP
// LOCKED, so two replicas pruning at once (a leader cut off but not yet
// aware of it) take disjoint operations and neither fails.
type leader struct {
	key  int64
	conn *pgx.Conn // the session holding the lock; only Run's goroutine touches it
}

// ensure reports whether this replica leads, taking the lock if it is free.
func (l *leader) ensure(ctx context.Context, pool *pgxpool.Pool) bool {
	if l.conn != nil {
		if err := l.conn.Ping(ctx); err == nil {
			return true
		}
		l.release(context.WithoutCancel(ctx))
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return false
	}
	var got bool
	if err := pc.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&got); err != nil || !got {
		pc.Release()
		return false
	}
	// The session must stay ours, never be handed to another user of the
	// pool, or the lock would leak with it.
	l.conn = pc.Hijack()
	return true
}

// release ends the session holding the lock, which releases it.
func (l *leader) release(ctx context.Context) {
	if l.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = l.conn.Close(cctx)
	l.conn = nil
}
