package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/events"
)

// Headers of a dead letter (contract), added to the message's own.
const (
	// HeaderDeadLetterError is why the message was refused: a reason word
	// such as not_json or unknown_tool.
	HeaderDeadLetterError = "effectline_error"
	// HeaderDeadLetterTopic, HeaderDeadLetterPartition and
	// HeaderDeadLetterOffset say where the message was.
	HeaderDeadLetterTopic     = "effectline_topic"
	HeaderDeadLetterPartition = "effectline_partition"
	HeaderDeadLetterOffset    = "effectline_offset"
	// HeaderDeadLetterDetail says what exactly is wrong, for people.
	HeaderDeadLetterDetail = "effectline_error_detail"
)

// maxDetail caps the detail header and the logged key: both come from
// whoever produced the message.
const maxDetail = 1024

// DeadLetterTopic is the dead-letter topic of topic (the full name, prefix
// included): effectline.intents → effectline.intents.dlq.
func DeadLetterTopic(topic string) string { return topic + ".dlq" }

// deadLetter is the copy of a rejected message: key and value unchanged,
// its headers kept, and where it was and why it was refused added (over any
// header of those names the producer set).
func deadLetter(m *Message, r *rejection) Record {
	h := append(Headers(nil), m.Headers...)
	c := h.Carrier()
	c.Set(HeaderDeadLetterError, r.reason)
	c.Set(HeaderDeadLetterTopic, m.Topic)
	c.Set(HeaderDeadLetterPartition, strconv.FormatInt(int64(m.Partition), 10))
	c.Set(HeaderDeadLetterOffset, strconv.FormatInt(m.Offset, 10))
	if r.err != nil {
		c.Set(HeaderDeadLetterDetail, truncate(r.err.Error()))
	}
	return Record{Topic: DeadLetterTopic(m.Topic), Key: m.Key, Value: m.Value, Headers: h}
}

func truncate(s string) string {
	if len(s) > maxDetail {
		return s[:maxDetail] + "…"
	}
	return s
}

// dispose deals with the messages of a handled batch that were rejected:
// each is logged (never its value: it may hold tool arguments) and
// counted, and with DeadLetters copied to the dead-letter topic. It returns
// once the broker acknowledged every copy; false means the session ended
// first, and the batch must not be committed.
func (b *BatchConsumer) dispose(ctx context.Context, batch []*Message) bool {
	var letters []Record
	var reasons []string
	for _, m := range batch {
		r := m.rejected
		if r == nil {
			continue
		}
		b.log.WarnContext(ctx, "rejected a message that can never be handled",
			"partition", m.Partition, "offset", m.Offset, "kafka_key", truncate(string(m.Key)),
			"bytes", len(m.Value), "reason", r.reason, "error", r.err, "dead_lettered", b.dlq != nil)
		b.rejected.Add(ctx, 1, metric.WithAttributes(attribute.String("group", b.cc.Group),
			attribute.String("topic", b.cc.Topic), attribute.String("reason", r.reason)))
		if b.dlq != nil {
			letters = append(letters, deadLetter(m, r))
			reasons = append(reasons, r.reason)
		}
	}
	if len(letters) == 0 {
		return true
	}
	backoff := 100 * time.Millisecond
	for failures := 0; ; failures++ {
		err := b.dlq.Send(ctx, letters)
		if err == nil {
			for _, reason := range reasons {
				b.deadLetters.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if failures == 0 {
			b.log.WarnContext(ctx, "writing dead letters failed; the partition waits and retries",
				"dead_letters", len(letters), "error", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// DeadLetter is one message of a dead-letter topic.
type DeadLetter struct {
	// Reason is the effectline_error header; Detail says more.
	Reason string
	Detail string
	// Topic, Partition and Offset are where the message was refused.
	Topic     string
	Partition int32
	Offset    int64
	// Key and Value are the message's, unchanged.
	Key   []byte
	Value []byte
	// At is when it was dead-lettered.
	At time.Time
	// DLQPartition and DLQOffset are where the copy sits.
	DLQPartition int32
	DLQOffset    int64
}

// ReadDeadLetters returns the dead letters of the intents topic that are
// on it when called, partition by partition in offset order, at most limit
// of them (limit <= 0: all). It reads outside any consumer group and
// commits nothing, so it may run beside everything else, any number of
// times.
//
// It is written on segmentio/kafka-go's stateless Client: one metadata
// request, one ListOffsets, and fetches from the first to the last offset,
// with nothing to join, close or commit, which is what a one-shot reader for
// an operator's command line wants.
func ReadDeadLetters(ctx context.Context, c Config, limit int) ([]DeadLetter, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	topic := c.Topic(events.TopicIntentsDLQ)
	client := &kafkago.Client{Addr: kafkago.TCP(c.Brokers...), Timeout: c.ConnectTimeout}
	md, err := client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("reading %s: metadata: %w", topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		var terr error = errors.New("not in the metadata")
		if len(md.Topics) == 1 {
			terr = md.Topics[0].Error
		}
		return nil, fmt.Errorf("reading %s: %w", topic, terr)
	}
	reqs := make([]kafkago.OffsetRequest, 0, 2*len(md.Topics[0].Partitions))
	for _, p := range md.Topics[0].Partitions {
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	offs, err := client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("reading %s: offsets: %w", topic, err)
	}
	parts := offs.Topics[topic]
	sort.Slice(parts, func(i, j int) bool { return parts[i].Partition < parts[j].Partition })
	var out []DeadLetter
	for _, p := range parts {
		if p.Error != nil {
			return nil, fmt.Errorf("reading %s/%d: offsets: %w", topic, p.Partition, p.Error)
		}
		for off := p.FirstOffset; off < p.LastOffset; {
			if limit > 0 && len(out) >= limit {
				return out, nil
			}
			next, err := fetchDeadLetters(ctx, client, topic, p.Partition, off, p.LastOffset, limit, &out)
			if err != nil {
				return nil, err
			}
			off = next
		}
	}
	return out, nil
}

// fetchDeadLetters reads one fetch of partition from offset, below end,
// into out, and returns the offset to go on from.
func fetchDeadLetters(ctx context.Context, client *kafkago.Client, topic string, partition int, offset, end int64, limit int, out *[]DeadLetter) (int64, error) {
	resp, err := client.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 500 * time.Millisecond})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s/%d at %d: %w", topic, partition, offset, err)
	}
	next := offset
	for {
		rec, err := resp.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("reading %s/%d at %d: %w", topic, partition, next, err)
		}
		if rec.Offset < offset {
			continue // a fetch may start at the batch holding offset
		}
		if rec.Offset >= end || limit > 0 && len(*out) >= limit {
			return end, nil
		}
		dl := DeadLetter{DLQPartition: int32(partition), DLQOffset: rec.Offset, At: rec.Time}
		if dl.Key, err = readBytes(rec.Key); err == nil {
			dl.Value, err = readBytes(rec.Value)
		}
		if err != nil {
			return 0, fmt.Errorf("reading %s/%d at %d: %w", topic, partition, rec.Offset, err)
		}
		for _, h := range rec.Headers {
			switch h.Key {
			case HeaderDeadLetterError:
				dl.Reason = string(h.Value)
			case HeaderDeadLetterDetail:
				dl.Detail = string(h.Value)
			case HeaderDeadLetterTopic:
				dl.Topic = string(h.Value)
			case HeaderDeadLetterPartition:
				p, _ := strconv.ParseInt(string(h.Value), 10, 32)
				dl.Partition = int32(p)
			case HeaderDeadLetterOffset:
				dl.Offset, _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		*out = append(*out, dl)
		next = rec.Offset + 1
	}
	if next == offset {
		// Nothing at or past offset in this fetch: the rest of the range
		// is gone (retention, compaction) or not readable yet.
		return end, nil
	}
	return next, nil
}

func readBytes(b io.ReadCloser) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	return io.ReadAll(b)
}
