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

// Durable settles once what a handler wrote for a batch is durable. Nil
// (received, or a closed channel) lets the batch's offset be committed. An
// error says the writes may be lost: the consumer then leaves its group
// session, so every partition it held is read again from its last committed
// offset, which no unsettled batch has passed.
type Durable <-chan error

// DeferredBatchHandler is a BatchHandler whose writes become durable after
// it returns, such as commits made with synchronous_commit off. Its batches'
// offsets are committed in order, each once its Durable settled with nil; a
// nil Durable means the writes already are.
type DeferredBatchHandler func(ctx context.Context, msgs []*sarama.ConsumerMessage) (Durable, error)

// errWritesMayBeLost ends a group session whose handler's writes may be lost.
var errWritesMayBeLost = errors.New("a handled batch's writes may be lost")

// maxUnsettled bounds the batches of a partition that wait to be durable;
// at the bound the partition stops reading until the oldest settles.
const maxUnsettled = 1024

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
	handle   DeferredBatchHandler
	log      *slog.Logger
}

// NewBatchConsumer returns a consumer of topic in group. maxBatch <= 0 means 512.
func NewBatchConsumer(c Config, group, topic string, maxBatch int, h BatchHandler, log *slog.Logger) (*BatchConsumer, error) {
	return NewDeferredBatchConsumer(c, group, topic, maxBatch, func(ctx context.Context, msgs []*sarama.ConsumerMessage) (Durable, error) {
		return nil, h(ctx, msgs)
	}, log)
}

// NewDeferredBatchConsumer is NewBatchConsumer for a handler whose writes
// become durable after it returns.
func NewDeferredBatchConsumer(c Config, group, topic string, maxBatch int, h DeferredBatchHandler, log *slog.Logger) (*BatchConsumer, error) {
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
	var unsettled unsettledMarks
	for {
		batch = batch[:0]
		msgs := claim.Messages()
		if len(unsettled) >= maxUnsettled {
			msgs = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-unsettled.oldest():
			if err := unsettled.settled(sess, err); err != nil {
				return h.rewind(ctx, claim, err)
			}
			continue
		case m, ok := <-msgs:
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
		durable, ok := h.handle(ctx, claim, batch)
		if !ok {
			return nil // the partition moves on with whoever owns it next
		}
		unsettled = append(unsettled, unsettledMark{msg: batch[len(batch)-1], durable: durable})
		if err := unsettled.markSettled(sess); err != nil {
			return h.rewind(ctx, claim, err)
		}
	}
}

// handle runs the handler on batch until it succeeds; false means the
// session ended first.
func (h *batchGroupHandler) handle(ctx context.Context, claim sarama.ConsumerGroupClaim, batch []*sarama.ConsumerMessage) (Durable, bool) {
	backoff := 100 * time.Millisecond
	for {
		durable, err := h.b.handle(ctx, batch)
		if err == nil {
			return durable, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		h.b.log.WarnContext(ctx, "handling a batch failed, retrying", "group", h.b.group,
			"partition", claim.Partition(), "offset", batch[0].Offset, "messages", len(batch), "error", err)
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// rewind ends the group session: returning from ConsumeClaim makes sarama
// stop every claim of the session, and Run joins again, reading from the
// committed offsets.
func (h *batchGroupHandler) rewind(ctx context.Context, claim sarama.ConsumerGroupClaim, err error) error {
	h.b.log.WarnContext(ctx, "handled messages may not be durable; reading the partitions again from their committed offsets",
		"group", h.b.group, "partition", claim.Partition(), "error", err)
	return fmt.Errorf("%w: %w", errWritesMayBeLost, err)
}

// unsettledMarks are a partition's handled batches whose writes are not
// known to be durable yet, oldest first; each is marked once it and every
// batch before it settled.
type unsettledMarks []unsettledMark

type unsettledMark struct {
	msg     *sarama.ConsumerMessage // the batch's last message
	durable Durable
}

// oldest returns what to wait on for the oldest batch: nil (never ready in
// a select) when there is none.
func (u unsettledMarks) oldest() Durable {
	if len(u) == 0 {
		return nil
	}
	return u[0].durable
}

// settled records that the oldest batch settled with err and marks every
// batch that is settled in order after it.
func (u *unsettledMarks) settled(sess sarama.ConsumerGroupSession, err error) error {
	if err != nil {
		return err
	}
	sess.MarkMessage((*u)[0].msg, "")
	*u = (*u)[1:]
	return u.markSettled(sess)
}

// markSettled marks the oldest batches while they are settled.
func (u *unsettledMarks) markSettled(sess sarama.ConsumerGroupSession) error {
	for len(*u) > 0 {
		oldest := (*u)[0]
		if oldest.durable != nil {
			select {
			case err := <-oldest.durable:
				if err != nil {
					return err
				}
			default:
				return nil
			}
		}
		sess.MarkMessage(oldest.msg, "")
		*u = (*u)[1:]
	}
	return nil
}
