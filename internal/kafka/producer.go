package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// Producer publishes batches of events and returns when the brokers have
// acknowledged every one of them.
//
// It is sarama's SyncProducer.SendMessages rather than watermill-kafka's
// Publisher, whose Publish sends and awaits one message at a time; the
// benchmark in producer_bench_test.go shows the difference.
type Producer struct {
	p sarama.SyncProducer
}

// NewProducer connects a producer to the cluster.
func NewProducer(c Config) (*Producer, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sc := c.Sarama()
	sc.ClientID = c.ClientID + "-relay"
	p, err := sarama.NewSyncProducer(c.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka producer on %v: %w", c.Brokers, err)
	}
	return &Producer{p: p}, nil
}

// Send publishes records and waits for every acknowledgement. On error some
// records may have been published: the relay republishes the whole batch,
// and consumers deduplicate by (operation_key, seq).
func (p *Producer) Send(records []Record) error {
	if len(records) == 0 {
		return nil
	}
	msgs := make([]*sarama.ProducerMessage, len(records))
	for i, r := range records {
		msgs[i] = ProducerMessage(r)
	}
	err := p.p.SendMessages(msgs)
	var perrs sarama.ProducerErrors
	if errors.As(err, &perrs) && len(perrs) > 0 {
		return fmt.Errorf("publishing %d of %d events failed, first: %w", len(perrs), len(records), perrs[0].Err)
	}
	return err
}

// Close flushes and closes the producer.
func (p *Producer) Close() error { return p.p.Close() }
