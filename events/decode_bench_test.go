package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// BenchmarkDecode measures the strict decoder on a typical intent: every
// consumer pays it once per message.
func BenchmarkDecode(b *testing.B) {
	e, err := events.New(events.IntentRecorded, "wf:ord-1001/charge", 1, "payments.charge", events.Irreversible, 0,
		events.IntentData{Args: json.RawMessage(`{"amount":4999,"currency":"EUR","customer":{"id":"cus_123","email":"a@example.com"}}`), Principal: "billing-agent"},
		time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	raw, err := events.Encode(e)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Decode(raw); err != nil {
			b.Fatal(err)
		}
	}
}
