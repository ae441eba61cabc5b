package kafka_test

import (
	"context"

	"encoding/json"
	"fmt"
	"github.com/IBM/sarama"
	"testing"
	"time"

	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/traceparent"
)

// BenchmarkPublish compares the two ways the relay could publish to the
// embedded broker, with the same messages (an intent envelope of about 400
// bytes with its headers, keyed by operation key):
//
//   - watermill-kafka's Publisher.Publish (sarama underneath: idempotent,
//     acks=all, one request in flight), which sends one message and waits
//     for its acknowledgement before the next: a broker round trip per
//     message;
//   - kafka.Producer.Send with the relay's batch of 500, one produce request
//     per broker, awaited once.
//
// Run: go test ./internal/kafka/ -run '^$' -bench Publish -benchtime 20000x
func BenchmarkPublish(b *testing.B) {
	broker := testenv.NewBroker(b)
	cfg := kafka.Config{Brokers: broker.Addrs, Partitions: 12}
	if err := kafka.EnsureTopics(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	topic := cfg.Topic(events.TopicOutcomes)
	records := sampleRecords(b, topic, 500)

	b.Run("watermill-kafka/Publish-one-at-a-time", func(b *testing.B) {
		pub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
			Brokers: cfg.Brokers,
			Marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
				return m.Metadata.Get(kafka.HeaderSubject), nil
			}),
			OverwriteSaramaConfig: cfg.Sarama(),
		}, kafka.WatermillLogger(nil))
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		msgs := make([]*message.Message, len(records))
		for i, r := range records {
			m := message.NewMessage(r.Headers.Get(kafka.HeaderID), r.Value)
			for _, h := range r.Headers {
				m.Metadata.Set(h.Key, string(h.Value))
			}
			msgs[i] = m
		}
		i := 0
		for b.Loop() {
			if err := pub.Publish(topic, msgs[i%len(msgs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})

	b.Run("Producer.Send-batch-500", func(b *testing.B) {
		p, err := kafka.NewProducer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		// One iteration is one message, so ns/op compares directly; a Send
		// goes out per 500 iterations.
		sent := 0
		for b.Loop() {
			sent++
			if sent%len(records) == 0 {
				if err := p.Send(context.Background(), records); err != nil {
					b.Fatal(err)
				}
			}
		}
		if rest := sent % len(records); rest > 0 {
			if err := p.Send(context.Background(), records[:rest]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// BenchmarkPublishLatency measures what the relay waits for per batch: a
// Send of 13 events (a relay batch's median at 500 operations/s) spread over
// the partitions of two topics, until every one is acknowledged. It
// compares sarama's SyncProducer.SendMessages (same configuration:
// idempotent, acks=all, one request in flight, 1 ms flush timer) with
// kafka.Producer, which builds one produce request per broker itself. Run
// it alone and again beside a CPU hog (e.g. `effectline bench -n 50000` in
// another shell): the SyncProducer's pipeline of goroutines is what a busy
// machine delays.
//
//	go test ./internal/kafka/ -run '^$' -bench PublishLatency -benchtime 2000x
func BenchmarkPublishLatency(b *testing.B) {
	broker := testenv.NewBroker(b)
	cfg := kafka.Config{Brokers: broker.Addrs, Partitions: 12}
	if err := kafka.EnsureTopics(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	records := append(sampleRecords(b, cfg.Topic(events.TopicIntents), 5), sampleRecords(b, cfg.Topic(events.TopicOutcomes), 8)...)

	b.Run("sarama-SyncProducer", func(b *testing.B) {
		sc := cfg.Sarama()
		p, err := sarama.NewSyncProducer(cfg.Brokers, sc)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		msgs := make([]*sarama.ProducerMessage, len(records))
		for b.Loop() {
			for i, r := range records {
				msgs[i] = kafka.ProducerMessage(r)
			}
			if err := p.SendMessages(msgs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kafka.Producer", func(b *testing.B) {
		p, err := kafka.NewProducer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		for b.Loop() {
			if err := p.Send(context.Background(), records); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchTrace carries the span context every sample record's headers hold.
var benchTrace = traceparent.ContextWith(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")

func sampleRecords(b *testing.B, topic string, n int) []kafka.Record {
	b.Helper()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	out := make([]kafka.Record, n)
	for i := range out {
		key := fmt.Sprintf("wf:order-%06d/charge", i)
		e, err := events.New(events.IntentRecorded, key, 1, "payments.charge", events.Irreversible, 0,
			events.IntentData{Args: json.RawMessage(`{"amount":4200,"currency":"EUR","customer":"c-81723","order":"order-000001","note":"second floor, ring twice"}`),
				Principal: "billing-agent"}, at)
		if err != nil {
			b.Fatal(err)
		}
		raw, err := events.Encode(e)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = kafka.EventRecord(benchTrace, topic, e, raw)
	}
	return out
}
