package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
)

// Topics returns the full names of effectline's topics.
func (c Config) Topics() []string {
	return []string{c.Topic(events.TopicIntents), c.Topic(events.TopicOutcomes), c.Topic(events.TopicEscalations),
		c.Topic(events.TopicIntentsDLQ), c.Topic(events.TopicWorkflows)}
}

// EnsureTopics creates the topics that are missing, with the configured
// partitions and replication, and leaves existing ones alone. It retries
// until c.ConnectTimeout and then refuses with an error that names the
// brokers, so a process never starts against a cluster it cannot reach.
func EnsureTopics(ctx context.Context, c Config) error {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	deadline := time.Now().Add(c.ConnectTimeout)
	var lastErr error
	for attempt := 0; ; attempt++ {
		lastErr = ensureTopicsOnce(c)
		if lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kafka brokers %v unreachable after %s: %w", c.Brokers, c.ConnectTimeout, lastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("provisioning topics on %v: %w", c.Brokers, ctx.Err())
		case <-time.After(min(time.Duration(attempt+1)*250*time.Millisecond, 2*time.Second)):
		}
	}
}

// topicMaxMessageBytes is the record batch limit of the topics effectline
// creates. Kafka's default (1 MiB and 12 bytes) is smaller than the largest
// event effectline accepts (events.MaxEnvelopeBytes, 1 MiB) with its key and
// headers, and an event the broker refuses would stall the relay on it. 2
// MiB leaves room; a topic created by hand needs the same.
var topicMaxMessageBytes = "2097152"

func ensureTopicsOnce(c Config) error {
	sc := c.Sarama()
	sc.Admin.Timeout = 5 * time.Second
	admin, err := sarama.NewClusterAdmin(c.Brokers, sc)
	if err != nil {
		return err
	}
	defer admin.Close()
	existing, err := admin.ListTopics()
	if err != nil {
		return err
	}
	for _, t := range c.Topics() {
		if _, ok := existing[t]; ok {
			continue
		}
		err := admin.CreateTopic(t, &sarama.TopicDetail{
			NumPartitions:     c.Partitions,
			ReplicationFactor: c.ReplicationFactor,
			ConfigEntries:     map[string]*string{"max.message.bytes": &topicMaxMessageBytes},
		}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			var te *sarama.TopicError
			if errors.As(err, &te) && te.Err == sarama.ErrTopicAlreadyExists {
				continue
			}
			return fmt.Errorf("creating topic %s: %w", t, err)
		}
	}
	return nil
}
