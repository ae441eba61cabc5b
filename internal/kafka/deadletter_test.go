package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
)

// syncBuffer is a log sink the consumer and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDeadLetterIsWrittenBeforeTheOffsetMoves: while the broker refuses a
// rejected message's copy, the partition's offset stays before it and the
// partition waits; once the copy is acknowledged, it and the valid message
// behind it are committed, and the dead letter reads back with its headers.
func TestDeadLetterIsWrittenBeforeTheOffsetMoves(t *testing.T) {
	t.Parallel()
	_, cfg, p := newProducer(t, 1, false)
	topic := cfg.Topic(events.TopicIntents)
	dlq := kafka.DeadLetterTopic(topic)
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, cfg.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	tiny := "200" // bytes: smaller than the poison message, so its copy is refused
	for name, conf := range map[string]map[string]*string{topic: nil, dlq: {"max.message.bytes": &tiny}} {
		if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: conf}, false); err != nil {
			t.Fatal(err)
		}
	}
	poison := kafka.Record{Topic: topic, Key: []byte("k"), Value: bytes.Repeat([]byte("!"), 500)}
	valid := kafka.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{}`)}
	if err := p.Send(context.Background(), []kafka.Record{poison, valid}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs syncBuffer
	const group = "dead-letters"
	handled := make(chan int64, 16)
	c, err := kafka.NewBatchConsumer(cfg, kafka.ConsumerConfig{Group: group, Topic: topic, DeadLetters: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(_ context.Context, msgs []*kafka.Message) error {
		for _, m := range msgs {
			if m.Offset == 0 {
				m.Reject("poison", errors.New("the test says so"))
			}
			handled <- m.Offset
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("nothing handed over")
	}
	for !strings.Contains(logs.String(), "writing dead letters failed") {
		select {
		case <-ctx.Done():
			t.Fatalf("the refused dead letter was not reported:\n%s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err == nil {
		if b := resp.GetBlock(topic, 0); b != nil && b.Offset > 0 {
			t.Fatalf("committed offset %d while the dead letter was refused, want none", b.Offset)
		}
	}

	big := "2097152"
	if err := admin.AlterConfig(sarama.TopicResource, dlq, map[string]*string{"max.message.bytes": &big}, false); err != nil {
		t.Fatal(err)
	}
	if got := committedOffset(t, ctx, cfg, group, topic); got != 2 {
		t.Fatalf("committed offset %d after the dead letter was written, want 2", got)
	}
	letters, err := kafka.ReadDeadLetters(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1: %+v", len(letters), letters)
	}
	l := letters[0]
	if l.Reason != "poison" || l.Detail != "the test says so" || l.Topic != topic || l.Partition != 0 || l.Offset != 0 ||
		string(l.Key) != "k" || !bytes.Equal(l.Value, poison.Value) {
		t.Fatalf("dead letter = %+v", l)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
