package store_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// TestHeadRecordLeavesOutItsColumns: operations.record holds none of the
// members its columns hold (events.OmittedFromBody), the head loads as the
// append returned it, and a row written before (the whole fold in record)
// loads the same.
func TestHeadRecordLeavesOutItsColumns(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	op := create(t, s, "head/1")
	op, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}})
	if err != nil {
		t.Fatal(err)
	}

	var record []byte
	if err := s.Pool().QueryRow(ctx, `SELECT record FROM operations WHERE operation_key = $1`, op.Key).Scan(&record); err != nil {
		t.Fatal(err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(record, &members); err != nil {
		t.Fatal(err)
	}
	for _, name := range events.OmittedFromBody {
		if _, ok := members[name]; ok {
			t.Errorf("the head record repeats its column %q: %s", name, record)
		}
	}
	assertLoads := func(what string) {
		t.Helper()
		got, err := s.Load(ctx, op.Key)
		if err != nil {
			t.Fatal(err)
		}
		// jsonb keeps the args' meaning, not their spacing.
		got.Args = compact(t, got.Args)
		if !reflect.DeepEqual(got, op) {
			t.Errorf("%s: Load =\n%+v\nwant\n%+v", what, got, op)
		}
		many, err := s.LoadMany(ctx, []string{op.Key})
		m := many[op.Key]
		m.Args = compact(t, m.Args)
		if err != nil || !reflect.DeepEqual(m, op) {
			t.Errorf("%s: LoadMany = %+v, %v", what, many[op.Key], err)
		}
	}
	assertLoads("the record as written")

	full, err := events.MarshalOperation(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE operations SET record = $2 WHERE operation_key = $1`, op.Key, full); err != nil {
		t.Fatal(err)
	}
	assertLoads("a whole-fold record written before")
}

func compact(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestPlainRowsAreWhatOlderBinariesWrote: with store.Plain, a process
// writes the envelope as its JSON and the whole fold in the head's record,
// which binaries from before the compact rows read; the compact reader
// reads them too. Not parallel: the format is process-wide, and parallel
// tests run only after the sequential ones.
func TestPlainRowsAreWhatOlderBinariesWrote(t *testing.T) {
	store.SetRowFormat(store.Plain)
	defer store.SetRowFormat(store.Compact)
	s := setup(t)
	ctx := t.Context()
	op := create(t, s, "plain/1")
	op, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, op.Key, 0)
	if err != nil || len(evs) != 2 {
		t.Fatalf("Events = %d, %v", len(evs), err)
	}
	rows, err := s.Pool().Query(ctx, `SELECT seq, envelope FROM events WHERE operation_key = $1 ORDER BY seq`, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		var stored []byte
		if err := rows.Scan(&seq, &stored); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stored, evs[seq-1].Raw) {
			t.Errorf("seq %d is stored as %q, not as its JSON", seq, stored)
		}
	}
	rows.Close()

	var record []byte
	if err := s.Pool().QueryRow(ctx, `SELECT record FROM operations WHERE operation_key = $1`, op.Key).Scan(&record); err != nil {
		t.Fatal(err)
	}
	whole, err := events.UnmarshalOperation(record)
	if err != nil {
		t.Fatal(err)
	}
	whole.Args = compact(t, whole.Args)
	if !reflect.DeepEqual(whole, op) {
		t.Errorf("the head's record alone, as an older binary reads it, is\n%+v\nnot\n%+v", whole, op)
	}
}
