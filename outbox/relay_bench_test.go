package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// BenchmarkRelayThroughput measures how fast one relay drains a pre-filled
// outbox to the embedded broker: 4,000 operations of five events each
// (20,000 events, 24,000 messages since intents also go to the intents
// topic), from the relay's start to the outbox being empty, every message
// acknowledged by Kafka and its row deleted.
//
// Run: go test ./outbox/ -run '^$' -bench RelayThroughput -benchtime 1x
func BenchmarkRelayThroughput(b *testing.B) {
	h := setup(b)
	const ops = 4000
	relayPool := h.poolNamed(b, "bench-relay")
	producer := h.producer(b)
	ctx := context.Background()

	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		appendWorkload(b, h.store, opKeys(fmt.Sprintf("tp%d", i), ops), 500)
		rows, _, err := h.store.OutboxBacklog(ctx)
		if err != nil || rows != ops*(eventsPerOp+1) {
			b.Fatalf("outbox holds %d rows, %v; want %d", rows, err, ops*(eventsPerOp+1))
		}
		relay := outbox.NewRelay(store.New(relayPool), producer, outbox.RelayConfig{})
		b.StartTimer()

		start := time.Now()
		stop := runRelay(b, relay)
		// Stats, not OutboxBacklog: a count(*) every few milliseconds would
		// compete with the relay for the same two cores.
		for relay.Stats().Published < rows {
			time.Sleep(2 * time.Millisecond)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		stop()
		if n, _, err := h.store.OutboxBacklog(ctx); err != nil || n != 0 {
			b.Fatalf("outbox holds %d rows after the relay published them all, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.N*ops*eventsPerOp)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N*ops*(eventsPerOp+1))/elapsed.Seconds(), "msgs/s")
}

// BenchmarkRelayLatency measures outbox-to-Kafka latency: from the commit
// of an intent returning to a consumer of effectline.intents receiving it,
// one intent at a time, for the three ways the relay learns of a commit:
//
//   - in-process: appended through the relay's own store (OnAppend wakes it);
//   - agent-poll: another process's outbox.Append, found by polling (100ms);
//   - agent-notify: another process's outbox.Append + outbox.Notify, relay
//     with Listen.
//
// ns/op includes a random pause per iteration; the metrics are the
// latencies.
//
// Run: go test ./outbox/ -run '^$' -bench RelayLatency -benchtime 200x
func BenchmarkRelayLatency(b *testing.B) {
	h := setup(b)
	ctx := context.Background()

	type arrival struct {
		key string
		at  time.Time
	}
	arrivals := make(chan arrival, 1024)
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker.Addrs...), kgo.ConsumeTopics("effectline.intents"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		b.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				select {
				case arrivals <- arrival{string(r.Key), now}:
				case <-cctx.Done():
				}
			})
		}
	}()
	b.Cleanup(func() { cancel(); <-consumerDone; cl.Close() })

	agent := store.New(h.poolNamed(b, "bench-agent"))
	for _, variant := range []string{"in-process", "agent-poll", "agent-notify"} {
		b.Run(variant, func(b *testing.B) {
			relay := outbox.NewRelay(h.store, h.producer(b), outbox.RelayConfig{Listen: variant == "agent-notify"})
			stop := runRelay(b, relay)
			defer stop()
			if variant == "agent-notify" {
				eventual(b, 10*time.Second, "the relay to LISTEN", func() bool {
					var n int
					err := h.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
					return err == nil && n == 1
				})
			}

			lat := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				// A random pause decorrelates the commits from the relay's
				// tick: back-to-back appends would each land just after a
				// poll and always wait the whole interval.
				time.Sleep(rand.N(outbox.DefaultPollInterval))
				key := fmt.Sprintf("wf:latency-%s/%d", variant, i)
				i++
				var err error
				switch variant {
				case "in-process":
					_, err = h.store.Append(ctx, store.Append{Events: appendIntentEvents(b, key), TopicPrefix: "effectline."})
				default:
					err = pgx.BeginFunc(ctx, agent.Pool(), func(tx pgx.Tx) error {
						if _, err := outbox.Append(ctx, tx, testIntent(key)); err != nil {
							return err
						}
						if variant == "agent-notify" {
							return outbox.Notify(ctx, tx)
						}
						return nil
					})
				}
				if err != nil {
					b.Fatal(err)
				}
				committed := time.Now()
				timeout := time.After(10 * time.Second)
			wait:
				for {
					select {
					case a := <-arrivals:
						if a.key == key {
							lat = append(lat, a.at.Sub(committed))
							break wait
						}
					case <-timeout:
						b.Fatalf("%s did not reach Kafka within 10s", key)
					}
				}
			}
			slices.Sort(lat)
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
