package executor

import (
	"context"
	"log/slog"

	"github.com/effectline/effectline/service"
)

// poll runs due steps: retries whose backoff ended, compensations, intents
// whose message never arrived, approvals, about every PollInterval (±20%,
// so replicas polling the same table drift apart). It also serves kicks,
// the in-process shortcut for steps due within a poll or two.
func (e *Executor) poll(ctx context.Context) {
	go e.serveKicks(ctx)
	service.Loop{
		Name: "executor: polling due operations", Did: "executor: advanced due operations", DidLevel: slog.LevelDebug,
		Interval: e.cfg.PollInterval, Jitter: 0.2,
		RunOnce: func(ctx context.Context) (service.Counts, error) {
			n, err := e.pollOnce(ctx)
			return service.Counts{{Name: "operations", N: n}}, err
		},
		Base: service.Base{Logger: e.log, Rand: e.cfg.Rand, Now: e.cfg.Now},
	}.Run(ctx)
}

// serveKicks advances each kicked operation at once, until ctx ends.
func (e *Executor) serveKicks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case key := <-e.kicks:
			go func() {
				if err := e.advanceKey(ctx, key); err != nil && ctx.Err() == nil {
					e.log.WarnContext(ctx, "advancing a kicked operation failed", "operation_key", key, "error", err)
				}
			}()
		}
	}
}

// pollOnce advances the operations due now and returns how many.
func (e *Executor) pollOnce(ctx context.Context) (int, error) {
	keys, err := e.store.DueOperations(ctx, e.cfg.Now(), e.cfg.PollBatch)
	if err != nil {
		return 0, err
	}
	done := make(chan struct{}, len(keys))
	for _, key := range keys {
		go func() {
			defer func() { done <- struct{}{} }()
			if err := e.advanceKey(ctx, key); err != nil && ctx.Err() == nil {
				e.log.WarnContext(ctx, "advancing a due operation failed", "operation_key", key, "error", err)
			}
		}()
	}
	for range keys {
		<-done
	}
	return len(keys), nil
}
