package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
)

// commitLatency stands in for the database commit that ends the handling
// of each message (or of each batch).
const commitLatency = time.Millisecond

// BenchmarkConsumers compares watermill-kafka's subscriber, which hands out
// one message per partition and waits for its ack, with BatchConsumer,
// which hands a partition's fetched messages over together, when each hand
// over ends in a commit of commitLatency. It is why the projector consumes
// with BatchConsumer:
//
//	go test ./internal/kafka -run '^$' -bench Consumers -benchtime 20000x
func BenchmarkConsumers(b *testing.B) {
	for _, name := range []string{"watermill", "batch"} {
		b.Run(name, func(b *testing.B) {
			broker := testenv.NewBroker(b)
			cfg := kafka.Config{Brokers: broker.Addrs, Partitions: 12, TopicPrefix: "bench."}
			if err := kafka.EnsureTopics(context.Background(), cfg); err != nil {
				b.Fatal(err)
			}
			topic := cfg.Topic("outcomes")
			n := b.N
			produce(b, cfg, topic, n)
			var handled atomic.Int64
			done := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			count := func(k int) {
				if handled.Add(int64(k)) == int64(n) {
					close(done)
				}
			}
			b.ResetTimer()
			start := time.Now()
			switch name {
			case "watermill":
				sub, err := kafka.NewSubscriber(cfg, "bench-watermill", slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				defer sub.Close()
				msgs, err := sub.Subscribe(ctx, topic)
				if err != nil {
					b.Fatal(err)
				}
				for range 12 { // as many handlers as partitions: all can be busy
					go func() {
						for m := range msgs {
							time.Sleep(commitLatency)
							m.Ack()
							count(1)
						}
					}()
				}
			case "batch":
				c, err := kafka.NewBatchConsumer(cfg, kafka.ConsumerConfig{Group: "bench-batch", Topic: topic,
					Logger: slog.New(slog.DiscardHandler)}, func(ctx context.Context, ms []*kafka.Message) error {
					time.Sleep(commitLatency)
					count(len(ms))
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = c.Run(ctx) }()
			}
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("handled %d of %d", handled.Load(), n)
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

func produce(b *testing.B, cfg kafka.Config, topic string, n int) {
	b.Helper()
	p, err := sarama.NewSyncProducer(cfg.Brokers, cfg.Sarama())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	batch := make([]*sarama.ProducerMessage, 0, 500)
	for i := range n {
		batch = append(batch, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)), Value: sarama.ByteEncoder(`{}`)})
		if len(batch) == cap(batch) || i == n-1 {
			if err := p.SendMessages(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}
