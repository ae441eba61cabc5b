package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// BenchmarkAppendBatch measures one operation's three appends (intent,
// claim, outcome), each step in batches of 1, 8 or 32 steps per commit (the
// group committer's batches at a trickle, at a few hundred per second and
// flat out), on one
// connection of an otherwise idle database: the event store's cost per
// operation without the contention of the full pipeline (which inflates
// every statement's time in `effectline bench`). ns/op is per operation,
// three appends.
//
//	go test -run '^$' -bench AppendBatch -benchtime 20000x ./store
func BenchmarkAppendBatch(b *testing.B) {
	for _, batch := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchmarkAppendBatch(b, batch) })
	}
}

func benchmarkAppendBatch(b *testing.B, batch int) {
	pool := testenv.NewPool(b, storedb.New(b))
	ctx := context.Background()
	s := store.New(pool)
	result := json.RawMessage(`{"charge_id":"ch_3PqR8s2eZvKYlo2C1a2b3c4d","status":"succeeded","amount":4200}`)
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		n := min(batch, b.N-i)
		ops := make([]events.Operation, n)
		as := make([]store.Append, n)
		for j := range n {
			key := fmt.Sprintf("bench/%08d", i+j)
			e, err := events.New(events.IntentRecorded, key, 1, "payments.charge", events.Irreversible, 0,
				events.IntentData{Args: json.RawMessage(`{"amount":4200,"currency":"EUR","customer":"cus_123"}`), Principal: "billing-agent"}, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			as[j] = store.Append{Events: []events.Envelope{e}}
		}
		step := func() {
			for j, r := range s.AppendBatch(ctx, as) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
				ops[j] = r.Op
			}
		}
		step()
		for j, op := range ops {
			e, err := events.New(events.AttemptStarted, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt+1,
				events.AttemptStartedData{DownstreamKey: op.Key, Worker: "w1", LeaseUntil: time.Now().Add(30 * time.Second)}, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			as[j] = store.Append{Base: op, Events: []events.Envelope{e}}
		}
		step()
		for j, op := range ops {
			e, err := events.New(events.AttemptSucceeded, op.Key, op.Seq+1, op.Tool, op.EffectClass, op.Attempt,
				events.AttemptSucceededData{StatusCode: 200, Result: result, DownstreamID: "ch_3PqR8s2eZvKYlo2C1a2b3c4d"}, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			as[j] = store.Append{Base: op, Events: []events.Envelope{e}}
		}
		step()
	}
}
