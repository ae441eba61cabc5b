package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
)

// Headers a dead letter carries besides the original message's own: why it
// was refused, and where it was read from.
const (
	headerError     = "effectline_error"
	headerTopic     = "effectline_topic"
	headerPartition = "effectline_partition"
	headerOffset    = "effectline_offset"
)

// DeadLetter is one message of the dead-letter topic: the refused message's
// key and value unchanged, and the headers saying why and from where.
type DeadLetter struct {
	Partition int32
	Offset    int64
	Timestamp time.Time
	Key       []byte
	Value     []byte
	Headers   map[string]string
}

// Reason is why the message was refused.
func (d DeadLetter) Reason() string { return d.Headers[headerError] }

// source is where the refused message was read, topic/partition/offset.
func (d DeadLetter) source() string {
	t, p, o := d.Headers[headerTopic], d.Headers[headerPartition], d.Headers[headerOffset]
	if t == "" && p == "" && o == "" {
		return ""
	}
	return t + "/" + p + "/" + o
}

// MarshalJSON writes the key and value as text when they are UTF-8 (an
// intent is JSON, and a refused one usually nearly so), else as base64
// under key_base64 / value_base64, so any message survives the round trip.
func (d DeadLetter) MarshalJSON() ([]byte, error) {
	out := map[string]any{
		"partition":        d.Partition,
		"offset":           d.Offset,
		"timestamp":        d.Timestamp.UTC(),
		"reason":           d.Reason(),
		"source_topic":     d.Headers[headerTopic],
		"source_partition": d.Headers[headerPartition],
		"source_offset":    d.Headers[headerOffset],
		"headers":          d.Headers,
	}
	for name, b := range map[string][]byte{"key": d.Key, "value": d.Value} {
		if utf8.Valid(b) {
			out[name] = string(b)
		} else {
			out[name+"_base64"] = base64.StdEncoding.EncodeToString(b)
		}
	}
	return json.Marshal(out)
}

// ErrNoTopic is returned (wrapped) when the dead-letter topic does not
// exist on the brokers.
var ErrNoTopic = errors.New("topic does not exist")

// dlqIdle bounds the wait for the next message of a partition that the
// broker said holds more.
const dlqIdle = 15 * time.Second

// readDeadLetters reads topic as it stands: every partition from its
// oldest retained offset (or, with limit > 0, its last limit messages) up
// to the high-water mark at the start. It joins no consumer group and
// commits nothing, so reading the dead letters never moves anyone's
// offsets. The result is in time order, at most limit long when limit > 0.
func readDeadLetters(ctx context.Context, brokers []string, topic string, limit int) ([]DeadLetter, error) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.ClientID = "effectline-ops"
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 2
	cfg.Metadata.Full = false
	// Reading must not create the topic it looks for.
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Consumer.Return.Errors = true
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot reach Kafka at %s (%s): %w", strings.Join(brokers, ","), EnvKafkaBrokers, err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("%s: %w on %s: nothing was ever dead-lettered there, or %s names another prefix",
			topic, ErrNoTopic, strings.Join(brokers, ","), EnvTopicPrefix)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	var out []DeadLetter
	for _, p := range parts {
		got, err := readPartition(ctx, client, consumer, topic, p, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp.Before(out[j].Timestamp) })
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

func readPartition(ctx context.Context, client sarama.Client, consumer sarama.Consumer, topic string, p int32, limit int) ([]DeadLetter, error) {
	oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
	if err != nil {
		return nil, fmt.Errorf("%s/%d: oldest offset: %w", topic, p, err)
	}
	end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return nil, fmt.Errorf("%s/%d: newest offset: %w", topic, p, err)
	}
	from := oldest
	if limit > 0 && end-int64(limit) > from {
		from = end - int64(limit)
	}
	if from >= end {
		return nil, nil
	}
	pc, err := consumer.ConsumePartition(topic, p, from)
	if err != nil {
		return nil, fmt.Errorf("%s/%d: %w", topic, p, err)
	}
	defer pc.Close()
	var out []DeadLetter
	for {
		idle := time.NewTimer(dlqIdle)
		select {
		case <-ctx.Done():
			idle.Stop()
			return nil, ctx.Err()
		case err := <-pc.Errors():
			idle.Stop()
			return nil, fmt.Errorf("%s/%d: %w", topic, p, err)
		case <-idle.C:
			return nil, fmt.Errorf("%s/%d: no message within %s, though the broker reports offsets up to %d", topic, p, dlqIdle, end-1)
		case m := <-pc.Messages():
			idle.Stop()
			d := DeadLetter{Partition: m.Partition, Offset: m.Offset, Timestamp: m.Timestamp,
				Key: m.Key, Value: m.Value, Headers: map[string]string{}}
			for _, h := range m.Headers {
				if h != nil {
					d.Headers[string(h.Key)] = string(h.Value)
				}
			}
			out = append(out, d)
			// Offsets may skip (compaction, transaction markers): stop at
			// the last offset below the high-water mark, whatever came.
			if m.Offset >= end-1 {
				return out, nil
			}
		}
	}
}
