package outbox_test

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
)

// BenchmarkAppendNotify measures what outbox.Notify costs the writers: 8
// concurrent agent-service transactions, each committing one Append, with
// and without a NOTIFY, while a connection LISTENs as a relay would. A
// notifying transaction holds a database-wide lock from its pre-commit
// through its commit record's flush, so notifying commits are serialized;
// the difference is documented on Relay.
//
// Run: go test ./outbox/ -run '^$' -bench AppendNotify -benchtime 3000x
func BenchmarkAppendNotify(b *testing.B) {
	h := setup(b)
	u, err := url.Parse(h.url)
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", "16")
	u.RawQuery = q.Encode()
	pool := testenv.NewPool(b, u.String())
	ctx := context.Background()

	// A listener that drains notifications, like a relay with Listen.
	lconn, err := pgx.Connect(ctx, h.url)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := lconn.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
		b.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		for {
			if _, err := lconn.WaitForNotification(lctx); err != nil {
				return
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-listenDone; _ = lconn.Close(context.Background()) })

	var seq atomic.Int64
	for _, notify := range []bool{false, true} {
		b.Run(fmt.Sprintf("notify=%t", notify), func(b *testing.B) {
			b.SetParallelism(4) // 4 × GOMAXPROCS writers
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := fmt.Sprintf("wf:notify-bench/%d", seq.Add(1))
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := outbox.Append(ctx, tx, testIntent(key)); err != nil {
							return err
						}
						if notify {
							return outbox.Notify(ctx, tx)
						}
						return nil
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
		})
	}
}
