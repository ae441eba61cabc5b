package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// TestPlainRowFormatWritesWhatOlderBinariesRead: a process started with
// EFFECTLINE_ROW_FORMAT=plain (a rolling upgrade from a binary older than
// compact rows) runs operations whose intents another process wrote
// compact, and every row it writes is in the old shape: envelopes as JSON,
// the whole fold in the head's record, the read model's record as jsonb,
// and no packed body.
func TestPlainRowFormatWritesWhatOlderBinariesRead(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := untilCtx(t, 90*time.Second)
	st := store.New(testenv.NewPool(t, w.db))
	start(t, "effectline (plain rows)", w.with(map[string]string{app.EnvRowFormat: "plain"}),
		"run", "--components", gsComponents)

	keys := gsSubmit(t, ctx, w.db, "plain", 0, 6)
	waitFor(t, ctx, "every operation settled", func() bool {
		ops := gsLoad(t, ctx, st, keys)
		return gsCount(ops, events.StatusCompleted) == len(keys)
	})

	waitFor(t, ctx, "every operation projected as settled", func() bool {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM operation_state WHERE operation_key = ANY($1) AND status = 'completed'`, keys).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(keys)
	})
	for _, key := range keys {
		var record, body, stateBody []byte
		var stateRecord *string
		if err := st.Pool().QueryRow(ctx, `SELECT o.record, o.body, s.record::text, s.body
			FROM operations o JOIN operation_state s USING (operation_key) WHERE operation_key = $1`, key).
			Scan(&record, &body, &stateRecord, &stateBody); err != nil {
			t.Fatal(err)
		}
		if body != nil || stateBody != nil || stateRecord == nil {
			t.Errorf("%s: the plain process packed a record (head body %d bytes, read model body %d bytes, read model record %v)",
				key, len(body), len(stateBody), stateRecord)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(record, &members); err != nil {
			t.Fatal(err)
		}
		for _, name := range events.OmittedFromBody {
			if _, ok := members[name]; !ok {
				t.Errorf("%s: the head's record, written by the plain process, lacks %q", key, name)
			}
		}
		rows, err := st.Pool().Query(ctx, `SELECT seq, envelope FROM events WHERE operation_key = $1 AND seq > 1`, key)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var seq int64
			var stored []byte
			if err := rows.Scan(&seq, &stored); err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(stored, []byte(`{"event_id":`)) {
				t.Errorf("%s seq %d: written packed by the plain process", key, seq)
			}
			n++
		}
		rows.Close()
		if n == 0 {
			t.Errorf("%s: the process journaled nothing after the intent", key)
		}
	}
}
