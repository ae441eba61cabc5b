package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
)

// producerRecord is a record for key at seq whose value names both, padded
// to size bytes.
func producerRecord(topic, key string, seq int64, size int) kafka.Record {
	v := []byte(fmt.Sprintf("%s#%d|", key, seq))
	if pad := size - len(v); pad > 0 {
		v = append(v, bytes.Repeat([]byte("x"), pad)...)
	}
	return kafka.EventRecord(context.Background(), topic, events.Envelope{
		OperationKey: key, Seq: seq, EventID: fmt.Sprintf("%s-%d", key, seq), Type: events.AttemptSucceeded,
		OccurredAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}, v)
}

// newProducer starts a broker (with topics of partitions partitions when
// topics is set) and a producer on it.
func newProducer(t *testing.T, partitions int32, topics bool, opts ...testenv.BrokerOption) (*testenv.Broker, kafka.Config, *kafka.Producer) {
	t.Helper()
	broker := testenv.NewBroker(t, opts...)
	cfg := kafka.Config{Brokers: broker.Addrs, Partitions: partitions}
	if topics {
		if err := kafka.EnsureTopics(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
	}
	p, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return broker, cfg, p
}

// checkKeyOrder fails unless every key's records sit in one partition, the
// one murmur2 gives it, with seqs 1..want in offset order.
func checkKeyOrder(t *testing.T, recs []testenv.Record, partitions int32, want map[string]int64) {
	t.Helper()
	seen := map[string]int64{}
	part := sarama.NewMurmur2Partitioner("")
	for _, r := range recs {
		key := string(r.Key)
		name, seqText, ok := bytes.Cut(r.Value, []byte("#"))
		if !ok || string(name) != key {
			t.Fatalf("record %s/%d@%d: value %.40q does not belong to key %q", r.Topic, r.Partition, r.Offset, r.Value, key)
		}
		seq, err := strconv.ParseInt(string(bytes.SplitN(seqText, []byte("|"), 2)[0]), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if seq != seen[key]+1 {
			t.Fatalf("key %s: seq %d after seq %d", key, seq, seen[key])
		}
		seen[key] = seq
		wantPart, err := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if r.Partition != wantPart {
			t.Fatalf("key %s in partition %d, murmur2 says %d", key, r.Partition, wantPart)
		}
		if r.Headers[kafka.HeaderType] != string(events.AttemptSucceeded) || r.Headers[kafka.HeaderSubject] != key {
			t.Fatalf("key %s: headers %v", key, r.Headers)
		}
	}
	for key, n := range want {
		if seen[key] != n {
			t.Fatalf("key %s: %d records, want %d", key, seen[key], n)
		}
	}
}

// One Send spreading many keys' events over two topics and the partitions
// of three brokers: one request per broker, and every key's events land in
// its murmur2 partition in seq order.
func TestProducerKeepsEachKeysOrderAcrossBrokers(t *testing.T) {
	t.Parallel()
	broker, cfg, p := newProducer(t, 12, true, testenv.WithNumBrokers(3))
	topics := []string{cfg.Topic(events.TopicIntents), cfg.Topic(events.TopicOutcomes)}
	want := map[string]int64{}
	var recs []kafka.Record
	for seq := int64(1); seq <= 4; seq++ {
		for k := range 40 {
			key := fmt.Sprintf("order-%02d/charge", k)
			want[key] = 4
			for _, topic := range topics {
				recs = append(recs, producerRecord(topic, key, seq, 200))
			}
		}
	}
	if err := p.Send(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	for _, topic := range topics {
		got := broker.ReadAll(t, topic, 160, 10*time.Second)
		if len(got) != 160 {
			t.Fatalf("%s: %d records, want 160", topic, len(got))
		}
		checkKeyOrder(t, got, 12, want)
	}
}

// Sends from several goroutines on one producer (several relays in one
// process) each keep their keys in order.
func TestProducerConcurrentSends(t *testing.T) {
	t.Parallel()
	broker, cfg, p := newProducer(t, 12, true)
	topic := cfg.Topic(events.TopicOutcomes)
	want := map[string]int64{}
	sends := make([][]kafka.Record, 4)
	for g := range sends {
		for seq := int64(1); seq <= 3; seq++ {
			for k := range 10 {
				key := fmt.Sprintf("relay-%d/op-%02d", g, k)
				want[key] = 3
				sends[g] = append(sends[g], producerRecord(topic, key, seq, 100))
			}
		}
	}
	errs := make(chan error, len(sends))
	for _, recs := range sends {
		go func() { errs <- p.Send(context.Background(), recs) }()
	}
	for range sends {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := broker.ReadAll(t, topic, 120, 10*time.Second)
	if len(got) != 120 {
		t.Fatalf("%d records, want 120", len(got))
	}
	checkKeyOrder(t, got, 12, want)
}

// A Send larger than one request may carry per partition goes out in
// rounds, in order.
func TestProducerSendsOversizedBatchesInRounds(t *testing.T) {
	t.Parallel()
	broker, cfg, p := newProducer(t, 3, true)
	topic := cfg.Topic(events.TopicOutcomes)
	var recs []kafka.Record
	for seq := int64(1); seq <= 7; seq++ {
		recs = append(recs, producerRecord(topic, "big/op", seq, 300<<10)) // 2.1 MB for one partition
	}
	if err := p.Send(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	got := broker.ReadAll(t, topic, 7, 10*time.Second)
	checkKeyOrder(t, got, 3, map[string]int64{"big/op": 7})
}

// A Send to a topic that does not exist fails and publishes nothing after
// the failure.
func TestProducerFailsOnAnUnknownTopic(t *testing.T) {
	t.Parallel()
	_, _, p := newProducer(t, 3, false)
	if err := p.Send(context.Background(), []kafka.Record{producerRecord("effectline.nope", "k", 1, 10)}); err == nil {
		t.Fatal("Send to a missing topic succeeded")
	}
}

// The largest event effectline accepts, with its key and headers, fits the
// topics EnsureTopics creates: a broker refusing it would stall the relay.
func TestProducerPublishesTheLargestEvent(t *testing.T) {
	t.Parallel()
	broker, cfg, p := newProducer(t, 3, true)
	topic := cfg.Topic(events.TopicIntents)
	key := "wf:" + string(bytes.Repeat([]byte("k"), events.MaxOperationKeyBytes-3))
	big := producerRecord(topic, key, 1, events.MaxEnvelopeBytes)
	big.Headers.Carrier().Set(kafka.HeaderTraceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	small := producerRecord(topic, key, 2, 100)
	if err := p.Send(context.Background(), []kafka.Record{big, small}); err != nil {
		t.Fatal(err)
	}
	got := broker.ReadAll(t, topic, 2, 10*time.Second)
	checkKeyOrder(t, got, 3, map[string]int64{key: 2})

	// effectline's consumers (sarama, 1 MiB default fetch) read it too.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sizes := make(chan int, 2)
	c, err := kafka.NewBatchConsumer(cfg, kafka.ConsumerConfig{Group: "largest-event", Topic: topic}, func(_ context.Context, msgs []*kafka.Message) error {
		for _, m := range msgs {
			sizes <- len(m.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for _, want := range []int{len(big.Value), len(small.Value)} {
		select {
		case n := <-sizes:
			if n != want {
				t.Fatalf("consumed a %d-byte message, want %d", n, want)
			}
		case <-ctx.Done():
			t.Fatal("the consumer did not get the largest event")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
