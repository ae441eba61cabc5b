package testenv

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestBrokerListensOnLoopback(t *testing.T) {
	t.Parallel()
	b := NewBroker(t, WithNumBrokers(3))
	if len(b.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3 brokers", b.Addrs)
	}
	for _, a := range b.Addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Errorf("broker address %q is not on 127.0.0.1", a)
		}
	}
}

func TestBrokerProduceReadAll(t *testing.T) {
	t.Parallel()
	b := NewBroker(t, WithTopics(3, "orders"))

	for _, k := range []string{"a", "b", "c", "d"} {
		b.Produce(t, "orders", []byte(k), []byte("v-"+k), map[string]string{"event-type": "created", "key": k})
	}
	recs := b.ReadAll(t, "orders", 4, 10*time.Second)
	if len(recs) != 4 {
		t.Fatalf("ReadAll returned %d records, want 4", len(recs))
	}
	seen := map[string]bool{}
	for i, r := range recs {
		if r.Topic != "orders" || string(r.Value) != "v-"+string(r.Key) || r.Headers["event-type"] != "created" || r.Headers["key"] != string(r.Key) {
			t.Errorf("record %+v", r)
		}
		if i > 0 && (r.Partition < recs[i-1].Partition || r.Partition == recs[i-1].Partition && r.Offset <= recs[i-1].Offset) {
			t.Errorf("records not sorted by partition, offset: %+v after %+v", r, recs[i-1])
		}
		seen[string(r.Key)] = true
	}
	if len(seen) != 4 {
		t.Errorf("keys seen = %v", seen)
	}

	// Asking for more than exists returns what there is once the timeout
	// passes, without failing: that is how tests prove "no duplicate".
	// Even a timeout too short to connect in returns every record that was
	// already published, so such checks cannot pass by being slow.
	for _, timeout := range []time.Duration{time.Nanosecond, 100 * time.Millisecond} {
		if recs := b.ReadAll(t, "orders", 5, timeout); len(recs) != 4 {
			t.Errorf("ReadAll(want 5, %v) returned %d records, want 4", timeout, len(recs))
		}
	}
	// Asking for fewer than exist still returns every record already in the
	// topic, from every partition: a caller looking for one message among
	// them must not miss it because another partition's fetch came first.
	if recs := b.ReadAll(t, "orders", 1, 10*time.Second); len(recs) != 4 {
		t.Errorf("ReadAll(want 1) returned %d records, want the 4 in the topic", len(recs))
	}
	// A topic that does not exist reads as empty.
	if recs := b.ReadAll(t, "missing", 1, 50*time.Millisecond); len(recs) != 0 {
		t.Errorf("ReadAll(missing) = %+v", recs)
	}
}

// metadataAutoCreate sends a metadata request that asks for topic to be auto
// created and returns the topic's error code.
func metadataAutoCreate(t *testing.T, b *Broker, topic string) int16 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = true
	resp, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 {
		t.Fatalf("metadata returned %d topics", len(resp.Topics))
	}
	return resp.Topics[0].ErrorCode
}

func TestBrokerAutoCreateOffByDefault(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)
	if code := metadataAutoCreate(t, b, "unprovisioned"); code != kerr.UnknownTopicOrPartition.Code {
		t.Errorf("metadata error = %v, want UNKNOWN_TOPIC_OR_PARTITION (auto-create must be off)", kerr.ErrorForCode(code))
	}
}

func TestBrokerWithAutoCreate(t *testing.T) {
	t.Parallel()
	b := NewBroker(t, WithAutoCreate(), WithPartitions(2))
	if code := metadataAutoCreate(t, b, "fresh"); code != 0 {
		t.Fatalf("metadata error = %v, want the topic created", kerr.ErrorForCode(code))
	}
	b.Produce(t, "fresh", nil, []byte("x"), nil)
	if recs := b.ReadAll(t, "fresh", 1, 10*time.Second); len(recs) != 1 || recs[0].Headers != nil {
		t.Errorf("ReadAll = %+v", recs)
	}
}

// TestSaramaRoundTrip proves the wiring effectline relies on: sarama, with the
// configuration the product uses, can produce to and consume (as a group)
// from the kfake broker, and interoperates with franz-go on the same topic.
func TestSaramaRoundTrip(t *testing.T) {
	t.Parallel()
	const topic = "effects"
	b := NewBroker(t, WithTopics(2, topic))

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Return.Successes = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true

	prod, err := sarama.NewSyncProducer(b.Addrs, cfg)
	if err != nil {
		t.Fatalf("NewSyncProducer: %v", err)
	}
	defer prod.Close()
	part, off, err := prod.SendMessage(&sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder("k1"),
		Value:   sarama.StringEncoder("from-sarama"),
		Headers: []sarama.RecordHeader{{Key: []byte("trace"), Value: []byte("t1")}},
	})
	if err != nil {
		t.Fatalf("SendMessage: %v", err)
	}

	// franz-go sees what sarama produced.
	recs := b.ReadAll(t, topic, 1, 10*time.Second)
	if len(recs) != 1 || recs[0].Partition != part || recs[0].Offset != off ||
		string(recs[0].Key) != "k1" || string(recs[0].Value) != "from-sarama" || recs[0].Headers["trace"] != "t1" {
		t.Fatalf("ReadAll = %+v, want the sarama message at %d/%d", recs, part, off)
	}

	// And a sarama consumer group sees both that and what franz-go produces.
	b.Produce(t, topic, []byte("k2"), []byte("from-franz"), map[string]string{"trace": "t2"})

	group, err := sarama.NewConsumerGroup(b.Addrs, "testenv-sarama", cfg)
	if err != nil {
		t.Fatalf("NewConsumerGroup: %v", err)
	}
	defer group.Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h := &collectHandler{msgs: make(chan *sarama.ConsumerMessage, 16)}
	consumeDone := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{topic}, h); err != nil {
				consumeDone <- err
				return
			}
		}
		consumeDone <- nil
	}()

	got := map[string]string{}
	timeout := time.After(30 * time.Second)
	for len(got) < 2 {
		select {
		case m := <-h.msgs:
			hdr := map[string]string{}
			for _, rh := range m.Headers {
				hdr[string(rh.Key)] = string(rh.Value)
			}
			got[string(m.Key)] = string(m.Value) + "/" + hdr["trace"]
		case err := <-group.Errors():
			t.Fatalf("consumer group error: %v", err)
		case err := <-consumeDone:
			t.Fatalf("Consume returned early: %v", err)
		case <-timeout:
			t.Fatalf("consumer group received %v before timing out", got)
		}
	}
	if got["k1"] != "from-sarama/t1" || got["k2"] != "from-franz/t2" {
		t.Errorf("consumed %v", got)
	}

	cancel()
	if err := <-consumeDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Consume: %v", err)
	}
}

type collectHandler struct {
	msgs chan *sarama.ConsumerMessage
}

func (*collectHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*collectHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *collectHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			sess.MarkMessage(m, "")
			select {
			case h.msgs <- m:
			case <-sess.Context().Done():
				return nil
			}
		case <-sess.Context().Done():
			return nil
		}
	}
}
