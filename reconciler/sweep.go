package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/policy"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
)

// Leader election: one sweeper at a time across replicas.
//
// The choice is a session-level Postgres advisory lock, pg_try_advisory_lock,
// taken on a connection this replica keeps out of the pool (hijacked) for as
// long as it leads. It needs no table, no lease renewal and no clock
// agreement between replicas: the lock lives exactly as long as the session,
// so a leader that crashes or is cut off loses it when Postgres ends its
// session, and a replica that is not the leader tries again every
// SweepInterval. A leader checks its session at every sweep and steps down
// when it is gone.
//
// The lock is an efficiency measure, not the safety: every action a sweep
// takes is an append conditioned on the record it read (and, for a lease, on
// the lease column, under a row lock), so the short window in which a
// cut-off leader has not yet noticed can at worst make two replicas attempt
// the same step — and one of them loses the append race and writes nothing.
type leaderState struct {
	held atomic.Bool
	conn *pgx.Conn // the session holding the lock; only the sweep goroutine touches it
}

// pruneEvery spaces the deletions of old webhook delivery ids.
const pruneEvery = time.Minute

// sweepLoop sweeps about every SweepInterval (±20%, so replicas that
// started together drift apart) while this replica leads.
func (r *Reconciler) sweepLoop(ctx context.Context) {
	defer r.stepDown(context.WithoutCancel(ctx))
	var lastPrune time.Time
	service.Loop{
		Name: "reconciler: sweeping", Did: "sweep", DidLevel: slog.LevelInfo,
		Interval: r.cfg.SweepInterval, Jitter: 0.2,
		RunOnce: func(ctx context.Context) (service.Counts, error) {
			if !r.ensureLeader(ctx) {
				return nil, nil
			}
			n, err := r.sweepOnce(ctx)
			if now := r.cfg.Now(); err == nil && now.Sub(lastPrune) >= pruneEvery {
				lastPrune = now
				n.pruned, err = r.pruneDeliveries(ctx, now)
			}
			return service.Counts{{Name: "leases_expired", N: n.expired},
				{Name: "unresolved_resubmitted", N: n.resubmitted}, {Name: "webhook_ids_pruned", N: n.pruned}}, err
		},
		Base: service.Base{Logger: r.log, Now: r.cfg.Now, Rand: r.cfg.Rand},
	}.Run(ctx)
}

// ensureLeader reports whether this replica leads, taking the lock if it is
// free.
func (r *Reconciler) ensureLeader(ctx context.Context) bool {
	if r.leader.conn != nil {
		if err := r.leader.conn.Ping(ctx); err == nil {
			return true
		}
		r.log.WarnContext(ctx, "lost the sweeper lock's session; stepping down")
		r.stepDown(context.WithoutCancel(ctx))
	}
	pc, err := r.store.Pool().Acquire(ctx)
	if err != nil {
		return false
	}
	var got bool
	if err := pc.QueryRow(ctx, sqlTryLeaderLock, r.cfg.LeaderLockKey).Scan(&got); err != nil || !got {
		// Not taken: the connection holds nothing and goes back to the pool.
		pc.Release()
		return false
	}
	// Taken: the session must stay ours, never be handed to another user
	// of the pool, or the lock would leak with it.
	r.leader.conn = pc.Hijack()
	r.leader.held.Store(true)
	r.log.InfoContext(ctx, "became the sweeper")
	return true
}

// stepDown ends the session holding the lock, which releases it.
func (r *Reconciler) stepDown(ctx context.Context) {
	if r.leader.conn == nil {
		return
	}
	r.leader.held.Store(false)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = r.leader.conn.Close(cctx)
	r.leader.conn = nil
}

type sweepCounts struct {
	expired, resubmitted, pruned int
}

// sweepOnce declares attempts whose lease expired Unknown and hands the
// operations waiting too long for reconciliation back to the workers.
func (r *Reconciler) sweepOnce(ctx context.Context) (sweepCounts, error) {
	var n sweepCounts
	now := r.cfg.Now()
	keys, err := r.store.ExpiredLeases(ctx, now, r.cfg.SweepBatch)
	if err != nil {
		return n, err
	}
	var errs []error
	for _, key := range keys {
		ok, err := r.expireLease(ctx, key)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			n.expired++
		}
	}
	keys, err = r.store.Unresolved(ctx, now.Add(-r.cfg.ResweepAfter), r.cfg.SweepBatch)
	if err != nil {
		return n, errors.Join(append(errs, err)...)
	}
	for _, key := range keys {
		queued, err := r.work.submit(ctx, key, "")
		if err != nil {
			return n, errors.Join(append(errs, err)...)
		}
		if queued {
			n.resubmitted++ // not counted: operations already being worked on
		}
	}
	return n, errors.Join(errs...)
}

var errLeaseRenewed = errors.New("lease renewed")

// expireLease declares the running step of key Unknown because its worker
// stopped renewing the lease (it died, was SIGKILLed, or was cut off from
// the database). The call may have reached the downstream, so it is never
// "failed" and never silently re-run: an attempt becomes attempt.unknown
// with the class's next step (policy.AfterUnknown), a compensation becomes
// compensation.failed{unknown}, and reconciliation follows where needed.
//
// The executor renews leases by updating only the lease column, not the
// record, so the record's lease_until may be stale. The append therefore
// runs in a transaction that first locks the row and re-reads the column:
// a renewal committed before the lock wins (nothing is written), and one
// attempted after it waits for the lock and then finds the step gone
// (ExtendLease reports the lease lost, and the worker's outcome is
// journaled as late evidence).
func (r *Reconciler) expireLease(ctx context.Context, key string) (bool, error) {
	for range maxConflicts {
		op, err := r.store.Load(ctx, key)
		if err != nil {
			return false, err
		}
		if op.Status != events.StatusInProgress {
			return false, nil
		}
		now := r.cfg.Now()
		caps := policy.Caps{}
		if t, ok := r.tools.Get(op.Tool); ok {
			caps = t.Spec().Caps
		}
		why := fmt.Sprintf("worker %q stopped renewing its lease", op.LeaseOwner)
		var spec events.Spec
		if op.Phase == events.PhaseCompensation {
			spec = events.Spec{Type: events.CompensationFailed, Attempt: op.Attempt, Data: &events.CompensationFailedData{
				Outcome: events.Unknown, ErrorClass: "lease_expired", Error: why,
			}}
		} else {
			first := now
			if op.FirstAttemptAt != nil {
				first = *op.FirstAttemptAt
			}
			next, retryAt := policy.AfterUnknown(op.EffectClass, caps, op.Attempt, first, now, 0, r.cfg.Rand)
			spec = events.Spec{Type: events.AttemptUnknown, Attempt: op.Attempt, Data: &events.AttemptUnknownData{
				ErrorClass: "lease_expired", Error: why, Next: next, RetryAt: retryAt,
			}}
		}
		evs, err := events.Following(op, now, spec)
		if err != nil {
			return false, err
		}
		tp, _ := r.store.Traceparent(ctx, key)
		spanCtx, span := r.tel.startLeaseExpiry(traceparent.ContextWith(ctx, tp), op)
		a := store.Append{Base: op, Events: evs, Traceparent: traceparent.FromContext(spanCtx), TopicPrefix: r.cfg.Kafka.TopicPrefix}
		var next events.Operation
		err = pgx.BeginFunc(ctx, r.store.Pool(), func(tx pgx.Tx) error {
			leaseUntil, err := store.LockLeaseTx(ctx, tx, op.Key, op.Seq)
			if err != nil {
				return err
			}
			if leaseUntil == nil || !leaseUntil.Before(now) {
				return errLeaseRenewed
			}
			next, err = store.AppendTx(ctx, tx, a)
			return err
		})
		endSpan(span, ignore(err, errLeaseRenewed))
		switch {
		case errors.Is(err, errLeaseRenewed):
			return false, nil
		case store.IsConflict(err):
			continue
		case err != nil:
			return false, fmt.Errorf("expiring the lease of %s: %w", key, err)
		}
		// The waiters in this process learn of the expiry from the commit.
		r.store.NotifyCommitted(a)
		r.tel.leaseExpired(ctx, op)
		r.log.WarnContext(spanCtx, "lease expired: the step's outcome is unknown", "operation_key", key,
			"tool", op.Tool, "attempt", op.Attempt, "phase", op.Phase, "worker", op.LeaseOwner, "status", next.Status)
		if next.Status == events.StatusNeedsReconciliation {
			if _, err := r.work.submit(ctx, key, a.Traceparent); err != nil {
				return true, err
			}
		}
		return true, nil
	}
	return false, fmt.Errorf("expiring the lease of %s: lost the append race too many times", key)
}

// pruneDeliveries deletes webhook delivery ids older than the retention.
func (r *Reconciler) pruneDeliveries(ctx context.Context, now time.Time) (int, error) {
	tag, err := r.store.Pool().Exec(ctx, sqlPruneDeliveries, now.Add(-r.cfg.WebhookRetention))
	if err != nil {
		return 0, fmt.Errorf("pruning webhook deliveries: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func ignore(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return err
}
