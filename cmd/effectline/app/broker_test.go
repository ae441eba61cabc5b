package app

import (
	"os"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestEmbeddedBrokerDropsOldMessages: the embedded broker keeps messages in
// memory, so dev's memory is bounded only if its retention loop runs. The
// log start offset of a partition moves past messages older than the
// retention, and Close removes the broker's log.
func TestEmbeddedBrokerDropsOldMessages(t *testing.T) {
	b, err := StartEmbeddedBroker(1, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			b.Close()
		}
	}()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_8_0_0
	sc.Producer.Return.Successes = true
	addrs := b.ListenAddrs()
	admin, err := sarama.NewClusterAdmin(addrs, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic("t", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	client, err := sarama.NewClient(addrs, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	pr, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	for range 10 {
		if _, _, err := pr.SendMessage(&sarama.ProducerMessage{Topic: "t", Value: sarama.StringEncoder("x")}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		oldest, err := client.GetOffset("t", 0, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		if oldest == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log start offset %d after 10 s with a 500 ms retention; want 10 (every message dropped)", oldest)
		}
		time.Sleep(100 * time.Millisecond)
	}
	client.Close()
	b.Close()
	closed = true
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Errorf("the broker's log %s is still there after Close (stat: %v)", b.dir, err)
	}
}
