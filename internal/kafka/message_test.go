package kafka_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
)

// TestTraceContextCrossesKafkaWhole: what the global propagator writes into
// an event's headers (traceparent, tracestate, baggage) is what a consumer's
// Message.Context reads back.
func TestTraceContextCrossesKafkaWhole(t *testing.T) {
	t.Parallel()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(trace.ContextWithRemoteSpanContext(context.Background(), sc), bag)

	env := events.Envelope{EventID: "e1", Type: events.AttemptSucceeded, OperationKey: "k", Seq: 2,
		OccurredAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	rec := kafka.EventRecord(ctx, "effectline.outcomes", env, []byte(`{}`))
	for _, h := range []string{"traceparent", "tracestate", "baggage", kafka.HeaderType, kafka.HeaderSubject} {
		if rec.Headers.Get(h) == "" {
			t.Errorf("no %s header: %+v", h, rec.Headers)
		}
	}
	// The carrier replaces a header rather than repeating it.
	rec.Headers.Carrier().Set("tracestate", "vendor=abc")
	n := 0
	for _, h := range rec.Headers {
		if h.Key == "tracestate" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d tracestate headers after Set, want 1", n)
	}

	msg := &kafka.Message{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers}
	got := msg.Context(context.Background())
	gsc := trace.SpanContextFromContext(got)
	if gsc.TraceID() != tid || gsc.SpanID() != sid || gsc.TraceState().Get("vendor") != "abc" {
		t.Errorf("span context read back = %v (tracestate %q)", gsc, gsc.TraceState())
	}
	if v := baggage.FromContext(got).Member("tenant").Value(); v != "acme" {
		t.Errorf("baggage tenant = %q, want acme", v)
	}
}

// TestEventRejectsWhatIsNotAnEnvelope: Message.Event tells a value that is
// not JSON from JSON that is not a valid envelope.
func TestEventRejectsWhatIsNotAnEnvelope(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ value, want string }{
		{"\x00 not json", kafka.RejectNotJSON},
		{`{"event_id":"x"}`, kafka.RejectInvalidEnvelope},
	} {
		m := &kafka.Message{Value: []byte(c.value)}
		if _, ok := m.Event(); ok {
			t.Errorf("%q decoded", c.value)
		}
		if got := m.Rejected(); got != c.want {
			t.Errorf("%q rejected as %q, want %q", c.value, got, c.want)
		}
	}
}
