package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Consumer runs one watermill handler on a topic in a consumer group: the
// executor's and the reconciler's intake.
type Consumer struct {
	name   string
	sub    *wmkafka.Subscriber
	router *message.Router
	done   chan struct{}
	err    error
}

// StartConsumer subscribes group to topic and runs h on every message until
// ctx ends or Close is called.
func StartConsumer(ctx context.Context, c Config, name, group, topic string, h message.NoPublishHandlerFunc, log *slog.Logger) (*Consumer, error) {
	sub, err := NewSubscriber(c, group, log)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, WatermillLogger(log))
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("%s consumer: %w", name, err)
	}
	router.AddConsumerHandler(name, topic, sub, h)
	cons := &Consumer{name: name, sub: sub, router: router, done: make(chan struct{})}
	go func() {
		defer close(cons.done)
		err := router.Run(ctx)
		if err == nil && ctx.Err() == nil {
			// The router stops by itself only when its subscriber failed.
			err = errors.New(name + ": consumer stopped")
		}
		cons.err = err
	}()
	return cons, nil
}

// Stopped is closed when the consumer stopped, by Close, ctx or failure.
func (c *Consumer) Stopped() <-chan struct{} { return c.done }

// Err is why the consumer stopped on its own; nil after Close or ctx ended.
// Call it after Stopped is closed.
func (c *Consumer) Err() error { return c.err }

// Close stops taking messages, waits for handlers still running, and closes
// the subscriber, which commits the offsets of handled messages.
func (c *Consumer) Close() {
	_ = c.router.Close()
	<-c.done // Close waits for running handlers up to the router's CloseTimeout
	_ = c.sub.Close()
}
