package store_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

// TestHeadRecordIsPackedWithoutItsColumns: a compact head row keeps its
// record packed in body (record NULL), without the members its columns
// hold (events.OmittedFromBody), with principal and downstream_id in
// columns for SQL; the head loads as the append returned it, and so do
// rows written before: the cut-down record in record (before body), and
// the whole fold in record (before that).
func TestHeadRecordIsPackedWithoutItsColumns(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	op := settle(t, s, "head/1", "ch_head1")

	var (
		body, record            []byte
		principal, downstreamID *string
	)
	if err := s.Pool().QueryRow(ctx, `SELECT body, record, principal, downstream_id FROM operations WHERE operation_key = $1`, op.Key).
		Scan(&body, &record, &principal, &downstreamID); err != nil {
		t.Fatal(err)
	}
	if record != nil {
		t.Errorf("a compact row holds a jsonb record too: %s", record)
	}
	if principal == nil || *principal != op.Principal || downstreamID == nil || *downstreamID != "ch_head1" {
		t.Errorf("principal, downstream_id = %v, %v; want %q, ch_head1", principal, downstreamID, op.Principal)
	}
	unpacked, err := packed.Unpack(body, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := packed.Unpack(body, ""); err == nil {
		t.Error("the packed record unpacks without its key: the key was not left out of it")
	}
	if len(body) == 0 || body[0] == '{' || len(body) >= len(unpacked) {
		t.Errorf("body is %d bytes for a %d-byte record: not packed", len(body), len(unpacked))
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(unpacked, &members); err != nil {
		t.Fatal(err)
	}
	for _, name := range events.OmittedFromBody {
		if _, ok := members[name]; ok {
			t.Errorf("the head record repeats its column %q: %s", name, unpacked)
		}
	}
	assertLoads := func(what string) {
		t.Helper()
		got, err := s.Load(ctx, op.Key)
		if err != nil {
			t.Fatal(err)
		}
		// jsonb keeps the args' and the result's meaning, not their
		// spacing.
		got.Args, got.Result = compact(t, got.Args), compact(t, got.Result)
		if !reflect.DeepEqual(got, op) {
			t.Errorf("%s: Load =\n%+v\nwant\n%+v", what, got, op)
		}
		many, err := s.LoadMany(ctx, []string{op.Key})
		m := many[op.Key]
		m.Args, m.Result = compact(t, m.Args), compact(t, m.Result)
		if err != nil || !reflect.DeepEqual(m, op) {
			t.Errorf("%s: LoadMany = %+v, %v", what, many[op.Key], err)
		}
	}
	assertLoads("the record as written")

	if _, err := s.Pool().Exec(ctx, `UPDATE operations SET record = $2, body = NULL, principal = NULL, downstream_id = NULL
		WHERE operation_key = $1`, op.Key, unpacked); err != nil {
		t.Fatal(err)
	}
	assertLoads("a cut-down record in record, written before body")

	full, err := events.MarshalOperation(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE operations SET record = $2 WHERE operation_key = $1`, op.Key, full); err != nil {
		t.Fatal(err)
	}
	assertLoads("a whole-fold record written before")
}

// TestCallbacksFindHeadRowsByDownstreamIDInEitherPlace: the lookup by the
// downstream's id finds a compact row by its column and a plain (or older)
// row by its record, and neither once pruned to a tombstone.
func TestCallbacksFindHeadRowsByDownstreamIDInEitherPlace(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	compactOp := settle(t, s, "byid/compact", "ch_same")
	plainOp := settle(t, s, "byid/plain", "ch_same")
	full, err := events.MarshalOperation(plainOp)
	if err != nil {
		t.Fatal(err)
	}
	// As an older binary (or EFFECTLINE_ROW_FORMAT=plain) leaves the row.
	if _, err := s.Pool().Exec(ctx, `UPDATE operations SET record = $2, body = NULL, principal = NULL, downstream_id = NULL
		WHERE operation_key = $1`, plainOp.Key, full); err != nil {
		t.Fatal(err)
	}
	lock := func() []string {
		t.Helper()
		var keys []string
		err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			var err error
			keys, err = store.LockByDownstreamIDTx(ctx, tx, "payments.charge", "ch_same")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if got := lock(); !slices.Equal(got, []string{compactOp.Key, plainOp.Key}) {
		t.Fatalf("locked %v by the downstream's id; want both rows", got)
	}
	outboxDrain(t, s, 100) // a row whose events are not relayed yet is not pruned
	if n, err := s.PruneSettled(ctx, "payments.charge", t0.Add(time.Hour), t0.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if got := lock(); len(got) != 0 {
		t.Fatalf("a callback finds tombstones %v", got)
	}
	for _, key := range []string{compactOp.Key, plainOp.Key} {
		_, err := s.Load(ctx, key)
		ts, ok := store.AsPruned(err)
		if !ok || ts.Principal != "billing-agent" || ts.DownstreamID != "ch_same" {
			t.Errorf("%s: tombstone %+v, %v; want its principal and downstream id", key, ts, err)
		}
	}
}

// settle creates key, starts its attempt and journals its success with the
// downstream id id, each in an append of its own.
func settle(t *testing.T, s *store.Store, key, id string) events.Operation {
	t.Helper()
	ctx := t.Context()
	op := create(t, s, key)
	op, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}})
	if err != nil {
		t.Fatal(err)
	}
	if op, err = s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{succeeded(t, op, id)}}); err != nil {
		t.Fatal(err)
	}
	return op
}

func succeeded(t *testing.T, op events.Operation, downstreamID string) events.Envelope {
	t.Helper()
	e, err := events.New(events.AttemptSucceeded, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
		events.AttemptSucceededData{StatusCode: 200, DownstreamID: downstreamID, Result: json.RawMessage(`{"ok":true}`)}, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return e
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
	var body []byte
	var principal, downstreamID *string
	if err := s.Pool().QueryRow(ctx, `SELECT body, principal, downstream_id FROM operations WHERE operation_key = $1`, op.Key).
		Scan(&body, &principal, &downstreamID); err != nil {
		t.Fatal(err)
	}
	if body != nil || principal != nil || downstreamID != nil {
		t.Errorf("a plain row sets columns older binaries do not know: body %q, principal %v, downstream_id %v", body, principal, downstreamID)
	}
	var types []*string
	if err := s.Pool().QueryRow(ctx, `SELECT array_agg(type ORDER BY seq) FROM events WHERE operation_key = $1`, op.Key).Scan(&types); err != nil {
		t.Fatal(err)
	}
	if len(types) != 2 || types[0] == nil || *types[0] != string(events.IntentRecorded) || types[1] == nil || *types[1] != string(events.AttemptStarted) {
		t.Errorf("a plain row's type column is %v, not its event's type, which older binaries required", types)
	}
}

// TestFirstEventTimesReadEitherRowFormat: compact rows leave events.type
// empty (it is in the envelope), plain rows keep it, and
// FirstEventTimes, the one reader of the type, reads both. Not parallel:
// the format is process-wide.
func TestFirstEventTimesReadEitherRowFormat(t *testing.T) {
	s := setup(t)
	ctx := t.Context()
	journal := func(key string) {
		op := create(t, s, key)
		if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}}); err != nil {
			t.Fatal(err)
		}
	}
	journal("types/compact")
	store.SetRowFormat(store.Plain)
	journal("types/plain")
	store.SetRowFormat(store.Compact)

	var nulls, set int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = '' AND operation_key = 'types/compact'),
	       count(*) FILTER (WHERE type <> '' AND operation_key = 'types/plain') FROM events`).Scan(&nulls, &set); err != nil {
		t.Fatal(err)
	}
	if nulls != 2 || set != 2 {
		t.Errorf("%d compact rows without a type and %d plain rows with one, want 2 and 2", nulls, set)
	}
	first, err := s.FirstEventTimes(ctx, []string{"types/compact", "types/plain"}, events.IntentRecorded, events.AttemptStarted, events.AttemptSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"types/compact", "types/plain"} {
		if at := first[events.IntentRecorded][key]; !at.Equal(t0) {
			t.Errorf("%s: intent recorded at %v, want %v", key, at, t0)
		}
		if at := first[events.AttemptStarted][key]; !at.Equal(t0.Add(time.Second)) {
			t.Errorf("%s: attempt started at %v, want %v", key, at, t0.Add(time.Second))
		}
	}
	if len(first[events.AttemptSucceeded]) != 0 {
		t.Errorf("an attempt succeeded that never ran: %v", first[events.AttemptSucceeded])
	}
}

// TestOnlyTheIntentKeepsItsEventIDInAColumn: events.event_id is read only
// for seq 1 (the executor's claim checks the journaled intent is the one it
// decided from); later events keep their ids in their envelopes alone.
func TestOnlyTheIntentKeepsItsEventIDInAColumn(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	op := create(t, s, "ids/1")
	e := started(t, op, "w1")
	if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{e}}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, op.Key, 0)
	if err != nil || len(evs) != 2 || evs[1].EventID != e.EventID {
		t.Fatalf("Events = %+v, %v; want the intent and the start with its id", evs, err)
	}
	var ids []string
	if err := s.Pool().QueryRow(ctx, `SELECT array_agg(event_id ORDER BY seq) FROM events WHERE operation_key = $1`, op.Key).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{evs[0].EventID, ""}) {
		t.Fatalf("event_id column = %q; want the intent's id, then empty", ids)
	}
}

// TestMigrationKeepsADownstreamIndexBuiltBeforehand: on a large table an
// operator builds operations_downstream concurrently before upgrading
// (deploy/OPERATIONS.md); migration 0013 then applies and keeps it, until
// 0017 replaces it by operations_by_downstream_id.
func TestMigrationKeepsADownstreamIndexBuiltBeforehand(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	ctx := t.Context()
	migrateOnly(t, pool, func(v int) bool { return v < 13 })
	for _, sql := range []string{
		`ALTER TABLE operations ADD COLUMN IF NOT EXISTS downstream_id text`,
		`CREATE INDEX CONCURRENTLY operations_downstream ON operations (tool, downstream_id) WHERE downstream_id IS NOT NULL`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(applied, 13) {
		t.Fatalf("Migrate applied %v; want 13 among them", applied)
	}
	var indexes []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(indexname ORDER BY indexname) FROM pg_indexes
	    WHERE indexname LIKE 'operations%downstream%'`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if want := []string{"operations_by_downstream_id", "operations_downstream_id"}; !slices.Equal(indexes, want) {
		t.Fatalf("downstream indexes after every migration: %v, want %v", indexes, want)
	}
}

// TestMigrationKeepsTheLeanIndexesBuiltBeforehand: on a large read model,
// journal and head table an operator builds the indexes of migrations 0015
// to 0017 concurrently before upgrading (deploy/OPERATIONS.md); the
// migrations then keep them and drop what they replace.
func TestMigrationKeepsTheLeanIndexesBuiltBeforehand(t *testing.T) {
	t.Parallel()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	ctx := t.Context()
	migrateOnly(t, pool, func(v int) bool { return v < 15 })
	s := store.New(pool)
	op := create(t, s, "before/0015")
	if _, err := s.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started(t, op, "w1")}}); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE INDEX CONCURRENTLY operation_state_created_at ON operation_state (created_at)`,
		`CREATE INDEX CONCURRENTLY operation_state_tool_created_at ON operation_state (tool, created_at)`,
		`CREATE INDEX CONCURRENTLY events_operation_key ON events (operation_key)`,
		`CREATE INDEX CONCURRENTLY operations_by_downstream_id ON operations (downstream_id) WHERE downstream_id IS NOT NULL`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(applied, 15) || !slices.Contains(applied, 16) || !slices.Contains(applied, 17) {
		t.Fatalf("Migrate applied %v; want 15, 16 and 17 among them", applied)
	}
	var indexes []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(indexname ORDER BY indexname) FROM pg_indexes
	    WHERE tablename IN ('events', 'operation_state', 'operations')`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	want := []string{"events_operation_key", "operation_state_created_at", "operation_state_pkey",
		"operation_state_tool_created_at", "operation_state_unsettled",
		"operations_by_downstream_id", "operations_downstream_id", "operations_due", "operations_lease",
		"operations_pkey", "operations_settled", "operations_tombstones", "operations_unresolved"}
	if !slices.Equal(indexes, want) {
		t.Errorf("indexes after 0017: %v, want %v", indexes, want)
	}
	var identity string
	if err := pool.QueryRow(ctx, `SELECT relreplident FROM pg_class WHERE relname = 'events'`).Scan(&identity); err != nil || identity != "f" {
		t.Errorf("the journal's replica identity is %q (%v), want f (full): without a key, a publication of it could not carry the pruner's deletes", identity, err)
	}
	evs, err := s.Events(ctx, op.Key, 0)
	if err != nil || len(evs) != 2 || evs[0].Type != events.IntentRecorded || evs[1].Type != events.AttemptStarted {
		t.Fatalf("Events after 0016 = %+v, %v", evs, err)
	}
}
