package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/internal/metrics"
)

// BatchHandler handles the messages of one partition, in offset order. A nil
// error commits them all; an error leaves them uncommitted, and the same
// messages are handed over again after a backoff. It must be idempotent. A
// message that can never be handled is rejected (Message.Reject), not
// failed.
type BatchHandler func(ctx context.Context, msgs []*Message) error

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
type DeferredBatchHandler func(ctx context.Context, msgs []*Message) (Durable, error)

// errWritesMayBeLost ends a group session whose handler's writes may be lost.
var errWritesMayBeLost = errors.New("a handled batch's writes may be lost")

// maxUnsettled bounds the batches of a partition that wait to be durable;
// at the bound the partition stops reading until the oldest settles.
const maxUnsettled = 1024

// Concurrently is a BatchHandler that runs h on every message of a batch at
// once, each in its own goroutine, and fails the batch if any call fails.
// Handlers whose work ends in a group commit use it so that a partition's
// messages share commits instead of queueing for one each.
func Concurrently(h func(ctx context.Context, msg *Message) error) BatchHandler {
	return func(ctx context.Context, msgs []*Message) error {
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

// ConsumerConfig says what a BatchConsumer reads and how.
type ConsumerConfig struct {
	// Group is the consumer group. Required.
	Group string
	// Topic is the full name of the topic. Required.
	Topic string
	// MaxBatch caps the messages of one hand-over. Default 512.
	MaxBatch int
	// DeadLetters makes the consumer copy every rejected message, key and
	// value unchanged, to DeadLetterTopic(Topic), and commit past it only
	// once the broker acknowledged the copy. Without it a rejected message
	// is logged, counted and skipped.
	DeadLetters bool
	// Logger receives the consumer's logs. Default slog.Default().
	Logger *slog.Logger
	// MeterProvider serves the rejected-message and dead-letter counters.
	// Default: the global provider.
	MeterProvider metric.MeterProvider
}

// BatchConsumer is a consumer group that hands a partition's messages over
// in batches: every message already fetched, up to MaxBatch, at once. It is
// the one way effectline's components read Kafka, and where a message that
// can never be handled is logged, counted and, on the intents topic, dead
// lettered.
//
// It exists beside watermill-kafka because watermill's subscriber delivers
// one message per partition and waits for its ack before the next, so a
// consumer whose handling ends in a database commit is capped at
// partitions ÷ commit latency (BenchmarkConsumers in this package measures
// both). The projector folds a partition's messages into one transaction;
// the executor claims each intent of a batch concurrently, so the claims
// share group commits; the reconciler only hands operations to its workers.
type BatchConsumer struct {
	cfg    Config
	cc     ConsumerConfig
	handle DeferredBatchHandler
	log    *slog.Logger
	dlq    *Producer // nil without DeadLetters, or before Run connects it

	rejected    metric.Int64Counter
	deadLetters metric.Int64Counter
}

// NewBatchConsumer returns a consumer of cc.Topic in cc.Group. It does no I/O.
func NewBatchConsumer(c Config, cc ConsumerConfig, h BatchHandler) (*BatchConsumer, error) {
	return NewDeferredBatchConsumer(c, cc, func(ctx context.Context, msgs []*Message) (Durable, error) {
		return nil, h(ctx, msgs)
	})
}

// NewDeferredBatchConsumer is NewBatchConsumer for a handler whose writes
// become durable after it returns.
func NewDeferredBatchConsumer(c Config, cc ConsumerConfig, h DeferredBatchHandler) (*BatchConsumer, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if cc.Group == "" || cc.Topic == "" {
		return nil, errors.New("kafka: a consumer needs a group and a topic")
	}
	if cc.MaxBatch <= 0 {
		cc.MaxBatch = 512
	}
	if cc.Logger == nil {
		cc.Logger = slog.Default()
	}
	if cc.MeterProvider == nil {
		cc.MeterProvider = otel.GetMeterProvider()
	}
	b := &BatchConsumer{cfg: c, cc: cc, handle: h, log: cc.Logger.With("component", "kafka_consumer", "group", cc.Group, "topic", cc.Topic)}
	m := cc.MeterProvider.Meter(instrumentation)
	if err := metrics.Counters(m,
		metrics.Counter{Into: &b.rejected, Name: MetricRejectedMessages,
			Description: "Messages a consumer group skipped because they can never be handled, by group, topic and reason."},
		metrics.Counter{Into: &b.deadLetters, Name: MetricDeadLetters,
			Description: "Messages copied to a dead-letter topic, by reason."},
	); err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	return b, nil
}

// Metric names of the consumer. On /metrics they read
// effectline_kafka_rejected_messages_total{group,topic,reason} and
// effectline_dead_letters_total{reason}.
const (
	MetricRejectedMessages = "effectline.kafka.rejected_messages"
	MetricDeadLetters      = "effectline.dead_letters"
)

const instrumentation = "github.com/effectline/effectline/internal/kafka"

// Run consumes until ctx ends. Offsets of handled batches are committed by
// sarama's auto-commit, and once more when the group closes.
func (b *BatchConsumer) Run(ctx context.Context) error {
	sc := b.cfg.Sarama()
	sc.ClientID = b.cfg.ClientID + "-" + b.cc.Group
	// A batch is committed to the database before its offsets are marked;
	// a long batch must not cost the partition its claim.
	sc.Consumer.MaxProcessingTime = 30 * time.Second
	sc.Consumer.Group.InstanceId = b.cfg.InstanceID
	if b.cc.DeadLetters {
		dlq, err := NewProducer(b.cfg)
		if err != nil {
			return fmt.Errorf("dead letters of %s: %w", b.cc.Topic, err)
		}
		defer dlq.Close()
		b.dlq = dlq
	}
	group, err := sarama.NewConsumerGroup(b.cfg.Brokers, b.cc.Group, sc)
	if err != nil {
		return fmt.Errorf("consumer group %s on %v: %w", b.cc.Group, b.cfg.Brokers, err)
	}
	defer group.Close()
	go func() {
		for err := range group.Errors() {
			b.log.WarnContext(ctx, "consumer group error", "error", err)
		}
	}()
	h := &batchGroupHandler{b: b}
	for ctx.Err() == nil {
		// Consume returns at every rebalance; loop to rejoin.
		if err := group.Consume(ctx, []string{b.cc.Topic}, h); err != nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
				return nil
			}
			b.log.WarnContext(ctx, "consuming failed, rejoining", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

type batchGroupHandler struct{ b *BatchConsumer }

// Setup logs each session the group hands this member: a rebalance stops
// consumption of every partition of the group until it ends, so a gap in
// an operation's latency lines up with these lines.
func (h *batchGroupHandler) Setup(sess sarama.ConsumerGroupSession) error {
	h.b.log.InfoContext(sess.Context(), "consumer group session started", "group", h.b.cc.Group,
		"generation", sess.GenerationID(), "partitions", len(sess.Claims()[h.b.cc.Topic]))
	return nil
}

func (h *batchGroupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *batchGroupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	maxBatch := h.b.cc.MaxBatch
	batch := make([]*Message, 0, maxBatch)
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
			batch = append(batch, messageFrom(m))
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case m, ok := <-claim.Messages():
				if !ok {
					break drain
				}
				batch = append(batch, messageFrom(m))
			default:
				break drain
			}
		}
		durable, ok := h.handle(ctx, claim, batch)
		if !ok {
			return nil // the partition moves on with whoever owns it next
		}
		if !h.b.dispose(ctx, batch) {
			return nil // dead letters unacknowledged: the next owner reads the batch again
		}
		unsettled = append(unsettled, unsettledMark{msg: batch[len(batch)-1], durable: durable})
		if err := unsettled.markSettled(sess); err != nil {
			return h.rewind(ctx, claim, err)
		}
	}
}

// handle runs the handler on batch until it succeeds; false means the
// session ended first.
func (h *batchGroupHandler) handle(ctx context.Context, claim sarama.ConsumerGroupClaim, batch []*Message) (Durable, bool) {
	backoff := 100 * time.Millisecond
	for {
		for _, m := range batch {
			m.rejected = nil // a failed hand-over's verdicts are not kept
		}
		durable, err := h.b.handle(ctx, batch)
		if err == nil {
			return durable, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		h.b.log.WarnContext(ctx, "handling a batch failed, retrying",
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
		"partition", claim.Partition(), "error", err)
	return fmt.Errorf("%w: %w", errWritesMayBeLost, err)
}

// unsettledMarks are a partition's handled batches whose writes are not
// known to be durable yet, oldest first; each is marked once it and every
// batch before it settled.
type unsettledMarks []unsettledMark

type unsettledMark struct {
	msg     *Message // the batch's last message
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
	mark(sess, (*u)[0].msg)
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
		mark(sess, oldest.msg)
		*u = (*u)[1:]
	}
	return nil
}

// mark commits the partition up to and including m.
func mark(sess sarama.ConsumerGroupSession, m *Message) {
	sess.MarkOffset(m.Topic, m.Partition, m.Offset+1, "")
}
