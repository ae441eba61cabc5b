package kafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
)

// TestLagMonitor checks the lag against a broker: everything in the topic
// for a group that has committed nothing, then what is left after commits.
func TestLagMonitor(t *testing.T) {
	t.Parallel()
	const topic, group = "lag.test", "lag-group"
	b := testenv.NewBroker(t, testenv.WithTopics(2, topic))
	for i := range 5 {
		b.Produce(t, topic, fmt.Appendf(nil, "k%d", i), []byte("v"), nil)
	}
	cfg := kafka.Config{Brokers: b.Addrs}
	gt := kafka.GroupTopic{Group: group, Topic: topic}
	m, err := kafka.NewLagMonitor(cfg, []kafka.GroupTopic{gt}, kafka.LagConfig{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitLag := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, ok := m.Lag()[gt]
			if ok && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("lag of %v: %d (measured: %v), want %d", gt, got, ok, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLag(5)

	// A member of the group reads everything and commits partition 0's
	// messages only: what is left is partition 1's.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var p0, p1 []*kgo.Record
	pollCtx, cancelPoll := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancelPoll()
	for len(p0)+len(p1) < 5 {
		fs := cl.PollFetches(pollCtx)
		if err := pollCtx.Err(); err != nil {
			t.Fatalf("read %d of 5 messages: %v", len(p0)+len(p1), err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Partition == 0 {
				p0 = append(p0, r)
			} else {
				p1 = append(p1, r)
			}
		})
	}
	if len(p0) == 0 || len(p1) == 0 {
		t.Fatalf("messages per partition: %d and %d; pick keys that use both", len(p0), len(p1))
	}
	if err := cl.CommitRecords(pollCtx, p0...); err != nil {
		t.Fatal(err)
	}
	waitLag(int64(len(p1)))
}
