package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectline/effectline/events"
)

// NewSubscriber returns a watermill-kafka subscriber in consumer group
// group, on effectline's sarama configuration. Offsets start at the oldest
// message for a new group, so nothing published before the group first
// joined is skipped.
//
// No component consumes through it: watermill's subscriber has one message
// per partition in flight, which caps a consumer whose handling ends in a
// database commit at partitions ÷ commit latency, and the components share
// BatchConsumer instead. It stays for what watermill does well, a
// subscriber to read topics with in tests and tools, and as the baseline
// of BenchmarkConsumers.
func NewSubscriber(c Config, group string, logger *slog.Logger) (*wmkafka.Subscriber, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sc := c.Sarama()
	sc.ClientID = c.ClientID + "-" + group
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               c.Brokers,
		Unmarshaler:           Unmarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		NackResendSleep:       100 * time.Millisecond,
		ReconnectRetrySleep:   500 * time.Millisecond,
	}, WatermillLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("kafka subscriber for group %s: %w", group, err)
	}
	return sub, nil
}

// WatermillLogger adapts slog for watermill, one level quieter: watermill
// logs every rebalance and reconnect at Info, which is noise in effectline's
// logs unless debugging. Levels that are off cost nothing: watermill's own
// adapter builds the attributes of its per-message Trace lines before slog
// drops them, which was a few percent of a busy consumer's CPU.
func WatermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		l = slog.Default()
	}
	l = l.With("component", "watermill")
	return levelGate{
		LoggerAdapter: watermill.NewSlogLoggerWithLevelMapping(l, map[slog.Level]slog.Level{
			slog.LevelInfo: slog.LevelDebug,
		}),
		log: l,
	}
}

// levelGate skips the watermill adapter when slog would drop the line.
type levelGate struct {
	watermill.LoggerAdapter
	log *slog.Logger
}

func (g levelGate) enabled(l slog.Level) bool { return g.log.Enabled(context.Background(), l) }

func (g levelGate) Info(msg string, fields watermill.LogFields) {
	if g.enabled(slog.LevelDebug) { // mapped one level down
		g.LoggerAdapter.Info(msg, fields)
	}
}

func (g levelGate) Debug(msg string, fields watermill.LogFields) {
	if g.enabled(slog.LevelDebug) {
		g.LoggerAdapter.Debug(msg, fields)
	}
}

func (g levelGate) Trace(msg string, fields watermill.LogFields) {
	if g.enabled(watermill.LevelTrace) {
		g.LoggerAdapter.Trace(msg, fields)
	}
}

func (g levelGate) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelGate{LoggerAdapter: g.LoggerAdapter.With(fields), log: g.log}
}

// Unmarshaler maps a Kafka message to a watermill message without ever
// failing: watermill-kafka stops consuming the partition when an
// unmarshaler fails, so a malformed event would block every event behind it.
type Unmarshaler struct{}

// MetadataKey holds the Kafka message key in watermill metadata.
const MetadataKey = "kafka_key"

// Unmarshal implements the watermill-kafka Unmarshaler.
func (Unmarshaler) Unmarshal(km *sarama.ConsumerMessage) (*message.Message, error) {
	md := make(message.Metadata, len(km.Headers)+1)
	var id string
	for _, h := range km.Headers {
		if h == nil {
			continue
		}
		md.Set(string(h.Key), string(h.Value))
		if string(h.Key) == HeaderID {
			id = string(h.Value)
		}
	}
	if id == "" {
		id = events.NewID()
	}
	md.Set(MetadataKey, string(km.Key))
	msg := message.NewMessage(id, km.Value)
	msg.Metadata = md
	return msg, nil
}
