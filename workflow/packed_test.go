package workflow

import (
	"bytes"
	"testing"

	"github.com/effectline/effectline/store/packed"
)

// TestTheWorkflowJournalStoresEnvelopesPacked: workflow_events holds each
// envelope packed, and the journal's reader returns the bytes that were
// packed (the run's events decode from them).
func TestTheWorkflowJournalStoresEnvelopesPacked(t *testing.T) {
	t.Parallel()
	w := newDriverWorld(t, DriverConfig{})
	w.started("packed-1")
	if _, err := w.drv.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	evs, err := NewJournal(w.st.Pool()).WorkflowEvents(t.Context(), "packed-1", 0)
	if err != nil || len(evs) < 2 {
		t.Fatalf("WorkflowEvents = %d events, %v; want the start and a step", len(evs), err)
	}
	rows, err := w.st.Pool().Query(t.Context(), `SELECT seq, envelope FROM workflow_events WHERE workflow_id = 'packed-1' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var seq int64
		var stored []byte
		if err := rows.Scan(&seq, &stored); err != nil {
			t.Fatal(err)
		}
		raw, err := packed.Unpack(stored, "")
		if err != nil {
			t.Fatal(err)
		}
		if stored[0] == '{' || len(stored) >= len(raw) {
			t.Errorf("seq %d is stored as %d bytes for a %d-byte envelope: not packed", seq, len(stored), len(raw))
		}
		if !bytes.Contains(raw, []byte(`"event_id":"`+evs[n].EventID+`"`)) {
			t.Errorf("seq %d unpacks to %s, not the event the journal returned", seq, raw)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(evs) {
		t.Fatalf("read %d rows (%v), the journal returned %d events", n, err, len(evs))
	}
}
