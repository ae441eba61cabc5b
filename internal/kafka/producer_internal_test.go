package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
)

// A request that finds its broker's connection closed (another Send closed
// it after a failure, or is still opening it) was not sent: produce opens
// the connection and sends it, rather than failing a relay batch that
// reached no broker. CI failed once on "broker not connected" with four
// Sends racing on a new producer.
func TestProduceReopensAConnectionItFindsClosed(t *testing.T) {
	broker := testenv.NewBroker(t)
	cfg := Config{Brokers: broker.Addrs, Partitions: 1}
	if err := EnsureTopics(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	p, err := NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	topic := cfg.Topic(events.TopicOutcomes)
	recs := []Record{{Topic: topic, Key: []byte("k"), Value: []byte("v1")}}
	if err := p.Send(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	reqs, _, err := p.requests([]Record{{Topic: topic, Key: []byte("k"), Value: []byte("v2")}}, partitioners{})
	if err != nil {
		t.Fatal(err)
	}
	for leader, req := range reqs {
		if err := leader.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.produce(leader, req); err != nil {
			t.Fatalf("produce on a closed connection: %v", err)
		}
	}
	if got := broker.ReadAll(t, topic, 2, 10*time.Second); len(got) != 2 {
		t.Fatalf("%d records, want 2", len(got))
	}
}
