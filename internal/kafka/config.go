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
	// InstanceID, when set, makes this process a static member
	// (group.instance.id) of every consumer group it joins: restarted under
	// the same id, it takes over its predecessor's membership at once,
	// however that one died, instead of waiting for the broker to drop it.
	// It must be stable across restarts of one replica and unique among
	// the replicas (a second process with the same id fences the first);
	// a StatefulSet pod name is both. A static member does not leave its
	// groups when it stops: its partitions wait up to a session timeout
	// (10 s) for it to come back.
	InstanceID string
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
	groupTimeouts(sc)
	return sc
}

func (c Config) String() string {
	return fmt.Sprintf("brokers=%v prefix=%s", c.Brokers, c.WithDefaults().TopicPrefix)
}

// Consumer group timeouts. A member that dies without leaving (SIGKILL, OOM,
// a lost host) stays in its group until the broker gives up on it, and
// until then its partitions wait, so these bound how long a crash stops
// consumption. The rules are Kafka's, not any one broker's:
//
//   - The session timeout is how long the coordinator waits for a
//     heartbeat before it drops a member that is not in a rebalance. 10 s,
//     inside every broker's default bounds (group.min.session.timeout.ms
//     6 s, max 30 min), heartbeating every second.
//   - The rebalance timeout is how long the coordinator holds a JoinGroup
//     (and, since Kafka 3, a SyncGroup) waiting for the members it knows to
//     rejoin; those that do not are dropped when it ends. A member's
//     handlers end with their session (they take its context), so a live
//     member rejoins within a second or two: 20 s is room enough.
//   - The read timeout must outlast the rebalance timeout, because the
//     broker answers a JoinGroup only when the join completes. The Java
//     client gives a JoinGroup the rebalance timeout plus 5 s for this
//     reason; sarama has one read timeout for every request. sarama's
//     default rebalance timeout (60 s) is twice its read timeout (30 s): a
//     join the broker rightly held for more than 30 s was abandoned, and
//     the member joined again; a dead member the broker still waited for
//     then held every such join, and the group never formed (the
//     consumer logged "consuming failed, rejoining … i/o timeout" every
//     30 s). 30 s, sarama's default, is kept: it is also how long a broker
//     that went silent takes to be noticed.
//
// So a member that died holds its partitions for at most a session timeout
// and, if it died inside a rebalance, one more rebalance timeout; two
// quick crashes in a row cost about the sum of both
// (cmd/effectline's TestFaultConsumerGroupAfterTwoQuickKills).
//
// Static membership (group.instance.id) is not used: a static member that
// dies is dropped after the same session timeout, its gain is a restart
// without a rebalance, which needs an id that is stable per replica and
// unique (two processes with one id fence each other), and the deployment
// gives effectline no such id.
const (
	groupSessionTimeout   = 10 * time.Second
	groupHeartbeat        = time.Second
	groupRebalanceTimeout = 20 * time.Second
	readTimeout           = 30 * time.Second
)

func groupTimeouts(sc *sarama.Config) {
	sc.Consumer.Group.Session.Timeout = groupSessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = groupHeartbeat
	sc.Consumer.Group.Rebalance.Timeout = groupRebalanceTimeout
	sc.Net.ReadTimeout = readTimeout
}
