package store_test

import (
	"bytes"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

// TestTheJournalStoresEnvelopesPacked: the events table holds each envelope
// packed, and every reader (Events and Replay, the journal's pages, the
// relay) returns the exact bytes events.Encode wrote, which are what Kafka
// gets. A row written before packing (plain JSON) reads the same.
func TestTheJournalStoresEnvelopesPacked(t *testing.T) {
	t.Parallel()
	s := outboxSetup(t)
	ctx := t.Context()
	op := outboxCreate(t, s, "packed/1")
	op = outboxStarted(t, s, op)

	// The intent of a second operation, then its envelope rewritten as
	// rows were written before packing.
	old := outboxCreate(t, s, "packed/old")
	oldEnv, err := s.Events(ctx, old.Key, 0)
	if err != nil || len(oldEnv) != 1 {
		t.Fatalf("events of %s: %v, %v", old.Key, oldEnv, err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE events SET envelope = $2 WHERE operation_key = $1`, old.Key, oldEnv[0].Raw); err != nil {
		t.Fatal(err)
	}

	want := map[string][][]byte{}
	for _, key := range []string{op.Key, old.Key} {
		evs, err := s.Events(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			enc, err := events.Encode(e.Envelope)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.Raw, enc) {
				t.Fatalf("%s seq %d: Events returned\n%s\nnot what was written\n%s", key, e.Seq, e.Raw, enc)
			}
			want[key] = append(want[key], enc)
		}
	}

	rows, err := s.Pool().Query(ctx, `SELECT operation_key, seq, envelope FROM events ORDER BY operation_key, seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		var seq int64
		var stored []byte
		if err := rows.Scan(&key, &seq, &stored); err != nil {
			t.Fatal(err)
		}
		raw := want[key][seq-1]
		switch {
		case key == old.Key && !bytes.Equal(stored, raw):
			t.Errorf("%s seq %d: the plain row changed", key, seq)
		case key == op.Key && (stored[0] == '{' || len(stored) >= len(raw)):
			t.Errorf("%s seq %d: stored as %d bytes for a %d-byte envelope, not packed", key, seq, len(stored), len(raw))
		}
		if got, err := packed.Unpack(stored, key); err != nil || !bytes.Equal(got, raw) {
			t.Errorf("%s seq %d: the row unpacks to %q, %v", key, seq, got, err)
		}
		if _, err := packed.Unpack(stored, ""); key == op.Key && err == nil {
			t.Errorf("%s seq %d: unpacks without its key: the key was not left out", key, seq)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Replay(ctx, op.Key); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	n := 0
	for e, err := range store.JournalTx(ctx, tx, 2) {
		if err != nil {
			t.Fatal(err)
		}
		if enc, _ := events.Encode(e); !bytes.Equal(enc, want[e.OperationKey][e.Seq-1]) {
			t.Errorf("the journal's pages returned %s seq %d changed", e.OperationKey, e.Seq)
		}
		n++
	}
	if n != 3 {
		t.Errorf("the journal's pages returned %d events, want 3", n)
	}

	relayed := 0
	for {
		p, _, err := s.RelayBatch(ctx, 2, func(evs []store.OutboxEvent) error {
			for _, e := range evs {
				if !bytes.Equal(e.Raw, want[e.Envelope.OperationKey][e.Envelope.Seq-1]) {
					t.Errorf("the relay would publish %s seq %d as\n%s", e.Envelope.OperationKey, e.Envelope.Seq, e.Raw)
				}
				relayed++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if p == 0 {
			break
		}
	}
	// Intents go to two topics, the attempt to one.
	if relayed != 5 {
		t.Errorf("relayed %d outbox rows, want 5", relayed)
	}
}
