package events

import (
	"encoding/json"
	"testing"
	"time"
)

// The record always carries result, null until known; reading it back must
// give the record the fold holds, with no result, not the bytes "null".
func TestUnmarshalOperationReadsBackWhatMarshalWrote(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, op := range []Operation{
		{Key: "k", Tool: "t", EffectClass: Idempotent, Status: StatusPending, Phase: PhaseAttempt, Seq: 1, CreatedAt: at, UpdatedAt: at},
		{Key: "k", Tool: "t", EffectClass: Idempotent, Status: StatusCompleted, Phase: PhaseAttempt, Seq: 3,
			Result: json.RawMessage(`{"id":"ch_1"}`), DownstreamID: "ch_1", CreatedAt: at, UpdatedAt: at},
	} {
		b, err := MarshalOperation(op)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"lease_until", "result", "downstream_id", "undo_ref", "last_error_class"} {
			if _, ok := m[f]; !ok {
				t.Errorf("record lacks %s: %s", f, b)
			}
		}
		got, err := UnmarshalOperation(b)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Result) != string(op.Result) || (op.Result == nil) != (got.Result == nil) {
			t.Errorf("result %q read back as %q", op.Result, got.Result)
		}
	}
}
