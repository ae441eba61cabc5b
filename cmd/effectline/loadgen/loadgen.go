// Package loadgen is `effectline bench`: it drives intents through the
// whole pipeline in one process (an agent appending intents through the
// outbox or POSTing them to the API, the relay, Kafka, the executor, a
// local tool over HTTP, the outcomes topic, the projector) and reports
// throughput, end-to-end latency, synchronous commits and CPU time per
// operation, and duplicate and lost operations.
package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/tool/httptool"
)

// Config is the load of one `effectline bench` run.
type Config struct {
	N           int
	Warmup      int // operations run first and not measured
	Rate        int // operations per second; 0 = flat out
	Batch       int // intents per agent transaction
	Concurrency int // agent transactions in flight (flat out)
	Timeout     time.Duration
	Keep        bool // keep the benchmark database
	// Via is how intents come in: "outbox" (an agent's own transactions)
	// or "http" (POST /v1/intents, group-committed with the executor's
	// appends).
	Via        string
	CPUProfile string // a file for a CPU profile of the run, when set
	MemProfile string // a file for a heap profile at the end of a soak, when set

	// Wait makes each POST (Via "http") ask Prefer: wait and records how
	// long the agent waited for its answer.
	Wait bool

	// Duration > 0 makes the run a soak (soak.go): intents at Rate for
	// Duration, N unused, a line per Window.
	Duration time.Duration
	Window   time.Duration
	// Retention > 0 gives the bench's tool that dedup_window, so settled
	// operations are pruned during the run; TombstoneRetention > 0 deletes
	// their tombstones after it.
	Retention          time.Duration
	TombstoneRetention time.Duration

	// History > 0 seeds that many settled operations, copies of the
	// warm-up's, before the measured run (history.go).
	History int
	// In names an existing database to run in, one an earlier run left
	// with -keep (and its history), instead of a fresh one; it is kept.
	// The run's keys carry a tag of their own there (keyTag).
	In string

	// Split runs each component in a process of its own (-via http only):
	// `effectline run --components <c>` children of this binary, as the
	// Kubernetes manifests deploy them; the bench keeps the agent, the
	// tool and the measurement.
	Split bool
	// Replicas is how many processes of each component Split runs
	// (default 1); the bench posts to the API replicas in turn.
	Replicas int

	apiBase []string
	client  *http.Client
	waits   *waitStats
	split   *splitProcesses
}

// waitStats collects the agent-perceived latencies of waiting POSTs, in a
// histogram of fixed size.
type waitStats struct {
	mu       sync.Mutex
	lat      histogram
	accepted int // answered 202: the wait ran out first
}

func (s *waitStats) add(d time.Duration, status int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if status == http.StatusOK {
		s.lat.add(d)
	} else {
		s.accepted++
	}
}

// ErrConfig says a Config field is out of range.
var ErrConfig = errors.New("-n, -batch and -concurrency must be positive, -rate and -warmup not negative, -via outbox or http, -wait only with -via http; " +
	"-duration (a soak) needs -rate > 0, -via outbox and a positive -window; -retention and -tombstone-retention not negative; -split only with -via http and without -duration, -replicas only with -split; " +
	"-history not negative, with -warmup > 0 and without -duration; -in without -history and -workflows")

func (bc Config) check() error {
	if bc.N <= 0 || bc.Batch <= 0 || bc.Concurrency <= 0 || bc.Rate < 0 || bc.Warmup < 0 || (bc.Via != "outbox" && bc.Via != "http") ||
		(bc.Wait && bc.Via != "http") || bc.Duration < 0 || bc.Retention < 0 || bc.TombstoneRetention < 0 ||
		(bc.Duration > 0 && (bc.Rate == 0 || bc.Via != "outbox" || bc.Window <= 0)) ||
		(bc.Split && (bc.Via != "http" || bc.Duration > 0)) || (bc.Replicas > 1 && !bc.Split) || bc.Replicas < 0 ||
		bc.History < 0 || (bc.History > 0 && (bc.Warmup == 0 || bc.Duration > 0)) ||
		(bc.In != "" && bc.History > 0) {
		return ErrConfig
	}
	return nil
}

// Run drives bc.N intents through the whole pipeline in one process — an
// agent appending intents through the outbox, the relay, Kafka, the
// executor, a local tool over HTTP, the outcomes topic, the projector — and
// reports throughput, end-to-end latency (intent committed → terminal state
// in operation_state), synchronous commits per operation, and duplicate and
// lost operations. cfg is the process configuration; Run uses a database
// of its own beside cfg.DatabaseURL.
func Run(ctx context.Context, bc Config, cfg app.Config, getenv func(string) string, stdout, stderr io.Writer) error {
	if err := bc.check(); err != nil {
		return err
	}
	cfg, sink, cleanup, err := bc.prepare(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	reg, err := httptool.Parse([]byte(sink.toolsYAML(bc.Retention)), getenv)
	if err != nil {
		return err
	}
	if bc.Retention > 0 {
		cfg.TombstoneRetention = bc.TombstoneRetention
		cfg.PruneInterval = bc.pruneInterval()
	}
	if len(cfg.KafkaBrokers) == 0 {
		// A retention of twice the longest an operation may take before
		// a soak counts it as lost bounds the broker's log by time, not
		// by -n; the broker keeps what a consumer group has not read.
		cluster, err := app.StartEmbeddedBroker(cfg.Partitions, 2*soakLostAfter)
		if err != nil {
			return err
		}
		defer cluster.Close()
		cfg.KafkaBrokers = cluster.ListenAddrs()
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	comps := []string{app.Relay, app.Executor, app.Projector, app.Reconciler}
	if bc.Via == "http" {
		comps = append(comps, app.API)
	}
	if bc.Split {
		comps = nil
	}
	// One process journals every event (with -split the API is elsewhere
	// and this process has none), as in dev.
	a, err := app.Open(ctx, app.Options{Config: cfg, Stdout: stderr, Getenv: getenv, Components: comps,
		Migrate: true, Tools: reg, Service: "effectline-bench", Open: true, SoleWriter: !bc.Split})
	if err != nil {
		return err
	}
	if bc.Split {
		sp, err := startSplit(ctx, cfg, sink.toolsYAML(bc.Retention), max(bc.Replicas, 1))
		if err != nil {
			a.Close(ctx)
			return err
		}
		bc.split = sp
		defer func() {
			if err := sp.stop(); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}()
		for _, addr := range sp.apiAddrs {
			bc.apiBase = append(bc.apiBase, "http://"+addr)
		}
	}
	if addr := a.APIAddr(); addr != "" {
		bc.apiBase = []string{"http://" + addr}
	}
	if len(bc.apiBase) > 0 {
		// At most 1,024 connections per API: a rate the machine cannot
		// carry (2,000/s with waits on a slow host) otherwise opens one
		// per request in flight until the process, which also serves
		// them, runs out of file descriptors and the bench dies. Past
		// the bound the POSTs queue in the client, and their latency,
		// timed from before the queue, says so.
		bc.client = &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 1024}}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { stop(); <-done }()
	if bc.Duration > 0 {
		return bc.soak(ctx, runCtx, a, sink, stdout)
	}

	// Warm up: the consumer groups join, connections open and the heap
	// grows while the first operations run; those are not what is measured.
	if bc.Warmup > 0 {
		wc := bc
		wc.N = bc.Warmup
		warm := newTracker(wc.N, wc.effectiveBatch(), warmupKey)
		if err := wc.runUntilDone(ctx, runCtx, a, sink, warm, new(atomic.Int64), io.Discard); err != nil {
			return fmt.Errorf("bench: warming up: %w", err)
		}
	}
	if bc.Warmup > 0 && bc.History == 0 {
		if err := analyzeWarmup(ctx, a.Pool); err != nil {
			return err
		}
	}
	if bc.History > 0 {
		if err := seedHistory(ctx, a.Pool, warmupKeyPrefix(), bc.History, cmp.Or(bc.Rate, 500), stderr, stdout); err != nil {
			return err
		}
		if err := checkHistory(ctx, a, bc.History); err != nil {
			return err
		}
		if err := printHistorySizes(ctx, a, bc.History, bc.Warmup, stdout); err != nil {
			return err
		}
	}
	warmupCalls := sink.calls.Load()

	var before, beforeAll int64
	_ = a.Pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&beforeAll)
	before = a.Store.SyncCommits()

	mode := "flat out"
	if bc.Rate > 0 {
		mode = fmt.Sprintf("%d/s", bc.Rate)
	}
	if bc.Via == "http" {
		fmt.Fprintf(stdout, "bench: %d operations, %s, intents one per POST /v1/intents, tool %s\n", bc.N, mode, sink.url)
	} else {
		fmt.Fprintf(stdout, "bench: %d operations, %s, intents in batches of %d through the outbox, tool %s\n",
			bc.N, mode, bc.effectiveBatch(), sink.url)
	}
	if bc.Warmup > 0 {
		fmt.Fprintf(stdout, "warm-up: %d operations run first, not measured\n", bc.Warmup)
	}
	tr := newTracker(bc.N, bc.effectiveBatch(), benchKey)
	if bc.Wait {
		bc.waits = &waitStats{}
	}
	var reloadsBefore, sweepsBefore int64
	if a.Waits != nil {
		reloadsBefore, sweepsBefore = a.Waits.Queries()
	}
	var agentCommits atomic.Int64
	start := time.Now()
	cpuBefore, childrenBefore := sampleCPU(), bc.split.cpu()
	if err := bc.runUntilDone(ctx, runCtx, a, sink, tr, &agentCommits, stderr); err != nil {
		return err
	}
	elapsed := time.Since(start)
	cpu := sampleCPU().perOp(cpuBefore, bc.N)
	cpuChildren := float64((bc.split.cpu() - childrenBefore).Microseconds()) / 1000 / float64(bc.N)

	// Latency: from each intent's commit to its terminal row's projection,
	// and to the outcome journaled (the write side), which tells the
	// executor's share from the relay's and the projector's.
	tr.mu.Lock()
	lat, wlat, completed, last := tr.lat, tr.wlat, tr.completed, tr.last
	tr.mu.Unlock()
	if wlat.n > 0 {
		fmt.Fprintf(stdout, "journaled (write side): p50=%.1fms p99=%.1fms\n", ms(wlat.quantile(0.50)), ms(wlat.quantile(0.99)))
	}
	keys := make([]string, bc.N)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	if err := printStages(ctx, a.Store, keys, stdout); err != nil {
		return fmt.Errorf("bench: reading the journal's stage times: %w", err)
	}
	var afterAll int64
	_ = a.Pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&afterAll)
	syncCommits := a.Store.SyncCommits() - before + agentCommits.Load()

	pct := func(p float64) float64 { return ms(lat.quantile(p)) }
	span := elapsed
	if !last.IsZero() {
		span = last.Sub(start)
	}
	throughput := float64(completed) / span.Seconds()
	dups := sink.duplicates()
	lost := bc.N - completed
	fmt.Fprintf(stdout, "completed %d of %d in %.2fs; tool calls %d, effects %d\n", completed, bc.N, span.Seconds(),
		sink.calls.Load()-warmupCalls, sink.effects()-int(warmupCalls))
	fmt.Fprintf(stdout, "postgres: %.2f synchronous commits per operation (%d), %.2f transactions of any kind per operation\n",
		float64(syncCommits)/float64(bc.N), syncCommits, float64(afterAll-beforeAll)/float64(bc.N))
	if agent := agentCommits.Load(); agent > 0 {
		// Through the outbox the intent rides in the agent's own business
		// transaction, which commits whether or not effectline exists.
		fmt.Fprintf(stdout, "postgres: %.2f of them effectline's own (claims and outcomes), %.2f the agent's transactions that carried the intents\n",
			float64(syncCommits-agent)/float64(bc.N), float64(agent)/float64(bc.N))
	}
	if cpu.machine > 0 {
		fmt.Fprintln(stdout, cpu.line("operation", bc.split != nil, cpuChildren))
	}
	if bc.split != nil {
		fmt.Fprintln(stdout, "postgres: with -split the synchronous commits are the components' processes' and not counted here; the transactions of any kind are")
	}
	if s := bc.waits; s != nil {
		s.mu.Lock()
		h, accepted := s.lat, s.accepted
		s.mu.Unlock()
		wp := func(p float64) float64 { return ms(h.quantile(p)) }
		fmt.Fprintf(stdout, "wait: POST with Prefer: wait=20 to its 200: p50=%.1fms p95=%.1fms p99=%.1fms (%d answered 200, %d answered 202)\n",
			wp(0.50), wp(0.95), wp(0.99), h.n, accepted)
		if a.Waits != nil {
			reloads, sweeps := a.Waits.Queries()
			fmt.Fprintf(stdout, "wait: the waiters' own queries: %d head reloads after a feed gap, %d sweep queries, for %d waiting requests\n",
				reloads-reloadsBefore, sweeps-sweepsBefore, bc.N)
		}
	}
	fmt.Fprintf(stdout, "bench: ops=%d throughput=%.0f/s p50=%.1fms p95=%.1fms p99=%.1fms tx_per_op=%.2f duplicates=%d lost=%d\n",
		bc.N, throughput, pct(0.50), pct(0.95), pct(0.99), float64(syncCommits)/float64(bc.N), dups, lost)
	if dups > 0 || lost > 0 {
		return fmt.Errorf("bench: %d duplicate effects, %d lost operations", dups, lost)
	}
	return nil
}

func (bc Config) effectiveBatch() int {
	if bc.Rate > 0 {
		return max(1, bc.Rate/200) // about 200 agent transactions a second (250 at 500/s: batches of 2)
	}
	return bc.Batch
}

// keyTag, when set, goes into every key of the run ("bench/<tag>/op-…"):
// a run in a database earlier runs used (-in) must not reuse their keys,
// which would answer from the stored results and run nothing. Run sets it
// once, before anything makes a key.
var keyTag string

// benchKeyPrefix begins every measured operation's key.
func benchKeyPrefix() string { return "bench/" + keyTag + "op-" }

func benchKey(i int) string { return fmt.Sprintf("%s%07d", benchKeyPrefix(), i) }

// warmupKeyPrefix begins every warm-up operation's key.
func warmupKeyPrefix() string { return "bench/" + keyTag + "warmup-" }

func warmupKey(i int) string { return fmt.Sprintf("%s%07d", warmupKeyPrefix(), i) }

// runUntilDone submits bc.N intents named by tr's keys and waits until
// the read model shows every one of them settled. The progress check asks
// only about the operations in flight (tracker.poll), so it costs the same
// after a million operations as after a thousand.
func (bc Config) runUntilDone(ctx, runCtx context.Context, a *app.App, sink *benchTool, tr *tracker,
	commits *atomic.Int64, progressTo io.Writer) error {
	sink.track.Store(tr)
	defer sink.track.Store(nil)
	start := time.Now()
	loadErr := make(chan error, 1)
	go func() { loadErr <- bc.load(runCtx, a, tr, commits) }()
	reader := projector.NewReader(a.Pool)
	var finished int
	deadline := time.Now().Add(bc.Timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for finished < bc.N && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-loadErr:
			if err != nil {
				return fmt.Errorf("bench: submitting intents: %w", err)
			}
		case <-tick.C:
		}
		if err := tr.poll(ctx, reader.Settled); err != nil {
			return err
		}
		finished = tr.settled()
		progress(progressTo, finished, bc.N, time.Since(start))
	}
	fmt.Fprintln(progressTo)
	return nil
}

// load plays the agent service: it appends intents through the outbox in
// transactions of its own, at the configured rate or as fast as it can.
func (bc Config) load(ctx context.Context, a *app.App, tr *tracker, commits *atomic.Int64) error {
	key := tr.key
	batch := bc.effectiveBatch()
	var next atomic.Int64
	submit := func() (bool, error) {
		lo := int(next.Add(int64(batch))) - batch
		if lo >= bc.N {
			return false, nil
		}
		hi := min(lo+batch, bc.N)
		ins := make([]outbox.Intent, 0, hi-lo)
		for i := lo; i < hi; i++ {
			ins = append(ins, outbox.Intent{
				OperationKey: key(i), Tool: "bench.charge", EffectClass: events.Irreversible,
				Args: json.RawMessage(fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 100+i%900)), Principal: "bench-agent",
			})
		}
		if bc.Via == "http" {
			errs := make(chan error, len(ins))
			for j, in := range ins {
				go func() { errs <- bc.post(ctx, in, tr, lo+j) }()
			}
			for range ins {
				if err := <-errs; err != nil {
					return false, err
				}
			}
			return hi < bc.N, nil
		}
		err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
			_, err := outbox.AppendMany(ctx, tx, ins)
			return err
		})
		if err != nil {
			return false, err
		}
		commits.Add(1)
		a.Store.NotifyAppended()
		tr.committed(lo, hi, time.Now())
		return hi < bc.N, nil
	}
	if bc.Rate > 0 {
		var wg sync.WaitGroup
		errc := make(chan error, 1)
		var failed error
		err := paced(ctx, wallClock, time.Duration(float64(time.Second)*float64(batch)/float64(bc.Rate)), func() bool {
			select {
			case failed = <-errc:
				return false
			default:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := submit(); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}()
			return int(next.Load()) < bc.N
		})
		wg.Wait()
		if failed == nil {
			select {
			case failed = <-errc:
			default:
			}
		}
		return cmp.Or(failed, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, bc.Concurrency)
	for range bc.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				more, err := submit()
				if err != nil {
					errs <- err
					return
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// post submits one intent through the API; its 202 means it is committed.
func (bc Config) post(ctx context.Context, in outbox.Intent, tr *tracker, i int) error {
	body, err := json.Marshal(map[string]any{"operation_key": in.OperationKey, "tool": in.Tool, "args": in.Args})
	if err != nil {
		return err
	}
	base := bc.apiBase[i%len(bc.apiBase)]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/intents", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if bc.Wait {
		req.Header.Set("Prefer", "wait=20")
	}
	sent := time.Now()
	if bc.Wait {
		// The answer comes after the outcome; the intent was committed
		// about when it was sent.
		tr.committed(i, i+1, sent)
	}
	resp, err := bc.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if bc.Wait {
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST /v1/intents for %s: %s", in.OperationKey, resp.Status)
		}
		bc.waits.add(time.Since(sent), resp.StatusCode)
		return nil
	}
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("POST /v1/intents for %s: %s", in.OperationKey, resp.Status)
	}
	tr.committed(i, i+1, time.Now())
	return nil
}

func progress(w io.Writer, done, total int, took time.Duration) {
	const width = 30
	filled := width * done / max(total, 1)
	rate := float64(done) / max(took.Seconds(), 0.001)
	fmt.Fprintf(w, "\r[%s%s] %d/%d operations  %.0f/s  ", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total, rate)
}

// prepare sets up what every bench mode runs on: the CPU profile when
// asked, a database of the run's own beside cfg's (dropped afterwards
// unless -keep), and the bench tool. cleanup undoes them in reverse order.
func (bc Config) prepare(ctx context.Context, cfg app.Config, stderr io.Writer) (app.Config, *benchTool, func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if bc.CPUProfile != "" {
		f, err := os.Create(bc.CPUProfile)
		if err != nil {
			return cfg, nil, cleanup, err
		}
		undo = append(undo, func() { f.Close() })
		if err := pprof.StartCPUProfile(f); err != nil {
			cleanup()
			return cfg, nil, func() {}, err
		}
		undo = append(undo, pprof.StopCPUProfile)
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	var dbURL string
	if bc.In != "" {
		u, err := databaseNamed(cfg.DatabaseURL, bc.In)
		if err != nil {
			cleanup()
			return cfg, nil, func() {}, err
		}
		dbURL = u
		var b [3]byte
		_, _ = rand.Read(b[:])
		keyTag = hex.EncodeToString(b[:]) + "/"
	} else {
		u, name, drop, err := createBenchDatabase(ctx, cfg.DatabaseURL)
		if err != nil {
			cleanup()
			return cfg, nil, func() {}, err
		}
		dbURL = u
		if bc.Keep {
			fmt.Fprintf(stderr, "bench: the database %s is kept (-in %s runs in it again)\n", name, name)
		} else {
			undo = append(undo, drop)
		}
	}
	cfg.DatabaseURL = dbURL
	sink, err := startBenchTool()
	if err != nil {
		cleanup()
		return cfg, nil, func() {}, err
	}
	undo = append(undo, sink.close)
	return cfg, sink, cleanup, nil
}

// databaseNamed is the URL base with its database replaced by name.
func databaseNamed(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("bench needs %s as a URL: %w", app.EnvDatabaseURL, err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// createBenchDatabase makes a fresh database beside the configured one so
// a run starts from empty tables, and returns its URL, its name and a
// func that drops it.
func createBenchDatabase(ctx context.Context, base string) (string, string, func(), error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		_, cerr := app.ConnectDatabase(ctx, base)
		return "", "", nil, cerr
	}
	defer conn.Close(ctx)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "effectline_bench_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", "", nil, fmt.Errorf("creating the benchmark database: %w", err)
	}
	u, err := databaseNamed(base, name)
	if err != nil {
		return "", "", nil, err
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(dctx, base); err == nil {
			_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(dctx)
		}
	}
	return u, name, drop, nil
}

// benchTool is the local downstream: it answers at once, honors nothing,
// and remembers which keys it was called with, so any duplicate execution
// shows as a duplicate. The bench's keys are numbered, so it keeps one bit
// per key (a soak of millions of operations needs a few hundred KB), not a
// map entry.
type benchTool struct {
	url   string
	srv   *http.Server
	calls atomic.Int64
	// track, while set, is told of every call (tracker.toolCalled).
	track atomic.Pointer[tracker]
	mu    sync.Mutex
	seen  map[string][]uint64 // key prefix → bitset of the numbers called
	other map[string]int      // calls of keys that are not the bench's
	dups  int
}

func startBenchTool() (*benchTool, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &benchTool{url: "http://" + ln.Addr().String(), seen: map[string][]uint64{}, other: map[string]int{}}
	t.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := t.calls.Add(1)
		key := r.Header.Get("Idempotency-Key")
		t.called(key)
		if tr := t.track.Load(); tr != nil {
			tr.toolCalled(key)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"ch_%d","status":"succeeded"}`, n)
	})}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

// called records one call with key, counting a duplicate if key was called
// before.
func (t *benchTool) called(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cut := strings.LastIndexByte(key, '-')
	i, err := strconv.Atoi(key[cut+1:])
	if cut < 0 || err != nil || i < 0 {
		if t.other[key]++; t.other[key] > 1 {
			t.dups++
		}
		return
	}
	prefix := key[:cut]
	bits := t.seen[prefix]
	if w := i / 64; w >= len(bits) {
		bits = append(bits, make([]uint64, w+1-len(bits)+len(bits)/2)...)
	}
	if bits[i/64]&(1<<(i%64)) != 0 {
		t.dups++
	}
	bits[i/64] |= 1 << (i % 64)
	t.seen[prefix] = bits
}

func (t *benchTool) close() { _ = t.srv.Close() }

// toolsYAML is the bench's tools file; retention > 0 is the tool's
// dedup_window.
func (t *benchTool) toolsYAML(retention time.Duration) string {
	window := ""
	if retention > 0 {
		window = "    dedup_window: " + retention.String() + "\n"
	}
	return `tools:
  - name: bench.charge
    effect: irreversible
    invoke: {method: POST, url: "` + t.url + `/charges", timeout: 5s}
    reconcile: {method: GET, url: "` + t.url + `/charges?idempotency_key={{.Key}}", timeout: 5s}
    retry: {max_attempts: 4, base_delay: 50ms, max_delay: 2s, deadline: 60s}
` + window
}

// effects is how many calls the tool answered.
func (t *benchTool) effects() int { return int(t.calls.Load()) }

func (t *benchTool) duplicates() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dups
}
