package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
)

// handedBatch is one call of a deferred handler, settled by the test.
type handedBatch struct {
	first, last int64
	settle      chan error
}

// TestDeferredBatchConsumerCommitsOnlyDurableBatches: a batch whose writes
// are not durable yet is not committed, and when they may be lost the
// partition is read again from before it; once durable, it is committed.
func TestDeferredBatchConsumerCommitsOnlyDurableBatches(t *testing.T) {
	t.Parallel()
	_, cfg, p := newProducer(t, 1, true)
	topic := cfg.Topic(events.TopicOutcomes)
	const n = 3
	var recs []kafka.Record
	for i := range n {
		recs = append(recs, producerRecord(topic, "k", int64(i+1), 10))
	}
	if err := p.Send(context.Background(), recs); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	handed := make(chan handedBatch)
	const group = "deferred"
	c, err := kafka.NewDeferredBatchConsumer(cfg, kafka.ConsumerConfig{Group: group, Topic: topic}, func(ctx context.Context, msgs []*kafka.Message) (kafka.Durable, error) {
		b := handedBatch{first: msgs[0].Offset, last: msgs[len(msgs)-1].Offset, settle: make(chan error, 1)}
		select {
		case handed <- b:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return b.settle, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	next := func() handedBatch {
		t.Helper()
		select {
		case b := <-handed:
			return b
		case <-ctx.Done():
			t.Fatal("no batch handed over")
		}
		return handedBatch{}
	}

	// Everything is handed over once, unsettled; then the oldest batch's
	// writes turn out lost.
	var first []handedBatch
	for b := next(); ; b = next() {
		first = append(first, b)
		if b.last == n-1 {
			break
		}
	}
	first[0].settle <- errors.New("lost")
	// Read again from offset 0: nothing was committed, not even the batches
	// after the lost one.
	var again []handedBatch
	for b := next(); ; b = next() {
		if len(again) == 0 && b.first != 0 {
			t.Fatalf("after the loss the partition was read again from offset %d, want 0", b.first)
		}
		again = append(again, b)
		if b.last == n-1 {
			break
		}
	}
	for _, b := range again {
		close(b.settle)
	}
	if got := committedOffset(t, ctx, cfg, group, topic); got != n {
		t.Fatalf("committed offset %d, want %d", got, n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// committedOffset waits until group has committed an offset for partition
// 0 of topic and returns it.
func committedOffset(t *testing.T, ctx context.Context, cfg kafka.Config, group, topic string) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, cfg.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
		if err == nil {
			if b := resp.GetBlock(topic, 0); b != nil && b.Offset >= 0 {
				return b.Offset
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s committed no offset: %v", group, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
