package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
)

// BatchHandler handles the messages of one partition, in offset order. A nil
// error commits them all; an error leaves them uncommitted, and the same
// messages are handed over again after a backoff. It must be idempotent.
type BatchHandler func(ctx context.Context, msgs []*sarama.ConsumerMessage) error

// Concurrently is a BatchHandler that runs h on every message of a batch at
// once, each in its own goroutine, and fails the batch if any call fails.
// Handlers whose work ends in a group commit use it so that a partition's
// messages share commits instead of queueing for one each.
func Concurrently(h func(ctx context.Context, msg *sarama.ConsumerMessage) error) BatchHandler {
	return func(ctx context.Context, msgs []*sarama.ConsumerMessage) error {
		errs := make(chan error, len(msgs))
		for _, m := range msgs {
			go func() { errs <- h(ctx, m) }()
		}
		var first error
		for range msgs {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}

// BatchConsumer is a consumer group that hands a partition's messages over
// in batches: every message already fetched, up to MaxBatch, at once.
//
// It exists beside watermill-kafka because watermill's subscriber delivers
// one message per partition and waits for its ack before the next, so a
// consumer whose handling ends in a database commit is capped at
// partitions ÷ commit latency (BenchmarkConsumers in this package measures
// both). The projector folds a partition's messages into one transaction;
// the executor claims each intent of a batch concurrently, so the claims
// share group commits. The reconciler, whose traffic is the rare unknown
// outcome, stays on watermill.
type BatchConsumer struct {
	cfg      Config
	group    string
	topic    string
	maxBatch int
	handle   BatchHandler
	log      *slog.Logger
}

// NewBatchConsumer returns a consumer of topic in group. maxBatch <= 0 means 512.
func NewBatchConsumer(c Config, group, topic string, maxBatch int, h BatchHandler, log *slog.Logger) (*BatchConsumer, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if maxBatch <= 0 {
		maxBatch = 512
	}
	if log == nil {
		log = slog.Default()
	}
	return &BatchConsumer{cfg: c, group: group, topic: topic, maxBatch: maxBatch, handle: h, log: log}, nil
}

// Run consumes until ctx ends. Offsets of handled batches are committed by
// sarama's auto-commit, and once more when the group closes.
func (b *BatchConsumer) Run(ctx context.Context) error {
	sc := b.cfg.Sarama()
	sc.ClientID = b.cfg.ClientID + "-" + b.group
	// A batch is committed to the database before its offsets are marked;
	// a long batch must not cost the partition its claim.
	sc.Consumer.MaxProcessingTime = 30 * time.Second
	group, err := sarama.NewConsumerGroup(b.cfg.Brokers, b.group, sc)
	if err != nil {
		return fmt.Errorf("consumer group %s on %v: %w", b.group, b.cfg.Brokers, err)
	}
	defer group.Close()
	go func() {
		for err := range group.Errors() {
			b.log.WarnContext(ctx, "consumer group error", "group", b.group, "error", err)
		}
	}()
	h := &batchGroupHandler{b: b}
	for ctx.Err() == nil {
		// Consume returns at every rebalance; loop to rejoin.
		if err := group.Consume(ctx, []string{b.topic}, h); err != nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
				return nil
			}
			b.log.WarnContext(ctx, "consuming failed, rejoining", "group", b.group, "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

type batchGroupHandler struct{ b *BatchConsumer }

func (h *batchGroupHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *batchGroupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *batchGroupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	batch := make([]*sarama.ConsumerMessage, 0, h.b.maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			batch = append(batch, m)
		}
	drain:
		for len(batch) < h.b.maxBatch {
			select {
			case m, ok := <-claim.Messages():
				if !ok {
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		backoff := 100 * time.Millisecond
		for {
			err := h.b.handle(ctx, batch)
			if err == nil {
				sess.MarkMessage(batch[len(batch)-1], "")
				break
			}
			if ctx.Err() != nil {
				return nil // the partition moves on with whoever owns it next
			}
			h.b.log.WarnContext(ctx, "handling a batch failed, retrying", "group", h.b.group,
				"partition", claim.Partition(), "offset", batch[0].Offset, "messages", len(batch), "error", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
		}
	}
}
