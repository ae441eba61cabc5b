package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
)

// BenchmarkProjector measures events handled per second from Kafka into
// operation_state: b.N events (operations of three: intent, attempt started,
// attempt succeeded) are journaled and published first, then a projector
// consumes them. The clock runs from the first handled event to the last,
// so the consumer group join is not counted.
//
//	go test ./projector/ -run '^$' -bench BenchmarkProjector -benchtime 30000x
func BenchmarkProjector(b *testing.B) {
	for _, bc := range []struct {
		name  string
		tweak func(*projector.Config)
	}{
		{"async_commit/flushers=2", func(*projector.Config) {}},
		{"async_commit/flushers=1", func(c *projector.Config) { c.Flushers = 1 }},
		{"sync_commit/flushers=2", func(c *projector.Config) { c.SynchronousCommit = true }},
	} {
		b.Run(bc.name, func(b *testing.B) { benchmarkProjector(b, bc.tweak) })
	}
}

func benchmarkProjector(b *testing.B, tweak func(*projector.Config)) {
	h := setupPartitions(b, 12) // the production default
	total := journalAndPublishBulk(b, h, b.N)

	b.ResetTimer()
	run := h.start(projector.DefaultGroup, tweak)
	var first time.Time
	deadline := time.Now().Add(10 * time.Minute)
	for {
		// Two flushers may fold the same operation at once (one partition's
		// fetch split across two batches); the later writer's events then
		// count as skipped, so the handled events are what to wait for.
		n := handled(b, run)
		if first.IsZero() && n > 0 {
			first = time.Now()
		}
		if n >= int64(total) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("handled %d of %d events in 10 minutes", n, total)
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(first)
	b.StopTimer()
	run.stop()
	txs, evs := run.batches(b)
	b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(evs)/float64(txs), "events/tx")
	b.ReportMetric(0, "ns/op")
}

// journalAndPublishBulk journals about n events in batches, publishes them
// in order, and returns how many there are.
func journalAndPublishBulk(b *testing.B, h *harness, n int) int {
	b.Helper()
	ctx := b.Context()
	const perOp = 3
	ops := (n + perOp - 1) / perOp
	now := time.Now().UTC()
	total := 0
	for lo := 0; lo < ops; lo += 500 {
		var as []store.Append
		for i := lo; i < min(lo+500, ops); i++ {
			key := fmt.Sprintf("bench-%07d", i)
			f := newFlow(b, key, "payments.charge", events.Idempotent, now).intent().started(1).succeeded(1)
			as = append(as, store.Append{Events: f.evs})
		}
		var recs []kafka.Record
		for _, r := range h.store.AppendBatch(ctx, as) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		for _, a := range as {
			for _, e := range a.Events {
				raw, err := events.Encode(e)
				if err != nil {
					b.Fatal(err)
				}
				recs = append(recs, kafka.EventRecord(context.Background(), h.kafka.Topic(events.TopicOutcomes), e, raw))
			}
		}
		if err := h.prod.Send(context.Background(), recs); err != nil {
			b.Fatal(err)
		}
		total += len(recs)
	}
	return total
}
