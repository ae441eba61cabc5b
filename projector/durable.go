package projector

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/kafka"
)

// errMaybeLost settles the batches whose rows a database crash may have
// taken: they were committed asynchronously before the watch lost its
// connection, so nothing proves them flushed.
var errMaybeLost = errors.New("the database connection was lost, so rows committed asynchronously before it may be lost")

// durabilityWatch tells the consumer when the rows a flush committed with
// synchronous_commit off are durable, so that their offsets are committed
// only then. Without it, a database crash within the WAL writer's window
// after a flush loses rows whose offsets are already committed: an
// operation that had reached its last event would show its earlier state
// until someone ran Rebuild.
//
// A committed transaction's commit record lies below the WAL insert
// position read after it returned, and it is durable once the WAL flush
// position passes that. The watch reads both positions on a connection of
// its own, every interval while batches wait. A crash (or a restart, or a
// failover) ends every session, that connection's too; so as long as the
// connection that read a batch's positions is the one that was open
// before the batch's flush began, no crash came in between. When it breaks,
// every waiting batch may be lost and settles with errMaybeLost, and the
// consumer reads the partitions again from their committed offsets. The
// next connection starts a new generation: batches whose flush began in an
// earlier one settle with errMaybeLost too. The cached records may be among
// the lost as well: onDoubt drops them at the loss (lost true) and again at
// the new connection (a flush in between may have cached a row the crash
// took).
type durabilityWatch struct {
	connConfig *pgx.ConnConfig
	interval   time.Duration
	onDoubt    func(lost bool)
	log        *slog.Logger

	mu      sync.Mutex
	gen     uint64 // 0 until connected; bumped by every new connection
	waiting []pending
	wake    chan struct{}
}

// pending is a batch waiting to be durable: nil is sent (closed) once it
// is, errMaybeLost if that cannot be known.
type pending chan error

// round is the batches registered before one read of the insert position.
type round struct {
	target  int64 // the WAL insert position read after they returned
	batches []pending
}

func newDurabilityWatch(cfg *pgx.ConnConfig, interval time.Duration, onDoubt func(lost bool), log *slog.Logger) *durabilityWatch {
	return &durabilityWatch{connConfig: cfg, interval: interval, onDoubt: onDoubt, log: log,
		wake: make(chan struct{}, 1)}
}

// begin is called before a flush writes; after takes what it returns.
func (w *durabilityWatch) begin() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// after registers the rows committed by a flush begun at gen; what it
// returns settles once they are durable.
func (w *durabilityWatch) after(gen uint64) kafka.Durable {
	settle := make(chan error, 1)
	w.mu.Lock()
	if gen == 0 || gen != w.gen {
		w.mu.Unlock()
		settle <- errMaybeLost
		return settle
	}
	w.waiting = append(w.waiting, settle)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return settle
}

// connect opens the watch's connection, retrying until ctx ends, and starts
// a new generation.
func (w *durabilityWatch) connect(ctx context.Context) (*pgx.Conn, error) {
	backoff := 100 * time.Millisecond
	for {
		conn, err := pgx.ConnectConfig(ctx, w.connConfig)
		if err == nil {
			// Dropped before the generation changes, so that every flush of
			// the new one folds onto rows as the server has them now.
			if w.begin() != 0 {
				w.onDoubt(false)
			}
			w.mu.Lock()
			w.gen++
			stale := w.waiting
			w.waiting = nil
			w.mu.Unlock()
			settleAll(stale, errMaybeLost)
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		w.log.WarnContext(ctx, "projector: the durability watch cannot connect; offsets wait", "error", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// run watches until ctx ends. conn is the first connection (from connect).
func (w *durabilityWatch) run(ctx context.Context, conn *pgx.Conn) {
	var rounds []round
	defer func() {
		if conn != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		if len(rounds) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-time.After(w.interval):
			}
		}
		w.mu.Lock()
		fresh := w.waiting
		w.waiting = nil
		w.mu.Unlock()

		var insert, flush int64
		err := conn.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint,
		                                  (pg_current_wal_flush_lsn() - '0/0')::bigint`).Scan(&insert, &flush)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.WarnContext(ctx, "projector: lost the durability watch's connection; rows not yet flushed will be projected again", "error", err)
			for _, r := range rounds {
				settleAll(r.batches, errMaybeLost)
			}
			rounds = nil
			settleAll(fresh, errMaybeLost)
			w.onDoubt(true)
			_ = conn.Close(context.WithoutCancel(ctx))
			if conn, err = w.connect(ctx); err != nil {
				conn = nil
				return
			}
			continue
		}
		if len(fresh) > 0 {
			rounds = append(rounds, round{target: insert, batches: fresh})
		}
		for len(rounds) > 0 && rounds[0].target <= flush {
			settleAll(rounds[0].batches, nil)
			rounds = rounds[1:]
		}
	}
}

func settleAll(ps []pending, err error) {
	for _, p := range ps {
		if err != nil {
			p <- err
		} else {
			close(p)
		}
	}
}
