// Package kafka wires effectline to Kafka: topic names and provisioning, the
// sarama configuration every component shares, the event ↔ message mapping
// (CloudEvents attributes and W3C traceparent as headers), a batching
// producer for the relay, and watermill-kafka subscribers for the consumers.
package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
)

// Config says where the cluster is and how effectline's topics look.
type Config struct {
	Brokers []string
	// TopicPrefix replaces "effectline." in the topic names (contract).
	// Default events.DefaultTopicPrefix.
	TopicPrefix string
	// Partitions of each topic created at start. Default 12: the upper bound
	// on executor and projector replicas.
	Partitions int32
	// ReplicationFactor of each topic created at start. Default 1.
	ReplicationFactor int16
	// ClientID names this process to the brokers.
	ClientID string
	// ConnectTimeout bounds how long provisioning waits for the cluster
	// before refusing to start. Default 30s.
	ConnectTimeout time.Duration
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.TopicPrefix == "" {
		c.TopicPrefix = events.DefaultTopicPrefix
	}
	if c.Partitions <= 0 {
		c.Partitions = 12
	}
	if c.ReplicationFactor <= 0 {
		c.ReplicationFactor = 1
	}
	if c.ClientID == "" {
		c.ClientID = "effectline"
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka: no brokers configured (set EFFECTLINE_KAFKA_BROKERS)")
	}
	return nil
}

// Topic returns the full name of a topic suffix from events.TopicsFor.
func (c Config) Topic(suffix string) string { return c.WithDefaults().TopicPrefix + suffix }

// Sarama returns the client configuration shared by effectline's producers
// and consumers.
func (c Config) Sarama() *sarama.Config {
	c = c.WithDefaults()
	sc := sarama.NewConfig()
	// 2.8 is the oldest protocol with everything used here (idempotent
	// producer, KIP-345 static membership is not required); every supported
	// Kafka release speaks it.
	sc.Version = sarama.V2_8_0_0
	sc.ClientID = c.ClientID
	sc.Net.DialTimeout = 5 * time.Second
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond

	// The relay's kafka.Producer builds its requests itself and takes only
	// RequiredAcks, Timeout and MaxMessageBytes from here. The rest is for
	// sarama's own producers (any Go producer of intents, the benchmarks):
	// the idempotent producer with one request in flight per broker keeps a
	// retried batch from overtaking the next one.
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Retry.Max = 10
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// murmur2, the Java client's default partitioner (and franz-go's): a
	// non-Go producer writing an intent straight to the topic must land its
	// key in the partition the relay uses, or per-key order breaks.
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	sc.Producer.Flush.Frequency = time.Millisecond
	sc.Producer.Compression = sarama.CompressionNone

	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	sc.Consumer.MaxProcessingTime = time.Second
	sc.Consumer.Group.Session.Timeout = 10 * time.Second
	sc.Consumer.Group.Heartbeat.Interval = time.Second
	return sc
}

func (c Config) String() string {
	return fmt.Sprintf("brokers=%v prefix=%s", c.Brokers, c.WithDefaults().TopicPrefix)
}

