package projector_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store/packed"
)

// stateColumnFields are the fold's fields operation_state keeps in columns
// of their own, by JSON name.
var stateColumnFields = []string{"operation_key", "tool", "effect_class", "payload_hash", "principal", "status", "phase",
	"attempt", "lease_until", "result", "downstream_id", "undo_ref", "last_error_class", "compensations", "evidence",
	"escalation", "seq", "created_at", "updated_at"}

// TestStateRecordCoversTheFold fails when events.Operation gains a field
// that operation_state keeps nowhere: a projector that loads the row
// (a cache miss) would fold the next events onto an operation without it.
// It also fails when the record repeats a column.
func TestStateRecordCoversTheFold(t *testing.T) {
	t.Parallel()
	inRecord := projector.StateRecordFields()
	for _, name := range projector.JSONNames(reflect.TypeFor[events.Operation]()) {
		if name == "args" { // never in the read model
			continue
		}
		col, rec := slices.Contains(stateColumnFields, name), slices.Contains(inRecord, name)
		switch {
		case !col && !rec:
			t.Errorf("events.Operation's %q is neither a column of operation_state nor in its record", name)
		case col && rec:
			t.Errorf("events.Operation's %q is a column of operation_state and in its record too", name)
		}
	}
}

// richFold is an operation with every field of the read model set.
func richFold() events.Operation {
	at := time.Date(2026, 12, 4, 20, 29, 41, 258750370, time.UTC)
	ptr := func(d time.Duration) *time.Time { t := at.Add(d); return &t }
	return events.Operation{
		Key: "rich-1", Tool: "payments.charge", EffectClass: events.Compensable, PayloadHash: "f50d36c1",
		Principal: "agent-7", Status: events.StatusInProgress, Phase: events.PhaseCompensation, Attempt: 3,
		LeaseOwner: "worker-2", LeaseUntil: ptr(30 * time.Second), DueAt: ptr(time.Minute),
		Result: json.RawMessage(`{"id":"ch_9","amount":100}`), DownstreamID: "ch_9", UndoRef: "re_1",
		DownstreamKey: "rich-1/c1", Compensations: 1, Approved: true, Approvals: []string{"alice", "bob"},
		LastErrorClass: "http_503", LastFailure: &events.Failure{Kind: events.Retryable, StatusCode: 503, Response: json.RawMessage(`{"e":"busy"}`)},
		Evidence: 2, Escalation: &events.EscalationData{Reason: "r", Request: json.RawMessage(`{"a":1}`), ProposedAction: events.ActionRetry, Approvers: 2},
		Seq: 9, FirstAttemptAt: ptr(time.Second), LastAttemptAt: ptr(2 * time.Second), LastOutcomeAt: ptr(3 * time.Second),
		CreatedAt: at, UpdatedAt: at.Add(4 * time.Second),
	}
}

// TestStoredFoldLoadsAsItWasWritten writes a fold with every field set and
// reads it back as a projector does on a cache miss: the same operation.
// The record holds only what no column does, packed in body. A row written
// before body (the record in record) and one written before the record was
// cut down (the whole fold in it) load the same.
func TestStoredFoldLoadsAsItWasWritten(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	ctx := t.Context()
	op := richFold()
	if _, err := projector.WriteOperations(ctx, h.pool, op); err != nil {
		t.Fatal(err)
	}
	load := func() events.Operation {
		t.Helper()
		got, err := projector.LoadFolds(ctx, h.pool, []string{op.Key})
		if err != nil {
			t.Fatal(err)
		}
		return got[op.Key]
	}
	assertSameFold(t, load(), op)

	var record, body []byte
	if err := h.pool.QueryRow(ctx, `SELECT record, body FROM operation_state WHERE operation_key = $1`, op.Key).Scan(&record, &body); err != nil {
		t.Fatal(err)
	}
	unpacked, err := packed.Unpack(body, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	if record != nil || len(body) == 0 || body[0] == '{' || len(body) >= len(unpacked) {
		t.Errorf("a compact row holds record %q and a %d-byte body for a %d-byte record: not packed", record, len(body), len(unpacked))
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(unpacked, &members); err != nil {
		t.Fatal(err)
	}
	for k := range members {
		if slices.Contains(stateColumnFields, k) {
			t.Errorf("the stored record repeats the column %q: %s", k, unpacked)
		}
	}

	// A row written before body: the record as jsonb.
	if _, err := h.pool.Exec(ctx, `UPDATE operation_state SET record = $1::jsonb, body = NULL WHERE operation_key = $2`, string(unpacked), op.Key); err != nil {
		t.Fatal(err)
	}
	assertSameFold(t, load(), op)

	whole, err := events.MarshalOperation(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE operation_state SET record = $1::jsonb, body = NULL WHERE operation_key = $2`, string(whole), op.Key); err != nil {
		t.Fatal(err)
	}
	assertSameFold(t, load(), op)

	// A fold without a result: the whole record's "result": null is no result.
	op.Result, op.Key = nil, "rich-2"
	if whole, err = events.MarshalOperation(op); err != nil {
		t.Fatal(err)
	}
	if _, err := projector.WriteOperations(ctx, h.pool, op); err != nil {
		t.Fatal(err)
	}
	assertSameFold(t, load(), op)
	if _, err := h.pool.Exec(ctx, `UPDATE operation_state SET record = $1::jsonb, body = NULL WHERE operation_key = $2`, string(whole), op.Key); err != nil {
		t.Fatal(err)
	}
	if got := load(); got.Result != nil {
		t.Errorf("a whole record's null result loaded as %q", got.Result)
	}
}
