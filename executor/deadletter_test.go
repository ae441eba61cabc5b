package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/store"
)

// TestPoisonMessagesAreDeadLettered: every kind of message on the intents
// topic that can never become an operation is copied to the dead-letter
// topic, key and value unchanged, with the reason and where it was; nothing
// is journaled for it; and a valid intent behind all of them on the same
// partition completes.
func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reader := sdkmetric.NewManualReader()
	e.start(func(c *executor.Config) {
		c.KafkaPrincipals = []string{"billing-agent"}
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})

	intent := func(key, toolName, principal string) []byte {
		ev, err := events.New(events.IntentRecorded, key, 1, toolName, events.Idempotent, 0,
			events.IntentData{Args: json.RawMessage(`{"k":"v"}`), Principal: principal}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	started, err := events.New(events.AttemptStarted, "poison/outcome", 2, "cache.set", events.Idempotent, 1,
		events.AttemptStartedData{Worker: "w", LeaseUntil: time.Now(), DownstreamKey: "poison/outcome"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	startedRaw, err := events.Encode(started)
	if err != nil {
		t.Fatal(err)
	}
	poison := []struct {
		reason string
		key    string
		value  []byte
	}{
		{kafka.RejectNotJSON, "poison/not-json", []byte("\x00\xff not an envelope {{{")},
		{kafka.RejectInvalidEnvelope, "poison/envelope", []byte(`{"event_id":"x","type":"intent.recorded"}`)},
		{executor.RejectNotAnIntent, "poison/outcome", startedRaw},
		{executor.RejectKeyMismatch, "not-the-operation-key", intent("poison/key", "cache.set", "billing-agent")},
		{executor.RejectUnknownTool, "poison/tool", intent("poison/tool", "nope.tool", "billing-agent")},
		{executor.RejectPrincipalNotAllowed, "poison/principal", intent("poison/principal", "cache.set", "intruder")},
	}

	// Everything on partition 0, the poison first.
	sc := e.kafka.Sarama()
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	pr, err := sarama.NewSyncProducer(e.kafka.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	topic := e.kafka.Topic(events.TopicIntents)
	offsets := map[string]int64{}
	for _, p := range poison {
		_, off, err := pr.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0,
			Key: sarama.StringEncoder(p.key), Value: sarama.ByteEncoder(p.value)})
		if err != nil {
			t.Fatal(err)
		}
		offsets[p.reason] = off
	}
	if _, _, err := pr.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0,
		Key: sarama.StringEncoder("poison/valid"), Value: sarama.ByteEncoder(intent("poison/valid", "cache.set", "billing-agent"))}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("poison/valid", events.StatusCompleted)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var letters []kafka.DeadLetter
	for len(letters) < len(poison) {
		if letters, err = kafka.ReadDeadLetters(ctx, e.kafka, 0); err != nil && ctx.Err() == nil {
			t.Logf("reading the dead letters: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d dead letters, want %d: %+v", len(letters), len(poison), letters)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if len(letters) != len(poison) {
		t.Fatalf("%d dead letters, want %d", len(letters), len(poison))
	}
	byReason := map[string]kafka.DeadLetter{}
	for _, l := range letters {
		byReason[l.Reason] = l
	}
	for _, p := range poison {
		l, ok := byReason[p.reason]
		switch {
		case !ok:
			t.Errorf("%s: no dead letter", p.reason)
		case string(l.Key) != p.key || string(l.Value) != string(p.value):
			t.Errorf("%s: dead letter key %q value %q, want the message's own", p.reason, l.Key, l.Value)
		case l.Topic != topic || l.Partition != 0 || l.Offset != offsets[p.reason]:
			t.Errorf("%s: dead letter says %s/%d@%d, want %s/0@%d", p.reason, l.Topic, l.Partition, l.Offset, topic, offsets[p.reason])
		case l.Detail == "":
			t.Errorf("%s: dead letter without a detail", p.reason)
		}
		if _, err := e.store.Load(ctx, p.key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: journaled under its key (%v)", p.reason, err)
		}
	}
	for _, key := range []string{"poison/key", "poison/tool", "poison/principal"} {
		if _, err := e.store.Load(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: journaled (%v), want dead-lettered only", key, err)
		}
	}
	counted := map[string]int64{}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != kafka.MetricDeadLetters {
				continue
			}
			sum, _ := m.Data.(metricdata.Sum[int64])
			for _, dp := range sum.DataPoints {
				reason, _ := dp.Attributes.Value("reason")
				counted[reason.AsString()] += dp.Value
			}
		}
	}
	for _, p := range poison {
		if counted[p.reason] != 1 {
			t.Errorf("%s: %s counted %d, want 1 (all: %v)", p.reason, kafka.MetricDeadLetters, counted[p.reason], counted)
		}
	}
	if got := e.fake.Applied(); got != 1 {
		t.Errorf("effects = %d, want 1 (the valid intent)", got)
	}
}
