//go:build unix

package projector

import (
	"encoding/json"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/procstat"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// BenchmarkFlush measures one flush of a small batch, the shape the
// projector sees at a moderate rate: every batch holds one event each of
// size operations, and an operation's three events (intent, attempt started,
// attempt succeeded) come in three consecutive batches, so a third of the
// batches create rows and the rest advance them. One op is one flush;
// cpu-µs/op is the CPU time of the whole test process (the flush and the
// driver, not PostgreSQL) per flush, pg-cpu-µs/op that of the write pool's
// PostgreSQL backends, where the database is on this machine.
//
//	go test ./projector/ -run '^$' -bench BenchmarkFlush -benchtime 2000x
func BenchmarkFlush(b *testing.B) {
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			bt := benchBatcher(b)
			at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
			var batch []*request[events.Envelope]
			b.ReportAllocs()
			cpu, pg := cpuTime(b), bt.backendsCPU(b)
			b.ResetTimer()
			for i := range b.N {
				group, step := i/3, i%3
				batch = batch[:0]
				for s := range size {
					key := fmt.Sprintf("flush-%07d-%03d", group, s)
					batch = append(batch, &request[events.Envelope]{ctx: b.Context(), env: benchEvent(b, key, step, at), resp: make(chan response, 1)})
				}
				bt.flush(b.Context(), batch)
				for _, r := range batch {
					res := <-r.resp
					if res.err != nil || res.outcome != outcomeApplied {
						b.Fatalf("%s seq %d: outcome %s, %v, %v", r.env.OperationKey, r.env.Seq, res.outcome, res.err, res.reason)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64((cpuTime(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			if pg >= 0 {
				b.ReportMetric(float64((bt.backendsCPU(b)-pg).Microseconds())/float64(b.N), "pg-cpu-µs/op")
			}
		})
	}
}

// benchBatcher returns the batcher of a projector on a fresh database,
// ready to flush; nothing consumes Kafka.
func benchBatcher(b *testing.B) *batcher[events.Envelope, events.Operation] {
	b.Helper()
	pool := testenv.NewPool(b, storedb.New(b))
	p, err := New(Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, Store: store.New(pool)})
	if err != nil {
		b.Fatal(err)
	}
	wp, closeWP, err := openWritePool(b.Context(), p.cfg.Store, p.cfg.Flushers, p.cfg.SynchronousCommit)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(closeWP)
	p.batcher.pool = wp
	return p.batcher
}

// benchEvent returns event step (0, 1 or 2) of a successful operation.
func benchEvent(b *testing.B, key string, step int, at time.Time) events.Envelope {
	b.Helper()
	var (
		typ     events.Type
		attempt int
		data    any
	)
	switch step {
	case 0:
		typ, data = events.IntentRecorded, events.IntentData{Args: json.RawMessage(`{"amount": 100}`), Principal: "billing-agent"}
	case 1:
		typ, attempt, data = events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "worker-1", LeaseUntil: at.Add(time.Minute)}
	default:
		typ, attempt, data = events.AttemptSucceeded, 1, events.AttemptSucceededData{
			StatusCode: 201, Result: json.RawMessage(`{"id": "ch_1", "status": "ok"}`), DownstreamID: "ch_1", UndoRef: "undo/1"}
	}
	e, err := events.New(typ, key, int64(step+1), "payments.charge", events.Idempotent, attempt, data, at.Add(time.Duration(step)*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendsCPU returns the CPU time the write pool's backends have used,
// from /proc (-1 where they are not on this machine). It holds every
// connection of the pool while it asks for their pids.
func (bt *batcher[E, R]) backendsCPU(b *testing.B) time.Duration {
	b.Helper()
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var total time.Duration
	for range bt.pool.Config().MaxConns {
		c, err := bt.pool.Acquire(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(b.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			b.Fatal(err)
		}
		stat, err := procstat.Read(strconv.Itoa(pid))
		if err != nil {
			return -1
		}
		total += stat.CPU()
	}
	return total
}
