package watch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
)

// KafkaFeed tails the outcomes topic, where every event of every operation
// is relayed keyed by its operation key. It reads every partition from the
// end with a plain consumer, not in a consumer group: each API replica must
// see every event, since any replica may hold a waiter for any key, and it
// commits no offsets because a waiter only cares about events from its
// registration on (what it missed before, the head record it read says).
type KafkaFeed struct {
	cfg kafka.Config
	log *slog.Logger
}

// NewKafkaFeed returns a feed of c's outcomes topic.
func NewKafkaFeed(c kafka.Config, log *slog.Logger) *KafkaFeed {
	if log == nil {
		log = slog.Default()
	}
	return &KafkaFeed{cfg: c.WithDefaults(), log: log}
}

// Run tails until ctx ends. After a failure it reconnects and resumes each
// partition after the last offset it delivered, so a short outage loses
// nothing; the hub's sweep covers a longer one.
func (f *KafkaFeed) Run(ctx context.Context, deliver func(key string, envelope []byte)) error {
	next := map[int32]int64{}
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		err := f.tail(ctx, next, deliver)
		if ctx.Err() != nil {
			return nil
		}
		f.log.WarnContext(ctx, "tailing the outcomes topic for waiters failed; retrying", slog.Any("error", err))
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

func (f *KafkaFeed) tail(ctx context.Context, next map[int32]int64, deliver func(string, []byte)) error {
	topic := f.cfg.Topic(events.TopicOutcomes)
	sc := f.cfg.Sarama()
	sc.ClientID = f.cfg.ClientID + "-waiters"
	consumer, err := sarama.NewConsumer(f.cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("connecting to %v: %w", f.cfg.Brokers, err)
	}
	defer consumer.Close()
	parts, err := consumer.Partitions(topic)
	if err != nil {
		return fmt.Errorf("listing the partitions of %s: %w", topic, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		fail = make(chan error, len(parts))
	)
	for _, p := range parts {
		mu.Lock()
		offset, ok := next[p]
		mu.Unlock()
		if !ok {
			offset = sarama.OffsetNewest
		}
		pc, err := consumer.ConsumePartition(topic, p, offset)
		if err != nil && offset != sarama.OffsetNewest {
			// The resume point was removed by retention: start at the end.
			pc, err = consumer.ConsumePartition(topic, p, sarama.OffsetNewest)
		}
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("consuming %s/%d: %w", topic, p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.AsyncClose()
			for {
				select {
				case <-ctx.Done():
					return
				case m, ok := <-pc.Messages():
					if !ok {
						return
					}
					deliver(string(m.Key), m.Value)
					mu.Lock()
					next[p] = m.Offset + 1
					mu.Unlock()
				case e, ok := <-pc.Errors():
					if ok {
						fail <- e
						return
					}
				}
			}
		}()
	}
	select {
	case <-ctx.Done():
	case err = <-fail:
	}
	cancel()
	wg.Wait()
	return err
}
