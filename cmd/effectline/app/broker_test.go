package app

import (
	"context"
	"os"
	"sync"
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
	client, send := topicT(t, addrs, sc)
	send(10)
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
	b.Close()
	closed = true
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Errorf("the broker's log %s is still there after Close (stat: %v)", b.dir, err)
	}
}

// TestEmbeddedBrokerKeepsUnreadMessages: a message past the retention is
// still kept while a consumer group with live members has not read it, so
// a consumer behind its broker (a slow dev, or a laptop's clock jumping
// after a sleep) loses nothing; once the group commits past it, it goes.
func TestEmbeddedBrokerKeepsUnreadMessages(t *testing.T) {
	b, err := StartEmbeddedBroker(1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_8_0_0
	sc.Producer.Return.Successes = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Interval = 50 * time.Millisecond
	addrs := b.ListenAddrs()
	client, send := topicT(t, addrs, sc)
	// A live member that reads three messages, then stops reading until
	// told to go on.
	group, err := sarama.NewConsumerGroup(addrs, "slow", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	goOn := make(chan struct{})
	h := &slowHandler{readFirst: 3, goOn: goOn, joined: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			_ = group.Consume(ctx, []string{"t"}, h)
		}
	}()
	select {
	case <-h.joined:
	case <-time.After(10 * time.Second):
		t.Fatal("the group did not join within 10 s")
	}
	send(10)

	oldest := func() int64 {
		o, err := client.GetOffset("t", 0, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	waitFor := func(want int64, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for oldest() != want {
			if time.Now().After(deadline) {
				t.Fatalf("log start offset %d; want %d", oldest(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Every message is past the retention a second after it was sent;
	// only the three the group read and committed may go.
	waitFor(3, 10*time.Second)
	time.Sleep(2 * time.Second) // several trims later, still 3
	if o := oldest(); o != 3 {
		t.Fatalf("log start offset %d with the group's commit at 3; want 3 (unread messages kept)", o)
	}
	close(goOn)
	waitFor(10, 10*time.Second)
}

type slowHandler struct {
	readFirst int
	goOn      chan struct{}
	joined    chan struct{}
	once      sync.Once
}

func (h *slowHandler) Setup(sarama.ConsumerGroupSession) error {
	h.once.Do(func() { close(h.joined) })
	return nil
}
func (*slowHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *slowHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		if m.Offset >= int64(h.readFirst) {
			select {
			case <-h.goOn:
			case <-sess.Context().Done():
				return nil
			}
		}
		sess.MarkMessage(m, "")
	}
	return nil
}

// topicT creates the one-partition topic "t" on the broker at addrs and
// returns a client and a function that sends n messages to it.
func topicT(t *testing.T, addrs []string, sc *sarama.Config) (sarama.Client, func(n int)) {
	t.Helper()
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
	t.Cleanup(func() { _ = client.Close() })
	pr, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	return client, func(n int) {
		for range n {
			if _, _, err := pr.SendMessage(&sarama.ProducerMessage{Topic: "t", Value: sarama.StringEncoder("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
