package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// Fixed times keep every expected record exact: the fold copies event times
// into the record, so a wall clock would make the tests compare nothing.
var (
	t0      = time.Date(2026, 3, 14, 9, 26, 53, 589793000, time.UTC)
	retryAt = t0.Add(10 * time.Minute)
	leaseAt = t0.Add(time.Minute)
)

const (
	testKey  = "order-7731/charge"
	testTool = "payments.charge"
)

// at is the occurred_at the test histories give the event with seq n, so a
// test can predict every timestamp the fold writes.
func at(seq int64) time.Time { return t0.Add(time.Duration(seq) * time.Second) }

// mustNew is events.New for data that always marshals.
func mustNew(tb testing.TB, typ events.Type, key string, seq int64, class events.EffectClass, attempt int, data any, when time.Time) events.Envelope {
	tb.Helper()
	e, err := events.New(typ, key, seq, testTool, class, attempt, data, when)
	if err != nil {
		tb.Fatalf("events.New(%s): %v", typ, err)
	}
	return e
}

// mustEncode is events.Encode for envelopes the test knows are valid.
func mustEncode(tb testing.TB, e events.Envelope) []byte {
	tb.Helper()
	b, err := events.Encode(e)
	if err != nil {
		tb.Fatalf("Encode(%s seq %d): %v", e.Type, e.Seq, err)
	}
	return b
}

func timePtr(t time.Time) *time.Time { return &t }

// example is one realistic event the Go code can emit.
type example struct {
	name string
	env  events.Envelope
}

// exampleEvents returns one event of every type and of every variant the
// fold or a consumer branches on (each failure kind, each next step, each
// decision, found and absent reconciliations, minimal and full data), in
// every effect class where the class matters. The decoder, fuzz and schema
// tests share it, so a new variant added here is checked by all three.
func exampleEvents(tb testing.TB) []example {
	tb.Helper()
	args := json.RawMessage(`{"amount":1299,"currency":"EUR","customer":{"id":"cus_42","tags":["vip"]},"note":"<b>&</b> \u2028 ünïcödé"}`)
	later := t0.Add(5 * time.Minute)
	inCET := time.Date(2026, 3, 14, 10, 30, 0, 0, time.FixedZone("CET", 3600))
	type spec struct {
		name    string
		typ     events.Type
		seq     int64
		class   events.EffectClass
		attempt int
		data    any
	}
	specs := []spec{
		{"intent", events.IntentRecorded, 1, events.Irreversible, 0, events.IntentData{Args: args, Principal: "billing-agent"}},
		{"intent empty args", events.IntentRecorded, 1, events.Idempotent, 0, events.IntentData{Args: json.RawMessage(`{}`), Principal: "dev"}},
		{"intent compensable", events.IntentRecorded, 1, events.Compensable, 0, events.IntentData{Args: json.RawMessage(`{"sku":"A-1","qty":2}`), Principal: "inventory-agent"}},
		{"intent rejected minimal", events.IntentRejected, 4, events.Irreversible, 0, events.IntentRejectedData{Reason: "payload_conflict"}},
		{"intent rejected full", events.IntentRejected, 5, events.Irreversible, 0, events.IntentRejectedData{
			Reason: "payload_conflict", PayloadHash: strings.Repeat("ab", 32), Principal: "billing-agent", EventID: events.NewID()}},
		{"attempt started", events.AttemptStarted, 2, events.Irreversible, 1, events.AttemptStartedData{
			DownstreamKey: testKey, Worker: "executor-0/3", LeaseUntil: leaseAt}},
		{"attempt started after backoff, new key", events.AttemptStarted, 7, events.Compensable, 2, events.AttemptStartedData{
			DownstreamKey: events.DownstreamKeyFor(testKey, 1), Worker: "executor-1/7", LeaseUntil: inCET, BackoffWaitedMS: 1830}},
		{"attempt succeeded full", events.AttemptSucceeded, 3, events.Compensable, 1, events.AttemptSucceededData{
			StatusCode: 201, Result: json.RawMessage(`{"id":"res_9","status":"held"}`), DownstreamID: "res_9", UndoRef: "res_9"}},
		{"attempt succeeded minimal", events.AttemptSucceeded, 3, events.Idempotent, 1, events.AttemptSucceededData{}},
		{"attempt succeeded scalar result", events.AttemptSucceeded, 3, events.Idempotent, 1, events.AttemptSucceededData{StatusCode: 200, Result: json.RawMessage(`"ok"`)}},
		{"attempt succeeded null result", events.AttemptSucceeded, 3, events.Idempotent, 1, events.AttemptSucceededData{StatusCode: 204, Result: json.RawMessage(`null`)}},
		{"attempt succeeded late", events.AttemptSucceeded, 9, events.Irreversible, 1, events.AttemptSucceededData{
			StatusCode: 200, Result: json.RawMessage(`[1,2,3]`), DownstreamID: "ch_1", Late: true}},
		{"attempt failed final", events.AttemptFailed, 3, events.Irreversible, 1, events.AttemptFailedData{
			Kind: events.Final, ErrorClass: "http_422", Error: "amount must be positive", StatusCode: 422}},
		{"attempt failed with the downstream's answer", events.AttemptFailed, 3, events.Irreversible, 1, events.AttemptFailedData{
			Kind: events.Final, ErrorClass: "http_422", StatusCode: 422,
			Response: json.RawMessage(`{"error":"amount exceeds order total"}`)}},
		{"attempt failed retryable with retry_at", events.AttemptFailed, 3, events.Idempotent, 1, events.AttemptFailedData{
			Kind: events.Retryable, ErrorClass: "http_503", StatusCode: 503, RetryAt: timePtr(later)}},
		{"attempt failed retryable caps spent", events.AttemptFailed, 3, events.Idempotent, 4, events.AttemptFailedData{
			Kind: events.Retryable, ErrorClass: "connection_refused", Error: "dial tcp 127.0.0.1:9000: connect: connection refused"}},
		{"attempt failed late", events.AttemptFailed, 8, events.Idempotent, 1, events.AttemptFailedData{
			Kind: events.Final, ErrorClass: "http_400", StatusCode: 400, Late: true}},
		{"attempt unknown retry", events.AttemptUnknown, 3, events.Idempotent, 1, events.AttemptUnknownData{
			ErrorClass: "timeout", Error: "context deadline exceeded", Next: events.NextRetry, RetryAt: timePtr(inCET)}},
		{"attempt unknown compensate", events.AttemptUnknown, 3, events.Compensable, 1, events.AttemptUnknownData{
			ErrorClass: "http_502", StatusCode: 502, Next: events.NextCompensate}},
		{"attempt unknown reconcile", events.AttemptUnknown, 3, events.Irreversible, 1, events.AttemptUnknownData{
			ErrorClass: "connection_reset", Next: events.NextReconcile}},
		{"attempt unknown lease expired late", events.AttemptUnknown, 6, events.Irreversible, 1, events.AttemptUnknownData{
			ErrorClass: "lease_expired", Next: events.NextReconcile, Late: true}},
		{"compensation started", events.CompensationStarted, 4, events.Compensable, 1, events.CompensationStartedData{
			DownstreamKey: testKey, DownstreamID: "res_9", Worker: "executor-0/3", LeaseUntil: leaseAt}},
		{"compensation succeeded with retry", events.CompensationSucceeded, 5, events.Compensable, 1, events.CompensationSucceededData{
			StatusCode: 200, RetryAt: timePtr(later)}},
		{"compensation succeeded caps spent", events.CompensationSucceeded, 5, events.Compensable, 3, events.CompensationSucceededData{StatusCode: 404}},
		{"compensation failed", events.CompensationFailed, 5, events.Compensable, 1, events.CompensationFailedData{
			Outcome: events.Failed, ErrorClass: "http_409", Error: "already shipped", StatusCode: 409}},
		{"compensation unknown", events.CompensationFailed, 5, events.Compensable, 1, events.CompensationFailedData{
			Outcome: events.Unknown, ErrorClass: "timeout"}},
		{"reconciliation found", events.ReconciliationResolved, 4, events.Irreversible, 0, events.ReconciliationResolvedData{
			Found: true, Result: json.RawMessage(`{"id":"ch_1","amount":1299}`), DownstreamID: "ch_1", Source: "reconcile"}},
		{"reconciliation found by webhook", events.ReconciliationResolved, 4, events.Irreversible, 1, events.ReconciliationResolvedData{
			Found: true, Source: "webhook:payments"}},
		{"reconciliation absent with retry", events.ReconciliationResolved, 4, events.Idempotent, 0, events.ReconciliationResolvedData{
			Source: "reconcile", RetryAt: timePtr(later)}},
		{"reconciliation absent", events.ReconciliationResolved, 4, events.Irreversible, 0, events.ReconciliationResolvedData{Source: "reconcile"}},
		{"escalated minimal", events.OperationEscalated, 5, events.Irreversible, 0, events.EscalationData{
			Reason: "provably_absent", ProposedAction: events.ActionRetry}},
		{"escalated with evidence", events.OperationEscalated, 5, events.Irreversible, 1, events.EscalationData{
			Reason: "reconcile_unavailable", Request: json.RawMessage(`{"amount":1299,"card":"[redacted]"}`),
			Downstream: json.RawMessage(`{"status":503}`), ProposedAction: events.ActionRecordSuccess, Detail: "reconcile returned 503 three times"}},
		{"escalated compensate", events.OperationEscalated, 6, events.Compensable, 0, events.EscalationData{
			Reason: "compensation_failed", Request: json.RawMessage(`{"sku":"A-1"}`), ProposedAction: events.ActionCompensate}},
		{"escalated abandon", events.OperationEscalated, 6, events.Irreversible, 0, events.EscalationData{
			Reason: "deadline_passed", Request: json.RawMessage(`{}`), ProposedAction: events.ActionAbandon}},
		{"decision record_success", events.DecisionRecorded, 6, events.Irreversible, 0, events.DecisionData{
			Action: events.ActionRecordSuccess, Note: "charge visible in the PSP dashboard", Approver: "alice"}},
		{"decision retry", events.DecisionRecorded, 6, events.Irreversible, 0, events.DecisionData{
			Action: events.ActionRetry, Approver: "alice", RetryAt: timePtr(later)}},
		{"decision compensate", events.DecisionRecorded, 7, events.Compensable, 0, events.DecisionData{
			Action: events.ActionCompensate, Approver: "bob"}},
		{"decision abandon", events.DecisionRecorded, 6, events.Irreversible, 0, events.DecisionData{
			Action: events.ActionAbandon, Note: "customer cancelled", Approver: "dev"}},
	}
	out := make([]example, 0, len(specs))
	for i, s := range specs {
		// Distinct, nanosecond-precise times check that occurred_at survives
		// encoding exactly.
		when := t0.Add(time.Duration(i)*time.Second + time.Duration(i)*time.Nanosecond)
		out = append(out, example{s.name, mustNew(tb, s.typ, testKey, s.seq, s.class, s.attempt, s.data, when)})
	}
	return out
}
