package kafka

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// NewSubscriber returns a watermill-kafka subscriber in consumer group
// group. Offsets start at the oldest message for a new group, so nothing
// published before the group first joined is skipped.
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
// logs unless debugging.
func WatermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		l = slog.Default()
	}
	return watermill.NewSlogLoggerWithLevelMapping(l.With("component", "watermill"), map[slog.Level]slog.Level{
		slog.LevelInfo: slog.LevelDebug,
	})
}
