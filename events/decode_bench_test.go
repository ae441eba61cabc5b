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

// benchIntent is the intent the per-event benchmarks below share.
func benchIntent(b *testing.B) events.Envelope {
	b.Helper()
	e, err := events.New(events.IntentRecorded, "wf:ord-1001/charge", 1, "payments.charge", events.Irreversible, 0,
		events.IntentData{Args: json.RawMessage(`{"amount":1234,"currency":"EUR","customer":{"id":"c_1","tags":["a","b"]}}`), Principal: "billing-agent"},
		time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkDecodeIntent is BenchmarkDecode on the small args the other
// per-event benchmarks use.
func BenchmarkDecodeIntent(b *testing.B) {
	raw, err := events.Encode(benchIntent(b))
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

// BenchmarkDecodeAttemptStarted decodes the most frequent event after the
// intent: one per attempt, with times to parse.
func BenchmarkDecodeAttemptStarted(b *testing.B) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	e, err := events.New(events.AttemptStarted, "wf:ord-1001/charge", 2, "payments.charge", events.Irreversible, 1,
		events.AttemptStartedData{DownstreamKey: "wf:ord-1001/charge", Worker: "executor-0/3", LeaseUntil: at.Add(time.Minute)}, at)
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

func BenchmarkDecodeData(b *testing.B) {
	e := benchIntent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.DecodeData(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyIntent folds an intent into a fresh record: the projector
// and the executor pay it for every operation.
func BenchmarkApplyIntent(b *testing.B) {
	e := benchIntent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Apply(events.Operation{}, e); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	e := benchIntent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Encode(e); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNew(b *testing.B) {
	d := events.IntentData{Args: json.RawMessage(`{"amount":1234,"currency":"EUR","customer":{"id":"c_1","tags":["a","b"]}}`), Principal: "billing-agent"}
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.New(events.IntentRecorded, "wf:ord-1001/charge", 1, "payments.charge", events.Irreversible, 0, d, at); err != nil {
			b.Fatal(err)
		}
	}
}
