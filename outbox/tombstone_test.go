package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// TestAppendOfAPrunedOperation: once the operation is pruned to its
// tombstone, the same intent is a no-op reporting it (Created false,
// Pruned true, the tombstone's fields), other args a payload conflict, and
// neither writes anything.
func TestAppendOfAPrunedOperation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	in := testIntent("wf:o-9/reserve")
	fresh := 0
	appendOne := func(in outbox.Intent) (outbox.Appended, error) {
		var out []outbox.Appended
		fresh++
		err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			var err error
			// Together with a fresh key: a batch mixing both answers.
			out, err = outbox.AppendMany(ctx, tx, []outbox.Intent{in, testIntent(fmt.Sprintf("wf:fresh-%d/reserve", fresh))})
			return err
		})
		if err != nil {
			return outbox.Appended{}, err
		}
		if !out[1].Created {
			t.Fatalf("a fresh key beside the pruned one: %+v", out[1])
		}
		return out[0], nil
	}
	first, err := appendOne(in)
	if err != nil {
		t.Fatal(err)
	}
	op := first.Operation
	for _, e := range []struct {
		typ  events.Type
		data any
	}{
		{events.AttemptStarted, events.AttemptStartedData{DownstreamKey: op.Key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)}},
		{events.AttemptSucceeded, events.AttemptSucceededData{StatusCode: 200, DownstreamID: "res_1"}},
	} {
		ev, err := events.New(e.typ, op.Key, op.Seq+1, op.Tool, op.EffectClass, 1, e.data, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if op, err = h.store.Append(ctx, store.Append{Base: op, Events: []events.Envelope{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pool.Exec(ctx, `DELETE FROM outbox WHERE operation_key = $1`, op.Key); err != nil {
		t.Fatal(err)
	}
	if n, err := h.store.PruneSettled(ctx, op.Tool, time.Now().Add(time.Hour), time.Now(), 10); err != nil || n != 1 {
		t.Fatalf("pruned %d (err %v), want 1", n, err)
	}

	again, err := appendOne(in)
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || !again.Pruned || again.Operation.Status != events.StatusCompleted ||
		again.Operation.DownstreamID != "res_1" || again.Operation.PayloadHash != op.PayloadHash {
		t.Fatalf("Append of a pruned operation = %+v", again)
	}
	other := in
	other.Args = json.RawMessage(`{"sku":"A-1","qty":3}`)
	if _, err := appendOne(other); !outbox.IsPayloadConflict(err) {
		t.Fatalf("other args under a pruned key: %v, want a payload conflict", err)
	}
	var evs int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE operation_key = $1`, in.OperationKey).Scan(&evs); err != nil || evs != 0 {
		t.Fatalf("%d events journaled for the pruned key (err %v)", evs, err)
	}
}
