package kafka

import (
	"context"
	"encoding/json"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/effectline/effectline/events"
)

// Header names: CloudEvents 1.0 Kafka protocol binding (binary content
// mode). The trace context headers (traceparent, tracestate, baggage) are
// whatever the global OpenTelemetry propagator writes.
const (
	HeaderSpecVersion = "ce_specversion"
	HeaderID          = "ce_id"
	HeaderSource      = "ce_source"
	HeaderType        = "ce_type"
	HeaderSubject     = "ce_subject"
	HeaderTime        = "ce_time"
	HeaderContentType = "content-type"
	HeaderTraceparent = "traceparent"
)

// Source is the CloudEvents source attribute of every event effectline emits.
const Source = "effectline"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Headers are a record's headers. As an OpenTelemetry TextMapCarrier
// (through Carrier) they carry a span context across Kafka.
type Headers []Header

// Get returns the value of the first header named key, or "".
func (h Headers) Get(key string) string {
	for _, x := range h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

// Carrier adapts headers to propagation.TextMapCarrier: Set replaces a
// header of the same name, or adds one.
func (h *Headers) Carrier() propagation.TextMapCarrier { return headerCarrier{h} }

type headerCarrier struct{ h *Headers }

func (c headerCarrier) Get(key string) string { return c.h.Get(key) }

func (c headerCarrier) Set(key, value string) {
	for i := range *c.h {
		if (*c.h)[i].Key == key {
			(*c.h)[i].Value = []byte(value)
			return
		}
	}
	*c.h = append(*c.h, Header{Key: key, Value: []byte(value)})
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(*c.h))
	for i, x := range *c.h {
		keys[i] = x.Key
	}
	return keys
}

// Record is one message to publish.
type Record struct {
	Topic string
	// Key picks the partition (murmur2); nil spreads records at random.
	Key     []byte
	Value   []byte
	Headers Headers
}

// EventRecord maps an event to a record: key = operation key (so one
// operation's events stay in one partition, in order), value = the
// envelope exactly as journaled, the CloudEvents attributes as headers, and
// the trace context of ctx as the global propagator writes it.
func EventRecord(ctx context.Context, topic string, env events.Envelope, raw []byte) Record {
	h := Headers{
		{Key: HeaderSpecVersion, Value: []byte("1.0")},
		{Key: HeaderID, Value: []byte(env.EventID)},
		{Key: HeaderSource, Value: []byte(Source)},
		{Key: HeaderType, Value: []byte(env.Type)},
		{Key: HeaderSubject, Value: []byte(env.OperationKey)},
		{Key: HeaderTime, Value: []byte(env.OccurredAt.UTC().Format(time.RFC3339Nano))},
		{Key: HeaderContentType, Value: []byte("application/json")},
	}
	otel.GetTextMapPropagator().Inject(ctx, h.Carrier())
	return Record{Topic: topic, Key: []byte(env.OperationKey), Value: raw, Headers: h}
}

// ProducerMessage is r for sarama's producers (tests and benchmarks that
// produce as a non-effectline client would).
func ProducerMessage(r Record) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: r.Topic, Value: sarama.ByteEncoder(r.Value)}
	if r.Key != nil {
		m.Key = sarama.ByteEncoder(r.Key)
	}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return m
}

// Message is one message a consumer hands to a component: where it sits,
// what it holds, and (through Context) the trace it continues.
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   Headers
	Timestamp time.Time

	rejected *rejection
}

// rejection is why a handler refused a message for good.
type rejection struct {
	reason string
	err    error
}

func messageFrom(m *sarama.ConsumerMessage) *Message {
	msg := &Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	if len(m.Headers) > 0 {
		msg.Headers = make(Headers, 0, len(m.Headers))
		for _, h := range m.Headers {
			if h != nil {
				msg.Headers = append(msg.Headers, Header{Key: string(h.Key), Value: h.Value})
			}
		}
	}
	return msg
}

// Context returns parent carrying the span context (and baggage) the
// message's headers hold, read by the global propagator, so spans started
// from it continue the producer's trace.
func (m *Message) Context(parent context.Context) context.Context {
	return otel.GetTextMapPropagator().Extract(parent, m.Headers.Carrier())
}

// Reject says the message can never be handled: it is malformed or breaks
// the contract. reason is a short stable word for metrics and dead letters
// (RejectNotJSON, …); err says what exactly is wrong and must not quote the
// payload. The consumer logs it, counts it, copies it to the dead-letter
// topic when it has one, and moves on: a rejected message never blocks its
// partition. A handler that rejects a message returns no error for it.
func (m *Message) Reject(reason string, err error) { m.rejected = &rejection{reason: reason, err: err} }

// Rejected returns the reason the message was rejected with, or "".
func (m *Message) Rejected() string {
	if m.rejected == nil {
		return ""
	}
	return m.rejected.reason
}

// Reasons a message is rejected that every consumer shares.
const (
	// RejectNotJSON: the value is not JSON at all.
	RejectNotJSON = "not_json"
	// RejectInvalidEnvelope: JSON, but not a valid event envelope.
	RejectInvalidEnvelope = "invalid_envelope"
)

// Event decodes the message's value as an event envelope. A message that
// is not one is rejected (RejectNotJSON or RejectInvalidEnvelope), and ok is
// false.
func (m *Message) Event() (env events.Envelope, ok bool) {
	env, err := events.Decode(m.Value)
	if err == nil {
		return env, true
	}
	reason := RejectInvalidEnvelope
	if !json.Valid(m.Value) {
		reason = RejectNotJSON
	}
	m.Reject(reason, err)
	return events.Envelope{}, false
}
