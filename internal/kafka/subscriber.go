package kafka

import (
	"context"
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
