package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/store"
)

// TestDirectIntentOfAPrunedOperation: an intent produced straight to Kafka
// for an operation that settled and was pruned reaches the executor, whose
// claim conflicts with the tombstone: nothing runs, nothing is journaled,
// with the same args or with others, and the partition moves on.
func TestDirectIntentOfAPrunedOperation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reader := sdkmetric.NewManualReader()
	e.start(func(c *executor.Config) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	ctx := context.Background()

	e.produce("pruned", "payments.charge", events.Irreversible, `{"amount":3}`)
	e.waitStatus("pruned", events.StatusCompleted)
	// Stand in for the relay (none runs here), then prune.
	if _, err := e.store.Pool().Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.PruneSettled(ctx, "payments.charge", time.Now().Add(time.Hour), time.Now(), 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want 1", n, err)
	}

	e.produce("pruned", "payments.charge", events.Irreversible, `{"amount":3}`)
	e.produce("pruned", "payments.charge", events.Irreversible, `{"amount":4}`)
	deadline := time.Now().Add(30 * time.Second)
	for prunedIntents(t, reader, "duplicate") < 1 || prunedIntents(t, reader, "payload_conflict") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the executor did not handle both intents of the pruned operation (duplicate %d, conflict %d)",
				prunedIntents(t, reader, "duplicate"), prunedIntents(t, reader, "payload_conflict"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The partition is not stalled behind them.
	e.produce("after", "payments.charge", events.Irreversible, `{"amount":5}`)
	e.waitStatus("after", events.StatusCompleted)

	if got := e.fake.Applied(); got != 2 {
		t.Fatalf("effects applied = %d, want 2 (the pruned operation once, the one after)", got)
	}
	if got := len(e.history("pruned")); got != 0 {
		t.Fatalf("%d events journaled for the pruned operation, want 0", got)
	}
	if _, err := e.store.Load(ctx, "pruned"); !errors.Is(err, store.ErrPruned) {
		t.Fatalf("the pruned operation after duplicates: %v, want its tombstone", err)
	}
}

func prunedIntents(t *testing.T, r *sdkmetric.ManualReader, result string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "effectline.executor.pruned_intents" {
				continue
			}
			sum, _ := m.Data.(metricdata.Sum[int64])
			for _, dp := range sum.DataPoints {
				if v, ok := dp.Attributes.Value(attribute.Key("result")); ok && v.AsString() == result {
					n += dp.Value
				}
			}
		}
	}
	return n
}
