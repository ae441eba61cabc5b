package kafka

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectline/effectline/events"
)

// Header names: CloudEvents 1.0 Kafka protocol binding (binary content mode)
// and W3C trace context.
const (
	HeaderSpecVersion = "ce_specversion"
	HeaderID          = "ce_id"
	HeaderSource      = "ce_source"
	HeaderType        = "ce_type"
	HeaderSubject     = "ce_subject"
	HeaderTime        = "ce_time"
	HeaderContentType = "content-type"
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Source is the CloudEvents source attribute of every event effectline emits.
const Source = "effectline"

// Record is one event ready to publish.
type Record struct {
	Topic       string
	Envelope    events.Envelope
	Raw         []byte // the encoded envelope, exactly as journaled
	Traceparent string
}

// ProducerMessage maps an event to a Kafka message: key = operation key (so
// one operation's events stay in one partition, in order), value = the
// envelope JSON, CloudEvents attributes and traceparent as headers.
func ProducerMessage(r Record) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{
		Topic:   r.Topic,
		Key:     sarama.StringEncoder(r.Envelope.OperationKey),
		Value:   sarama.ByteEncoder(r.Raw),
		Headers: headers(r),
	}
}

// headers are an event's CloudEvents attributes and trace context.
func headers(r Record) []sarama.RecordHeader {
	h := []sarama.RecordHeader{
		{Key: []byte(HeaderSpecVersion), Value: []byte("1.0")},
		{Key: []byte(HeaderID), Value: []byte(r.Envelope.EventID)},
		{Key: []byte(HeaderSource), Value: []byte(Source)},
		{Key: []byte(HeaderType), Value: []byte(r.Envelope.Type)},
		{Key: []byte(HeaderSubject), Value: []byte(r.Envelope.OperationKey)},
		{Key: []byte(HeaderTime), Value: []byte(r.Envelope.OccurredAt.UTC().Format(time.RFC3339Nano))},
		{Key: []byte(HeaderContentType), Value: []byte("application/json")},
	}
	if r.Traceparent != "" {
		h = append(h, sarama.RecordHeader{Key: []byte(HeaderTraceparent), Value: []byte(r.Traceparent)})
	}
	return h
}

// Unmarshaler maps a Kafka message to a watermill message without ever
// failing: watermill-kafka stops consuming the partition when an
// unmarshaler fails, so a malformed event would block every event behind it.
// Validation happens in the handler, which records a rejected message and
// moves on.
type Unmarshaler struct{}

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

// MetadataKey holds the Kafka message key in watermill metadata.
const MetadataKey = "kafka_key"

// TraceparentOf returns the trace context a message carries.
func TraceparentOf(msg *message.Message) string { return msg.Metadata.Get(HeaderTraceparent) }

// ContextWithTraceparent returns ctx carrying the remote span context of a
// W3C traceparent, so spans started from it continue the operation's trace.
func ContextWithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{HeaderTraceparent: traceparent})
}

// TraceparentFrom returns the W3C traceparent of the span in ctx, or "".
func TraceparentFrom(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c[HeaderTraceparent]
}

// HeaderValue returns the value of the first header named key, or "".
func HeaderValue(headers []*sarama.RecordHeader, key string) string {
	for _, h := range headers {
		if h != nil && string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}
