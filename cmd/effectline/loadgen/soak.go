package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/outbox"
)

// The soak (bench -duration) runs at a fixed rate for a stretch of wall
// time and prints one line per window, so that growth over time shows:
// throughput, latency, the process's memory, and the size and dead rows of
// the tables that grow with history. It must be able to run for hours, so
// nothing it keeps grows with the number of operations (the tool's
// duplicate check aside: one bit per operation), and nothing it asks
// PostgreSQL grows with the tables:
//
//   - completions are seen on the outcomes topic, by a consumer of the
//     bench's own, never read from operation_state (which a count(*) would
//     scan, and which pruning empties);
//   - an operation's commit time is kept only while it is in flight, and
//     latencies go into a fixed-size histogram per window;
//   - the sizes come from the catalog (pg_total_relation_size,
//     pg_stat_user_tables), which costs the same at any size.

// soakLostAfter is how long an operation may stay in flight before the
// window lines count it as lost (it still counts as completed if its
// outcome turns up later).
const soakLostAfter = time.Minute

// soakTables are the tables whose growth the soak prints.
var soakTables = []string{"operations", "events", "outbox", "operation_state"}

// histogram is a latency histogram of fixed size: buckets growing by 2 %
// from 50µs to about 6 minutes, so a percentile read from it is within
// 1 % of the true one and memory does not depend on the count.
type histogram struct {
	counts [histBuckets]int64
	n      int64
	max    time.Duration
}

const (
	histBuckets = 800
	histBase    = 50 * time.Microsecond
	histRatio   = 1.02
)

var histLogRatio = math.Log(histRatio)

func (h *histogram) add(d time.Duration) {
	i := 0
	if d > histBase {
		i = min(histBuckets-1, 1+int(math.Log(float64(d)/float64(histBase))/histLogRatio))
	}
	h.counts[i]++
	h.n++
	h.max = max(h.max, d)
}

// quantile returns the geometric middle of the bucket holding the q-th
// quantile, 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	target := int64(math.Ceil(q * float64(h.n)))
	if target >= h.n {
		return h.max
	}
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= max(target, 1) {
			if i == 0 {
				return min(h.max, histBase)
			}
			return min(h.max, time.Duration(float64(histBase)*math.Pow(histRatio, float64(i)-0.5)))
		}
	}
	return h.max
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// inFlight tracks the operations committed and not yet seen completed.
type inFlight struct {
	mu      sync.Mutex
	pending map[string]time.Time // zero while the agent's transaction commits
	win     histogram
	winDone int64
	done    int64
	repeats int64 // completions of keys not in flight: an event relayed twice

	submitted atomic.Int64 // operations handed to the agent's transactions
	held      atomic.Int64 // operations not submitted on time: too many in flight
}

func newInFlight() *inFlight { return &inFlight{pending: map[string]time.Time{}} }

// begin registers keys before their transaction commits, so that an outcome
// seen before the commit time is recorded still finds them.
func (f *inFlight) begin(keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		f.pending[k] = time.Time{}
	}
}

func (f *inFlight) committed(keys []string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if t, ok := f.pending[k]; ok && t.IsZero() {
			f.pending[k] = at
		}
	}
}

// abort forgets keys whose transaction failed.
func (f *inFlight) abort(keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.pending, k)
	}
}

func (f *inFlight) complete(key string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.pending[key]
	if !ok {
		f.repeats++
		return
	}
	delete(f.pending, key)
	f.done++
	f.winDone++
	if !t.IsZero() {
		f.win.add(at.Sub(t))
	}
}

// window returns the window's completions and histogram and starts the
// next one, with the totals and what is in flight.
func (f *inFlight) window(now time.Time) (done int64, h histogram, total int64, pending, lost int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	done, h = f.winDone, f.win
	f.winDone, f.win = 0, histogram{}
	for _, t := range f.pending {
		if !t.IsZero() && now.Sub(t) > soakLostAfter {
			lost++
		}
	}
	return done, h, f.done, len(f.pending), lost
}

func (f *inFlight) left() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// watchCompletions consumes the outcomes topic from its start and calls
// f.complete for every attempt.succeeded (the bench's tool always
// succeeds). It reads every partition with a plain consumer, from the
// oldest offset, so nothing relayed before it connected is missed.
func watchCompletions(ctx context.Context, a *app.App, f *inFlight) (func(), error) {
	kc := a.Kafka
	topic := kc.Topic(events.TopicOutcomes)
	sc := kc.Sarama()
	sc.ClientID = kc.ClientID + "-bench"
	sc.Consumer.Return.Errors = true
	consumer, err := sarama.NewConsumer(kc.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("bench: consuming %s: %w", topic, err)
	}
	parts, err := consumer.Partitions(topic)
	if err != nil {
		_ = consumer.Close()
		return nil, fmt.Errorf("bench: listing the partitions of %s: %w", topic, err)
	}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			for _, pc := range pcs {
				pc.AsyncClose()
			}
			_ = consumer.Close()
			return nil, fmt.Errorf("bench: consuming %s/%d: %w", topic, p, err)
		}
		pcs = append(pcs, pc)
		wg.Add(2)
		go func() {
			defer wg.Done()
			var head struct {
				Type events.Type `json:"type"`
			}
			for m := range pc.Messages() {
				head.Type = ""
				if json.Unmarshal(m.Value, &head) == nil && head.Type == events.AttemptSucceeded {
					f.complete(string(m.Key), time.Now())
				}
			}
		}()
		go func() {
			defer wg.Done()
			for err := range pc.Errors() {
				if ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "bench: consuming %s: %v\n", topic, err)
				}
			}
		}()
	}
	return func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		_ = consumer.Close()
	}, nil
}

// soakSizes is one table's size from the catalog.
type soakSizes struct {
	total, indexes int64
	live, dead     int64
}

// soakSizesSQL sums each table over its partitions: the outbox is
// partitioned (migration 0009), and a partitioned table's own size is zero.
// pg_partition_tree of a plain table is empty, hence the table itself in
// the UNION (which also drops the partitioned root's duplicate).
const soakSizesSQL = `SELECT c.relname, sum(pg_total_relation_size(p.relid))::bigint, sum(pg_indexes_size(p.relid))::bigint,
       sum(coalesce(s.n_live_tup, 0))::bigint, sum(coalesce(s.n_dead_tup, 0))::bigint
  FROM pg_class c
 CROSS JOIN LATERAL (SELECT t.relid FROM pg_partition_tree(c.oid) t UNION SELECT c.oid::regclass) p
  LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid
 WHERE c.relname = ANY($1) AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND pg_table_is_visible(c.oid)
 GROUP BY c.relname`

func tableSizes(ctx context.Context, a *app.App) (map[string]soakSizes, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := a.Pool.Query(ctx, soakSizesSQL, soakTables)
	if err != nil {
		return nil, err
	}
	out := map[string]soakSizes{}
	for rows.Next() {
		var name string
		var s soakSizes
		if err := rows.Scan(&name, &s.total, &s.indexes, &s.live, &s.dead); err != nil {
			rows.Close()
			return nil, err
		}
		out[name] = s
	}
	return out, rows.Err()
}

// rss returns the process's resident set (VmRSS), 0 where /proc is not.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// soakLoad submits intents at bc.Rate, in the agent's transactions through
// the outbox, until n are submitted (n >= 0) or until, whichever is first;
// it returns how many it submitted.
func (bc Config) soakLoad(ctx context.Context, a *app.App, f *inFlight, key func(int) string, n int, until time.Time) (int, error) {
	batch := bc.effectiveBatch()
	// At most this many agent transactions at once: a stalled database
	// slows the agent down rather than piling up goroutines, and the
	// window lines show the rate achieved.
	slots := make(chan struct{}, 256)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	next := 0
	period := time.Duration(float64(time.Second) * float64(batch) / float64(bc.Rate))
	err := paced(ctx, wallClock, period, func() bool {
		if (n >= 0 && next >= n) || !time.Now().Before(until) || failed.Load() != nil {
			return false
		}
		if f.left() >= bc.maxInFlight() {
			// The pipeline is this far behind: the agent holds back
			// rather than growing a backlog without bound, so the rate
			// achieved is what it sustains, and the window lines say how
			// much was held back.
			f.held.Add(int64(batch))
			return true
		}
		lo, hi := next, next+batch
		if n >= 0 {
			hi = min(hi, n)
		}
		next = hi
		f.submitted.Add(int64(hi - lo))
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			keys := make([]string, 0, hi-lo)
			ins := make([]outbox.Intent, 0, hi-lo)
			for i := lo; i < hi; i++ {
				keys = append(keys, key(i))
				ins = append(ins, outbox.Intent{
					OperationKey: key(i), Tool: "bench.charge", EffectClass: events.Irreversible,
					Args: json.RawMessage(fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 100+i%900)), Principal: "bench-agent",
				})
			}
			f.begin(keys)
			err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
				_, err := outbox.AppendMany(ctx, tx, ins)
				return err
			})
			if err != nil {
				f.abort(keys)
				if ctx.Err() == nil {
					failed.CompareAndSwap(nil, &err)
				}
				return
			}
			f.committed(keys, time.Now())
			a.Store.NotifyAppended()
		}()
		return true
	})
	wg.Wait()
	if p := failed.Load(); p != nil {
		return next, *p
	}
	if err == nil {
		err = ctx.Err()
	}
	return next, err
}

// awaitDrained waits until nothing is in flight, or timeout.
func awaitDrained(ctx context.Context, f *inFlight, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for f.left() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// soak runs the load for bc.Duration, printing a line per bc.Window.
func (bc Config) soak(ctx, runCtx context.Context, a *app.App, sink *benchTool, stdout io.Writer) error {
	f := newInFlight()
	stopWatch, err := watchCompletions(runCtx, a, f)
	if err != nil {
		return err
	}
	defer stopWatch()

	if bc.Warmup > 0 {
		if _, err := bc.soakLoad(runCtx, a, f, warmupKey, bc.Warmup, time.Now().Add(bc.Timeout)); err != nil {
			return fmt.Errorf("bench: warming up: %w", err)
		}
		if err := awaitDrained(ctx, f, bc.Timeout); err != nil {
			return err
		}
		if left := f.left(); left > 0 {
			return fmt.Errorf("bench: warming up: %d of %d operations did not complete within %s", left, bc.Warmup, bc.Timeout)
		}
		f.window(time.Now())
		f.mu.Lock()
		f.done, f.repeats = 0, 0
		f.mu.Unlock()
		f.submitted.Store(0)
		f.held.Store(0)
	}
	warmupDups := sink.duplicates()

	retention := "none (dedup_window 720h, the default: nothing is pruned in the run)"
	if bc.Retention > 0 {
		tomb := "kept"
		if bc.TombstoneRetention > 0 {
			tomb = "deleted after " + bc.TombstoneRetention.String()
		}
		retention = fmt.Sprintf("dedup_window %s, pruner every %s, tombstones %s", bc.Retention, bc.pruneInterval(), tomb)
	}
	fmt.Fprintf(stdout, "soak: %s at %d/s in batches of %d through the outbox (at most %d in flight), a line every %s; retention: %s\n",
		bc.Duration, bc.Rate, bc.effectiveBatch(), bc.maxInFlight(), bc.Window, retention)
	fmt.Fprintf(stdout, "soak: latency is intent committed → attempt.succeeded on the outcomes topic; sizes are pg_total_relation_size (idx: pg_indexes_size), live/dead from pg_stat_user_tables\n")

	start := time.Now()
	last := start
	var all histogram
	var maxRSS int64
	windows := 0
	lastRelay := a.RelayStats()
	printWindow := func(now time.Time) {
		done, h, total, pending, lost := f.window(now)
		all.merge(&h)
		windows++
		r := rss()
		maxRSS = max(maxRSS, r)
		var heap runtime.MemStats
		runtime.ReadMemStats(&heap)
		var b strings.Builder
		span := max(now.Sub(last), time.Millisecond)
		last = now
		fmt.Fprintf(&b, "soak: t=%.0fs completed=%d throughput=%.0f/s p50=%.1fms p99=%.1fms rss=%.0fMB heap=%.0fMB",
			now.Sub(start).Seconds(), done, float64(done)/span.Seconds(), ms(h.quantile(0.50)), ms(h.quantile(0.99)),
			mb(r), mb(int64(heap.HeapInuse)))
		sizes, err := tableSizes(ctx, a)
		if err != nil {
			fmt.Fprintf(&b, " sizes=error(%v)", err)
		}
		var sum int64
		for _, t := range soakTables {
			s := sizes[t]
			sum += s.total
			fmt.Fprintf(&b, " %s=%.1fMB,idx=%.1fMB,live=%d,dead=%d", t, mb(s.total), mb(s.indexes), s.live, s.dead)
		}
		fmt.Fprintf(&b, " tables=%.1fMB total=%d submitted=%d held=%d duplicates=%d lost=%d pending=%d",
			mb(sum), total, f.submitted.Load(), f.held.Load(), sink.duplicates()-warmupDups, lost, pending)
		// A relay that fails to publish (a Kafka send timing out) stalls
		// every operation behind it; its failed batches say so, and its
		// busy share of the window (relay_kafka of it waiting for Kafka,
		// the rest in PostgreSQL) says which side slowed a slow one.
		rs := a.RelayStats()
		fmt.Fprintf(&b, " relay_published=%d relay_batches=%d relay_errors=%d relay_busy=%.0f%% relay_kafka=%.0f%%",
			rs.Published-lastRelay.Published, rs.Batches-lastRelay.Batches, rs.Errors-lastRelay.Errors,
			100*(rs.BatchTime-lastRelay.BatchTime).Seconds()/span.Seconds(), 100*(rs.SendTime-lastRelay.SendTime).Seconds()/span.Seconds())
		// The outbox's partitions: rotations and truncates this window, and
		// the truncates that gave up on a partition's lock.
		fmt.Fprintf(&b, " outbox_rotations=%d outbox_truncates=%d outbox_truncate_busy=%d",
			rs.Rotations-lastRelay.Rotations, rs.Truncates-lastRelay.Truncates, rs.TruncateBusy-lastRelay.TruncateBusy)
		lastRelay = rs
		fmt.Fprintln(stdout, b.String())
	}

	loadDone := make(chan struct{})
	var submitted int
	var loadErr error
	go func() {
		defer close(loadDone)
		submitted, loadErr = bc.soakLoad(runCtx, a, f, benchKey, -1, start.Add(bc.Duration))
	}()
	tick := time.NewTicker(bc.Window)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-loadDone:
			running = false
		case now := <-tick.C:
			printWindow(now)
		}
	}
	if loadErr != nil {
		return fmt.Errorf("bench: submitting intents: %w", loadErr)
	}
	if err := awaitDrained(ctx, f, bc.Timeout); err != nil {
		return err
	}
	printWindow(time.Now())
	elapsed := time.Since(start)
	if bc.MemProfile != "" {
		if err := writeHeapProfile(bc.MemProfile); err != nil {
			return err
		}
	}

	_, _, completed, _, _ := f.window(time.Now())
	lost := f.left()
	dups := sink.duplicates() - warmupDups
	pruned, _ := a.Store.CountTombstones(ctx)
	fmt.Fprintf(stdout, "soak: submitted %d (%d held back: too many in flight), completed %d in %s; %d windows; max rss %.0fMB; %d tombstones at the end; p99.9=%.1fms max=%.1fms\n",
		submitted, f.held.Load(), completed, elapsed.Round(time.Second), windows, mb(maxRSS), pruned, ms(all.quantile(0.999)), ms(all.max))
	fmt.Fprintf(stdout, "soak: ops=%d throughput=%.0f/s p50=%.1fms p99=%.1fms duplicates=%d lost=%d\n",
		completed, float64(completed)/elapsed.Seconds(), ms(all.quantile(0.50)), ms(all.quantile(0.99)), dups, lost)
	if dups > 0 || lost > 0 {
		return fmt.Errorf("bench: %d duplicate effects, %d lost operations", dups, lost)
	}
	return nil
}

// writeHeapProfile writes what is live at the end of the run, while the
// components still hold what they hold.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// maxInFlight bounds the operations in flight to ten seconds' worth at the
// rate.
func (bc Config) maxInFlight() int { return max(100, 10*bc.Rate) }

// pruneInterval is how often the soak's pruner runs: a sixth of the
// dedup window, between 1s and 30s (the pruner's default), so pruning
// keeps pace with a short window.
func (bc Config) pruneInterval() time.Duration {
	return min(30*time.Second, max(time.Second, bc.Retention/6))
}
