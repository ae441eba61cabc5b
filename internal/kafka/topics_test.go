package kafka_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
)

func TestEnsureTopicsCreatesMissingTopics(t *testing.T) {
	t.Parallel()
	b := testenv.NewBroker(t)
	c := kafka.Config{Brokers: b.Addrs, Partitions: 5, TopicPrefix: "acme."}
	if err := kafka.EnsureTopics(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	// A second run leaves existing topics alone.
	if err := kafka.EnsureTopics(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	admin, err := sarama.NewClusterAdmin(b.Addrs, c.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"acme.intents", "acme.outcomes", "acme.escalations"} {
		d, ok := topics[name]
		if !ok || d.NumPartitions != 5 {
			t.Errorf("topic %s: %+v (present %v), want 5 partitions", name, d, ok)
		}
	}
}

// TestEnsureTopicsRefusesAnUnreachableCluster: a process never starts
// against a cluster it cannot reach; the error names the brokers.
func TestEnsureTopicsRefusesAnUnreachableCluster(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here now
	start := time.Now()
	err = kafka.EnsureTopics(context.Background(), kafka.Config{Brokers: []string{addr}, ConnectTimeout: time.Second})
	if err == nil {
		t.Fatal("EnsureTopics succeeded against a closed port")
	}
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "unreachable after 1s") {
		t.Fatalf("error %q should name the broker and the deadline", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("gave up after %s; the deadline is 1s", took)
	}
}
