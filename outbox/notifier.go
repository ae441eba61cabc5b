package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/service"
)

// Notifier wakes the relays of other processes after commits of this one.
// A process that writes events but runs no relay (`run --components api`,
// `executor`, `reconciler` or `workflow` on their own, the deployment the
// Kubernetes manifests describe) would otherwise leave every event it
// journals to the relays' next poll, half of RelayConfig.PollInterval
// (50 ms) on average per hop, twice per operation.
//
// It sends the NOTIFY after the commit, in a statement of its own, never
// inside the writers' transactions: a notifying transaction takes a
// database-wide lock at commit and holds it through its flush, so
// notifying inside the group commit would serialize the commits of every
// writer on the database (see Relay). Signals coalesce: at most one NOTIFY
// is in flight, and the commits made while it was sent cost one more, not
// one each. Wire Signal to store.OnAppend.
type Notifier struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	wake chan struct{}
}

// NewNotifier returns a Notifier that notifies on pool's connections.
func NewNotifier(pool *pgxpool.Pool, base service.Base) *Notifier {
	base = base.WithDefaults()
	return &Notifier{pool: pool, log: base.Logger, wake: make(chan struct{}, 1)}
}

// Signal asks for a NOTIFY soon. It never blocks, so the committer that
// calls it is never held up.
func (n *Notifier) Signal() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Run sends a NOTIFY on NotifyChannel after each Signal until ctx ends. A
// failed NOTIFY is logged once per streak and not retried: the relays'
// poll finds the rows anyway, a little later.
func (n *Notifier) Run(ctx context.Context) error {
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.wake:
		}
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.pool.Exec(nctx, `SELECT pg_notify($1, '')`, NotifyChannel)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			n.log.WarnContext(ctx, "outbox notifier: NOTIFY failed; relays in other processes find the events at their next poll",
				"error", fmt.Errorf("notifying %s: %w", NotifyChannel, err))
			failing = true
		case err == nil && failing:
			n.log.InfoContext(ctx, "outbox notifier: notifying again")
			failing = false
		}
	}
}
