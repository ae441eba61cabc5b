package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

// The fault suite runs the real binary against a dependency that misbehaves
// mid-run (the broker restarts, PostgreSQL drops every connection, the
// downstream stalls, a proxy cuts connections, Kafka delivers every intent
// twice or replays the topic from offset 0) and reports, per test, the
// figures of the crash matrix: duplicate effects, lost operations and wrong
// final states. Target: all zero.
//
// Duplicate effects count standing effects beyond one per operation; the
// fake downstream honors idempotency keys, so this holds for the idempotent
// class too. An operation is lost when it is not settled by the deadline:
// every operation must end completed, or escalated where its class requires
// it (an irreversible effect whose request provably did nothing). A final
// state is wrong when it is not the one the class and the fault call for,
// or when the read model (operation_state) does not converge to the event
// store's record.

// faultComponents is what the fault tests run: everything but the API.
const faultComponents = "relay,executor,projector,reconciler"

// faultSettleTimeout bounds how long a fault test waits for every operation to
// settle after the last fault; it covers sarama's reconnect backoff and
// circuit breaker, the poller's pickup grace and a session timeout.
const faultSettleTimeout = 100 * time.Second

// faultOp is one operation a fault test drives.
type faultOp struct {
	key   string
	tool  string
	class events.EffectClass
}

// faultScale is the long form of the fault tests: the broker restart, the
// database restart and crashes, the double delivery and the replay drive
// that many times their operations (the crash test crashes once per 15),
// with as many times the time.
var faultScale = flag.Int("fault.scale", 1, "operations per fault test as a multiple of the CI form's (the long form uses 5 or more)")

// faultScaled returns n times faultScale.
func faultScaled(n int) int { return n * max(*faultScale, 1) }

// faultCtx bounds a scaled fault test.
func faultCtx(t *testing.T) context.Context {
	return untilCtx(t, time.Duration(max(*faultScale, 1))*3*time.Minute)
}

// faultOps returns n operations spread round-robin over the three tools of
// e2eTools, one class each.
func faultOps(prefix string, n int) []faultOp {
	ops := make([]faultOp, n)
	for i := range ops {
		c := crashClasses[i%len(crashClasses)]
		ops[i] = faultOp{key: fmt.Sprintf("%s/%03d/%s", prefix, i, c.class), tool: c.tool, class: c.class}
	}
	return ops
}

func (o faultOp) intent(i int) outbox.Intent {
	return outbox.Intent{OperationKey: o.key, Tool: o.tool, EffectClass: o.class,
		Args: json.RawMessage(fmt.Sprintf(`{"amount":%d}`, 100+i)), Principal: "fault-test"}
}

// faultWorldOptions shape a world for a fault test.
type faultWorldOptions struct {
	// brokers replaces the world's embedded broker (a restartable one, or
	// one behind a proxy). Default: testenv.NewBroker with brokerOpts.
	brokers    []string
	brokerOpts []testenv.BrokerOption
	// db is the database to use; default a new one on the shared server.
	db string
	// dbVia rewrites the database URL the binary uses (through a proxy);
	// the test itself always talks to the database directly.
	dbVia func(direct string) string
	// fake is the downstream; default a new FakeTool with fakeOpts.
	fake     *testenv.FakeTool
	fakeOpts []testenv.FakeOption
	// toolURL is the base URL the tools file points at; default fake.URL.
	toolURL string
	// tools is the tools file template (URL is replaced); default e2eTools.
	tools string
}

// newFaultWorld is newWorld with the dependencies the test controls.
func newFaultWorld(t *testing.T, o faultWorldOptions) *world {
	t.Helper()
	w := &world{db: o.db, fake: o.fake}
	if w.db == "" {
		w.db = testenv.NewDatabase(t)
	}
	if w.fake == nil {
		w.fake = testenv.NewFakeTool(t, o.fakeOpts...)
	}
	brokers := o.brokers
	if brokers == nil {
		w.broker = testenv.NewBroker(t, o.brokerOpts...)
		brokers = w.broker.Addrs
	} else {
		w.broker = &testenv.Broker{Addrs: brokers}
	}
	toolURL, tmpl := o.toolURL, o.tools
	if toolURL == "" {
		toolURL = w.fake.URL
	}
	if tmpl == "" {
		tmpl = e2eTools
	}
	dbURL := w.db
	if o.dbVia != nil {
		dbURL = o.dbVia(w.db)
	}
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(strings.ReplaceAll(tmpl, "URL", toolURL)), 0o600); err != nil {
		t.Fatal(err)
	}
	w.env = map[string]string{
		envDatabaseURL:                   dbURL,
		envKafkaBrokers:                  strings.Join(brokers, ","),
		envTools:                         tools,
		envKafkaPartitions:               "3",
		envExecutorLease:                 "2s",
		envSweepInterval:                 "200ms",
		envShutdownGrace:                 "3s",
		envLogLevel:                      "info",
		"EFFECTLINE_TEST_CONTEXT_MARKER": t.Name(),
	}
	migrate := start(t, "migrate", w.env, "migrate")
	if err := migrate.wait(60 * time.Second); err != nil {
		t.Fatalf("migrate: %v\n%s", err, migrate.output())
	}
	return w
}

var faultRunningLine = regexp.MustCompile(`effectline running`)

// faultStartPipeline starts the binary with the fault suite's components and
// waits until it says it runs.
func faultStartPipeline(t *testing.T, w *world, name string) *proc {
	t.Helper()
	p := start(t, name, w.env, "run", "--components", faultComponents)
	p.waitLine(faultRunningLine, 60*time.Second)
	return p
}

// faultFeed appends the intents of ops with outbox.Append, one transaction
// each, every `every`, retrying each until it commits: under a database
// fault a commit may fail or its answer be lost, and Append of the same
// intent again is a no-op, which is exactly what an agent service would do.
// The channel yields nil once every intent is in, or the last error if ctx
// ended first; wait for it with faultFed.
func faultFeed(ctx context.Context, pool *pgxpool.Pool, ops []faultOp, every time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for i, op := range ops {
			backoff := 50 * time.Millisecond
			for {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Append(ctx, tx, op.intent(i))
					return err
				})
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					done <- fmt.Errorf("appending %s: %w", op.key, err)
					return
				}
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
			}
			if every > 0 {
				time.Sleep(every)
			}
		}
		done <- nil
	}()
	return done
}

// faultFed waits for a faultFeed to finish.
func faultFed(t *testing.T, fed <-chan error) {
	t.Helper()
	if err := <-fed; err != nil {
		t.Fatal(err)
	}
}

// faultSettled reports whether nothing more happens to an operation without a
// human: a terminal status, or escalated.
func faultSettled(s events.Status) bool { return s.Terminal() || s == events.StatusEscalated }

// faultWaitSettled waits until every operation is settled, or ctx ends, and
// returns the records last seen. Load errors (the database may be down) are
// retried.
func faultWaitSettled(ctx context.Context, st *store.Store, ops []faultOp) map[string]events.Operation {
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.key
	}
	var last map[string]events.Operation
	waitForSoft(ctx, func() bool {
		got, err := st.LoadMany(ctx, keys)
		if err != nil {
			return false
		}
		last = got
		for _, k := range keys {
			if op, ok := got[k]; !ok || !faultSettled(op.Status) {
				return false
			}
		}
		return true
	})
	return last
}

// faultFigures is one fault test's line of figures.
type faultFigures struct {
	test                string
	ops                 int
	duplicates, lost    int
	wrongState          int
	retriedIrreversible int
	readModel           int // operations whose read model did not converge
	applied, released   int
	invokes             int
	// What the pipeline did to get there: attempts beyond the first,
	// undone attempts, and late outcomes kept as evidence.
	retries, undos, late int
	states               map[events.Status]int
	notes                []string
}

func (f *faultFigures) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

func (f *faultFigures) bad() int {
	return f.duplicates + f.lost + f.wrongState + f.retriedIrreversible + f.readModel
}

// report logs the figures as a small table and fails the test unless every
// bad figure is zero.
func (f *faultFigures) report(t *testing.T) {
	t.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s\n", f.test)
	fmt.Fprintf(&sb, "%5s %6s %5s %6s %9s %9s | %7s %8s %8s %7s %5s %4s  %s\n",
		"ops", "dups", "lost", "wrong", "irrev.re", "readmodel", "applied", "released", "invokes", "retries", "undos", "late", "final states")
	fmt.Fprintf(&sb, "%5d %6d %5d %6d %9d %9d | %7d %8d %8d %7d %5d %4d  %v\n", f.ops, f.duplicates, f.lost, f.wrongState,
		f.retriedIrreversible, f.readModel, f.applied, f.released, f.invokes, f.retries, f.undos, f.late, f.states)
	for _, n := range f.notes {
		fmt.Fprintf(&sb, "  %s\n", n)
	}
	t.Log(sb.String())
	if f.bad() != 0 {
		t.Errorf("%s: %d bad figures%s", f.test, f.bad(), sb.String())
	}
}

// faultExpectation says which final states an operation may end in. The default
// (nil) is: completed, or escalated for an irreversible effect that provably
// did not happen (its request was cut before it reached the downstream).
type faultExpectation func(op faultOp, rec events.Operation) (ok bool, why string)

func faultCompletedOrAbsent(op faultOp, rec events.Operation) (bool, string) {
	switch {
	case rec.Status == events.StatusCompleted:
		return true, ""
	case rec.Status == events.StatusEscalated && op.class == events.Irreversible:
		if rec.Escalation == nil || rec.Escalation.Reason != "absent_downstream" {
			return false, "escalated for another reason than an absent effect"
		}
		return true, ""
	case rec.Status == events.StatusFailed && neverSent[rec.LastErrorClass]:
		// The downstream refused every attempt before the request left
		// (the proxy refusing connections): confirmed no effect, retries
		// exhausted within the caps. That is a correct "failed".
		return true, ""
	}
	return false, "want completed (or escalated, irreversible and absent, or failed never sent)"
}

// neverSent are the error classes of a request that provably never left.
var neverSent = map[string]bool{
	"connection_refused": true, "dial": true, "dns": true, "tls_handshake": true,
	"timeout_before_send": true, "canceled_before_send": true,
}

// faultJudge computes the figures of a run from the records, the downstream's
// log and the read model. recs are the records faultWaitSettled returned.
func faultJudge(ctx context.Context, t *testing.T, f *faultFigures, w *world, pool *pgxpool.Pool, ops []faultOp,
	recs map[string]events.Operation, expect faultExpectation) {
	t.Helper()
	if expect == nil {
		expect = faultCompletedOrAbsent
	}
	f.ops = len(ops)
	f.states = map[events.Status]int{}
	effects := w.fake.EffectLog()
	reqs := w.fake.RequestLog()
	f.applied = len(effects)
	for _, e := range effects {
		if e.Released {
			f.released++
		}
	}
	for _, op := range ops {
		live := faultLiveEffects(effects, op.key)
		invokes := 0
		for _, r := range reqs {
			if r.Route == testenv.RouteInvoke && faultOfOperation(r.IdempotencyKey, op.key) {
				invokes++
			}
		}
		f.invokes += invokes
		rec, ok := recs[op.key]
		if !ok {
			f.lost++
			t.Errorf("%s: never journaled", op.key)
			continue
		}
		f.states[rec.Status]++
		f.retries += max(rec.Attempt-1, 0)
		f.undos += rec.Compensations
		f.late += rec.Evidence
		if !faultSettled(rec.Status) || rec.Status == events.StatusEscalated && op.class != events.Irreversible {
			// Escalated idempotent or compensable operations count as
			// lost: nothing called for a human.
			f.lost++
			t.Errorf("%s: not settled: %s (phase %s, attempt %d, last error %s)", op.key, rec.Status, rec.Phase, rec.Attempt, rec.LastErrorClass)
			continue
		}
		if live > 1 {
			f.duplicates += live - 1
			t.Errorf("%s: %d standing effects", op.key, live)
		}
		if good, why := expect(op, rec); !good {
			f.wrongState++
			t.Errorf("%s: final state %s: %s", op.key, rec.Status, why)
		} else if rec.Status == events.StatusCompleted && live == 0 {
			f.wrongState++
			t.Errorf("%s: completed with no standing effect", op.key)
		} else if rec.Status == events.StatusEscalated && live != 0 {
			f.wrongState++
			t.Errorf("%s: escalated while the downstream shows the effect", op.key)
		}
		if op.class == events.Irreversible && invokes > 1 {
			f.retriedIrreversible++
			t.Errorf("%s: an irreversible effect was sent %d times", op.key, invokes)
		}
	}
	f.readModel = faultReadModelLag(ctx, t, pool, ops)
}

// faultLiveEffects counts the unreleased effects of operation key under any of
// its downstream keys (key, key~c1, key~c2 ...).
func faultLiveEffects(effects []testenv.Effect, key string) int {
	n := 0
	for _, e := range effects {
		if !e.Released && faultOfOperation(e.IdempotencyKey, key) {
			n++
		}
	}
	return n
}

// faultOfOperation reports whether downstream key dk belongs to operation key.
func faultOfOperation(dk, key string) bool {
	if dk == key {
		return true
	}
	rest, ok := strings.CutPrefix(dk, key+"~c")
	if !ok {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

// faultReadModelLag waits (briefly) for operation_state to hold every
// operation's record at the event store's seq and status, and returns how
// many never got there.
func faultReadModelLag(ctx context.Context, t *testing.T, pool *pgxpool.Pool, ops []faultOp) int {
	t.Helper()
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.key
	}
	const q = `SELECT o.operation_key
		FROM operations o LEFT JOIN operation_state s USING (operation_key)
		WHERE o.operation_key = ANY($1)
		  AND (s.operation_key IS NULL OR s.last_seq <> o.seq OR s.status <> o.status)`
	var behind []string
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	converged := waitForSoft(wctx, func() bool {
		rows, err := pool.Query(wctx, q, keys)
		if err != nil {
			return false
		}
		behind, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err == nil && len(behind) == 0
	})
	if converged {
		return 0
	}
	t.Errorf("operation_state did not converge for %d operations: %v", len(behind), behind)
	return len(behind)
}

func faultListenLoopback(network, address string) (net.Listener, error) {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
}

// faultBroker is a kfake cluster that persists to a directory and
// listens on a fixed port, so it can be stopped and started again as the
// same broker: what a Kafka restart looks like to clients.
type faultBroker struct {
	t    *testing.T
	port int
	dir  string
	mu   sync.Mutex
	c    *kfake.Cluster
}

func newFaultBroker(t *testing.T) *faultBroker {
	t.Helper()
	b := &faultBroker{t: t, port: testenv.FreePort(t), dir: t.TempDir()}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *faultBroker) addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

func (b *faultBroker) start() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var err error
	for range 100 { // the old listener's port may take a moment to free
		b.c, err = kfake.NewCluster(kfake.Ports(b.port), kfake.DataDir(b.dir), kfake.ListenFn(faultListenLoopback))
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.t.Fatalf("starting the broker on %d: %v", b.port, err)
}

func (b *faultBroker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
	}
}

// TestFaultBrokerRestart stops the broker mid-run for 5s and starts it
// again on the same port and data directory. Intents appended while it is
// down wait in the outbox (or are run by the executor's poller after its
// pickup grace); outcomes wait in the event store; the consumers rejoin.
func TestFaultBrokerRestart(t *testing.T) {
	t.Parallel()
	b := newFaultBroker(t)
	w := newFaultWorld(t, faultWorldOptions{brokers: []string{b.addr()}, fakeOpts: []testenv.FakeOption{
		testenv.WithDefaultFault(testenv.FaultStall(100*time.Millisecond), testenv.RouteInvoke)}})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	f := &faultFigures{test: "broker restart (kfake stopped 5s mid-run, restarted on the same port and data dir)"}

	p := faultStartPipeline(t, w, "effectline")
	ops := faultOps("broker", faultScaled(45))
	fed := faultFeed(ctx, pool, ops, 100*time.Millisecond)

	waitFor(t, ctx, "a third of the operations to complete", func() bool { return faultCompletedCount(ctx, st, ops) >= len(ops)/3 })
	down := time.Now()
	b.stop()
	f.note("broker stopped with %d of %d operations completed", faultCompletedCount(ctx, st, ops), len(ops))
	time.Sleep(5 * time.Second)
	b.start()
	up := time.Now()
	var during int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE created_at BETWEEN $1 AND $2`, down, up).Scan(&during); err != nil {
		t.Fatal(err)
	}
	f.note("broker restarted after %s; %d intents were appended while it was down", up.Sub(down).Round(100*time.Millisecond), during)
	faultFed(t, fed)

	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	recs := faultWaitSettled(sctx, st, ops)
	f.note("every operation settled %s after the broker went down", time.Since(down).Round(100*time.Millisecond))
	time.Sleep(time.Second) // give a wrong retry the time to happen
	recs = faultReload(ctx, t, st, ops, recs)
	faultJudge(ctx, t, f, w, pool, ops, recs, faultOnlyCompleted)
	f.note("%s", faultLogSummary(p))
	f.report(t)
	if err := p.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// faultLogSummary counts the warnings and errors p logged, by message: the
// evidence that a fault was felt, not slept through.
func faultLogSummary(p *proc) string {
	msg := regexp.MustCompile(`"level":"(WARN|ERROR)","msg":"([^"]*)"`)
	counts := map[string]int{}
	for _, line := range strings.Split(p.output(), "\n") {
		if m := msg.FindStringSubmatch(line); m != nil {
			counts[m[1]+" "+m[2]]++
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
	})
	if len(keys) > 4 {
		keys = keys[:4]
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%dx %s", counts[k], k)
	}
	return fmt.Sprintf("%s logged (most frequent): %s", p.name, strings.Join(parts, "; "))
}

// faultOnlyCompleted is the expectation when the downstream is healthy:
// every request reaches it, so every operation completes.
func faultOnlyCompleted(_ faultOp, rec events.Operation) (bool, string) {
	return rec.Status == events.StatusCompleted, "want completed"
}

func faultCompletedCount(ctx context.Context, st *store.Store, ops []faultOp) int {
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.key
	}
	got, err := st.LoadMany(ctx, keys)
	if err != nil {
		return 0
	}
	n := 0
	for _, op := range got {
		if op.Status == events.StatusCompleted {
			n++
		}
	}
	return n
}

// faultReload loads the records again after the grace period, keeping the old
// ones if the store cannot be read.
func faultReload(ctx context.Context, t *testing.T, st *store.Store, ops []faultOp, old map[string]events.Operation) map[string]events.Operation {
	t.Helper()
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.key
	}
	for range 20 {
		got, err := st.LoadMany(ctx, keys)
		if err == nil {
			return got
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Errorf("reloading the records failed; judging the last ones seen")
	return old
}

// TestFaultPostgresRestart simulates a PostgreSQL restart for this test's
// database: every backend of the database is terminated, several times,
// and once new connections are refused for 3s before being allowed again.
//
// The server itself is not restarted: it is shared with every other test
// binary of the module (go test ./... runs packages in parallel, each with
// databases of its own), and restarting it would fail their tests. To the
// application a restart is exactly this: every connection dies at once
// (SQLSTATE 57P01, admin_shutdown), then connecting fails until the server
// is back; terminating the backends of one database, and refusing
// connections to it with ALLOW_CONNECTIONS false, reproduce both for this
// test alone.
func TestFaultPostgresRestart(t *testing.T) {
	t.Parallel()
	// Every call takes 150ms, so the outage finds calls in flight whose
	// outcomes must wait for the database, and leases (2s) that cannot be
	// renewed while it is down.
	w := newFaultWorld(t, faultWorldOptions{fakeOpts: []testenv.FakeOption{
		testenv.WithDefaultFault(testenv.FaultStall(150*time.Millisecond), testenv.RouteInvoke)}})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	f := &faultFigures{test: "PostgreSQL restart (every backend of the database terminated 10 times in 4s, then refused 3s, then 2 more; calls take 150ms)"}
	db := faultDatabaseName(t, w.db)
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	allow := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(context.WithoutCancel(ctx), fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t",
			pgx.Identifier{db}.Sanitize(), on)); err != nil {
			t.Errorf("ALLOW_CONNECTIONS %t: %v", on, err)
		}
	}
	// Registered after NewDatabase, so it runs before the drop.
	t.Cleanup(func() { allow(true) })
	terminated := 0
	terminate := func() {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()) AS killed`, db).Scan(&n); err != nil {
			t.Errorf("terminating backends: %v", err)
		}
		terminated += n
	}

	p := faultStartPipeline(t, w, "effectline")
	ops := faultOps("postgres", faultScaled(45))
	fed := faultFeed(ctx, pool, ops, 120*time.Millisecond)

	waitFor(t, ctx, "some operations to complete", func() bool { return faultCompletedCount(ctx, st, ops) >= 5 })
	first := time.Now()
	for range 10 {
		terminate()
		time.Sleep(400 * time.Millisecond)
	}
	// The restart proper: refuse, kill what is connected, stay down 3s.
	allow(false)
	terminate()
	time.Sleep(3 * time.Second)
	allow(true)
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		terminate()
	}
	f.note("%d backends terminated over %s, connections refused for 3s", terminated, time.Since(first).Round(100*time.Millisecond))
	faultFed(t, fed)
	faultSettleAndJudge(ctx, t, f, w, pool, ops, p, first, "the first termination")
}

// faultSettleAndJudge waits for every operation of a database fault test to
// settle, judges the run (every operation completed), reports the figures
// and stops the binary, which must have lived through the fault.
func faultSettleAndJudge(ctx context.Context, t *testing.T, f *faultFigures, w *world, pool *pgxpool.Pool, ops []faultOp,
	p *proc, since time.Time, sinceWhat string) {
	t.Helper()
	st := store.New(pool)
	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	recs := faultWaitSettled(sctx, st, ops)
	f.note("every operation settled %s after %s", time.Since(since).Round(100*time.Millisecond), sinceWhat)
	time.Sleep(time.Second)
	recs = faultReload(ctx, t, st, ops, recs)
	faultJudge(ctx, t, f, w, pool, ops, recs, faultOnlyCompleted)
	f.note("%s", faultLogSummary(p))
	f.report(t)
	select {
	case <-p.done:
		t.Errorf("effectline exited during the database fault: %v", p.err)
	default:
		if err := p.stop(15 * time.Second); err != nil {
			t.Errorf("graceful stop: %v", err)
		}
	}
}

// TestFaultPostgresCrash crashes a PostgreSQL server of the test's own
// mid-run (an immediate shutdown: every backend killed, nothing written on
// the way out, crash recovery on the next start) and starts it again after
// 2s, then crashes it once more and starts it at once, as a supervisor
// would (in the long form, once per 15 operations, alternately). Unlike TestFaultPostgresRestart, this loses what was committed
// asynchronously but not yet on disk: the relay's deletes (so events are
// published again) and the projector's last rows (so they must be
// projected again). The WAL writer waits 10s between flushes, so such a
// tail is there to lose.
func TestFaultPostgresCrash(t *testing.T) {
	t.Parallel()
	srv := testenv.NewPostgresServer(t, "wal_writer_delay=10s")
	w := newFaultWorld(t, faultWorldOptions{db: srv.NewDatabase(t, "effectline"), fakeOpts: []testenv.FakeOption{
		testenv.WithDefaultFault(testenv.FaultStall(150*time.Millisecond), testenv.RouteInvoke)}})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	f := &faultFigures{test: "PostgreSQL crashes (immediate shutdown mid-run, down 2s, crash recovery; again, restarted at once; calls take 150ms)"}

	p := faultStartPipeline(t, w, "effectline")
	ops := faultOps("crash", faultScaled(45))
	fed := faultFeed(ctx, pool, ops, 120*time.Millisecond)
	var crashed time.Time
	for i := range len(ops)/15 - 1 {
		after, down := 10+15*i, 2*time.Second
		if i%2 == 1 {
			down = 0
		}
		waitFor(t, ctx, fmt.Sprintf("%d operations to complete", after), func() bool { return faultCompletedCount(ctx, st, ops) >= after })
		crashed = time.Now()
		srv.Crash(t)
		time.Sleep(down)
		srv.Start(t)
		pool.Reset() // the test's own connections died with the server
		f.note("crashed after %d of %d operations completed; down %s", faultCompletedCount(ctx, st, ops), len(ops), time.Since(crashed).Round(100*time.Millisecond))
	}
	faultFed(t, fed)
	faultSettleAndJudge(ctx, t, f, w, pool, ops, p, crashed, "the last crash")
}

func faultDatabaseName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// faultPhase is one class's share of a phased feed: the faults scripted on the
// invoke route just before its operations are appended.
type faultPhase struct {
	class  events.EffectClass
	faults []testenv.Fault
}

// faultFeedPhased appends ops one class at a time, so each class meets its own
// scripted faults: the invoke script is consumed in arrival order, and a
// phase waits for the first attempt of each of its operations before the
// next phase scripts its faults. Order the phases irreversible first and
// idempotent last: a retry (which would take a fault meant for a later
// class) never comes from an irreversible operation, and comes from the
// others only after their fault played out. The suite reads which
// operation met which fault from the downstream's log, not from the plan.
func faultFeedPhased(ctx context.Context, t *testing.T, w *world, pool *pgxpool.Pool, ops []faultOp, phases []faultPhase) {
	t.Helper()
	invokesOf := func(ops []faultOp) int {
		n := 0
		for _, r := range w.fake.RequestLog() {
			for _, op := range ops {
				if r.Route == testenv.RouteInvoke && faultOfOperation(r.IdempotencyKey, op.key) {
					n++
					break
				}
			}
		}
		return n
	}
	for _, ph := range phases {
		var mine []faultOp
		for _, op := range ops {
			if op.class == ph.class {
				mine = append(mine, op)
			}
		}
		w.fake.Script(testenv.RouteInvoke, ph.faults...)
		faultFed(t, faultFeed(ctx, pool, mine, 0))
		waitFor(t, ctx, "the first attempts of the "+string(ph.class)+" operations", func() bool { return invokesOf(mine) >= len(mine) })
	}
}

// TestFaultDownstreamStalls makes the downstream stall past the tool's 3s
// timeout for some requests of every class (one stalls until the client
// gives up) and under it for one. Each class must end its own way: the
// idempotent effect retried under the same key, the compensable one undone
// and retried under a new key, the irreversible one reconciled (the stalled
// request did nothing, so it is escalated, never re-sent).
func TestFaultDownstreamStalls(t *testing.T) {
	t.Parallel()
	w := newFaultWorld(t, faultWorldOptions{})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := untilCtx(t, 3*time.Minute)
	f := &faultFigures{test: "downstream stalls (stall 5s > 3s timeout on 3 requests per class, one stall-forever, one 1s stall)"}

	p := faultStartPipeline(t, w, "effectline")
	all := faultOps("stall", 36)
	long := testenv.FaultStall(5 * time.Second)
	faultFeedPhased(ctx, t, w, pool, all, []faultPhase{
		{events.Irreversible, []testenv.Fault{long, testenv.FaultNone, long, testenv.FaultNone, long}},
		{events.Compensable, []testenv.Fault{long, testenv.FaultStall(time.Second), long, testenv.FaultNone, long}},
		{events.Idempotent, []testenv.Fault{long, testenv.FaultNone, testenv.FaultStallForever, testenv.FaultNone, long}},
	})

	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	recs := faultWaitSettled(sctx, st, all)
	time.Sleep(time.Second)
	recs = faultReload(ctx, t, st, all, recs)

	// Which operations a stall past the timeout hit, from the downstream's
	// own log.
	stalled := map[string]string{}
	reconciles := map[string]int{}
	invokes := map[string]int{}
	for _, r := range w.fake.RequestLog() {
		for _, op := range all {
			if !faultOfOperation(r.IdempotencyKey, op.key) {
				continue
			}
			switch r.Route {
			case testenv.RouteInvoke:
				invokes[op.key]++
				if s := r.Fault.String(); s == long.String() || s == testenv.FaultStallForever.String() {
					stalled[op.key] = s
				}
			case testenv.RouteReconcile:
				reconciles[op.key]++
			}
		}
	}
	perClass := map[events.EffectClass]int{}
	for _, op := range all {
		if _, hit := stalled[op.key]; hit {
			perClass[op.class]++
		}
	}
	expect := func(op faultOp, rec events.Operation) (bool, string) {
		if _, hit := stalled[op.key]; !hit {
			return rec.Status == events.StatusCompleted && invokes[op.key] == 1 && rec.Compensations == 0,
				"want completed in one attempt"
		}
		switch op.class {
		case events.Idempotent:
			return rec.Status == events.StatusCompleted && invokes[op.key] >= 2 && rec.Compensations == 0,
				"want completed after a retry under the same key"
		case events.Compensable:
			return rec.Status == events.StatusCompleted && rec.Compensations >= 1 &&
					rec.DownstreamKey == events.DownstreamKeyFor(op.key, rec.Compensations),
				"want completed after an undo and a retry under a new key"
		default:
			return rec.Status == events.StatusEscalated && reconciles[op.key] >= 1 &&
					rec.Escalation != nil && rec.Escalation.Reason == "absent_downstream",
				"want reconciled (absent) and escalated, not retried"
		}
	}
	faultJudge(ctx, t, f, w, pool, all, recs, expect)
	f.note("stalled past the timeout per class: %v; releases %d", perClass, w.fake.Releases())
	for _, c := range events.EffectClasses() {
		if perClass[c] == 0 {
			f.wrongState++
			t.Errorf("no %s operation met a stall: the test did not test it", c)
		}
	}
	if n := w.fake.Pending(testenv.RouteInvoke); n != 0 {
		t.Errorf("%d scripted stalls were never consumed", n)
	}
	f.report(t)
	if err := p.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// TestFaultTCPProxy puts a TCP proxy between effectline and each of its
// dependencies (PostgreSQL, the broker, the downstream tool), adds latency
// to every chunk, and cuts each dependency's connections several times
// mid-run; once the tool also refuses connections for a second.
func TestFaultTCPProxy(t *testing.T) {
	t.Parallel()
	fake := testenv.NewFakeTool(t)
	toolProxy := newFaultProxy(t, strings.TrimPrefix(fake.URL, "http://"))
	pgProxy := newFaultProxy(t, "")
	brokerProxy := newFaultProxy(t, "")
	advertised, err := net.ResolveTCPAddr("tcp", brokerProxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(func(network, address string) (net.Listener, error) {
		ln, err := faultListenLoopback(network, address)
		if err != nil {
			return nil, err
		}
		brokerProxy.setUpstream(ln.Addr().String())
		return faultAdvertisedListener{Listener: ln, addr: advertised}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)

	w := newFaultWorld(t, faultWorldOptions{
		brokers: []string{brokerProxy.Addr()},
		fake:    fake,
		toolURL: "http://" + toolProxy.Addr(),
		// A budget that outlasts this test's faults: with e2eTools' four
		// attempts 20 ms apart and doubling, the one-second refusal plus
		// a cut could spend all of them, and an operation escalated for
		// its spent budget is right but not what this test asks.
		tools: strings.ReplaceAll(e2eTools, "max_attempts: 4", "max_attempts: 10"),
		dbVia: func(direct string) string {
			u, err := url.Parse(direct)
			if err != nil {
				t.Fatal(err)
			}
			pgProxy.setUpstream(u.Host)
			u.Host = pgProxy.Addr()
			return u.String()
		},
	})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := untilCtx(t, 3*time.Minute)
	f := &faultFigures{test: "TCP proxy (5ms per chunk to PostgreSQL and the broker, 60ms to the tool; each cut 3 times, tool refused 1s)"}
	proxies := []struct {
		name string
		p    *faultProxy
	}{{"postgres", pgProxy}, {"broker", brokerProxy}, {"tool", toolProxy}}
	for _, x := range proxies {
		x.p.setLatency(5 * time.Millisecond)
	}
	// Tool calls take a fresh connection each and last milliseconds; with
	// more latency there a cut can find one mid-request or mid-response.
	toolProxy.setLatency(60 * time.Millisecond)

	p := faultStartPipeline(t, w, "effectline")
	ops := faultOps("proxy", 36)
	fed := faultFeed(ctx, pool, ops, 150*time.Millisecond)
	waitFor(t, ctx, "some operations to complete", func() bool { return faultCompletedCount(ctx, st, ops) >= 3 })
	cuts := map[string]int{}
	for round := range 3 {
		for _, x := range proxies {
			cuts[x.name] += x.p.cutWhenActive(2 * time.Second)
			time.Sleep(400 * time.Millisecond)
		}
		if round == 1 {
			toolProxy.refuse(time.Second)
		}
	}
	faultFed(t, fed)
	f.note("connections cut: %v", cuts)

	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	recs := faultWaitSettled(sctx, st, ops)
	time.Sleep(time.Second)
	recs = faultReload(ctx, t, st, ops, recs)
	faultJudge(ctx, t, f, w, pool, ops, recs, nil)
	f.note("%s", faultLogSummary(p))
	f.report(t)
	if err := p.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// faultIntentsProducer is a sarama producer with effectline's own client
// configuration, so a message lands in the partition the relay would use.
func faultIntentsProducer(t *testing.T, brokers []string) (sarama.SyncProducer, kafka.Config) {
	t.Helper()
	cfg := kafka.Config{Brokers: brokers, Partitions: 3}.WithDefaults()
	sc := cfg.Sarama()
	sc.ClientID = "fault-test"
	pr, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	return pr, cfg
}

// faultProduceIntent publishes raw, an encoded intent.recorded envelope of key,
// to the intents topic as a non-Go producer would.
func faultProduceIntent(t *testing.T, pr sarama.SyncProducer, cfg kafka.Config, env events.Envelope, raw []byte) {
	t.Helper()
	msg := kafka.ProducerMessage(kafka.EventRecord(context.Background(), cfg.Topic(events.TopicIntents), env, raw))
	if _, _, err := pr.SendMessage(msg); err != nil {
		t.Fatalf("producing the intent of %s: %v", env.OperationKey, err)
	}
}

// faultStoredIntent returns the intent.recorded envelope of key as journaled.
func faultStoredIntent(ctx context.Context, t *testing.T, pool *pgxpool.Pool, key string) (events.Envelope, []byte) {
	t.Helper()
	var stored []byte
	if err := pool.QueryRow(ctx, `SELECT envelope FROM events WHERE operation_key = $1 AND seq = 1`, key).Scan(&stored); err != nil {
		t.Fatalf("loading the intent of %s: %v", key, err)
	}
	raw, err := packed.Unpack(stored, key)
	if err != nil {
		t.Fatal(err)
	}
	env, err := events.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	return env, raw
}

// faultDirectIntent builds the envelope a non-Go service produces straight to
// effectline.intents: intent.recorded with seq 1.
func faultDirectIntent(t *testing.T, op faultOp, i int) (events.Envelope, []byte) {
	t.Helper()
	in := op.intent(i)
	env, err := events.New(events.IntentRecorded, op.key, 1, op.tool, op.class, 0,
		events.IntentData{Args: in.Args, Principal: in.Principal}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := events.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	return env, raw
}

// TestFaultEveryIntentDeliveredTwice delivers every intent message twice:
// each intent the relay publishes is produced once more, some at once (the
// copies race) and some after the operation completed, and intents
// produced straight to Kafka (never in the store) are produced twice. Each
// operation must take effect once.
func TestFaultEveryIntentDeliveredTwice(t *testing.T) {
	t.Parallel()
	w := newFaultWorld(t, faultWorldOptions{})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	f := &faultFigures{test: "every intent delivered twice (outbox intents re-produced, direct intents produced twice)"}
	pr, cfg := faultIntentsProducer(t, w.broker.Addrs)

	p := faultStartPipeline(t, w, "effectline")
	viaOutbox := faultOps("twice/outbox", faultScaled(30))
	direct := faultOps("twice/direct", faultScaled(12))
	faultFed(t, faultFeed(ctx, pool, viaOutbox, 0))
	produced := 0
	for i, op := range viaOutbox {
		if i%2 == 0 { // at once: races the relay's copy
			env, raw := faultStoredIntent(ctx, t, pool, op.key)
			faultProduceIntent(t, pr, cfg, env, raw)
			produced++
		}
	}
	for i, op := range direct {
		env, raw := faultDirectIntent(t, op, i)
		faultProduceIntent(t, pr, cfg, env, raw)
		faultProduceIntent(t, pr, cfg, env, raw)
		produced += 2
	}
	all := append(append([]faultOp(nil), viaOutbox...), direct...)
	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	faultWaitSettled(sctx, st, all)
	// The other half after completion: a redelivery long after the fact.
	for i, op := range viaOutbox {
		if i%2 == 1 {
			env, raw := faultStoredIntent(ctx, t, pool, op.key)
			faultProduceIntent(t, pr, cfg, env, raw)
			produced++
		}
	}
	faultWaitGroupCaughtUp(ctx, t, cfg, "effectline-executor", cfg.Topic(events.TopicIntents))
	time.Sleep(time.Second)
	recs := faultReload(ctx, t, st, all, nil)
	faultJudge(ctx, t, f, w, pool, all, recs, faultOnlyCompleted)
	f.note("%d operations via the outbox, %d produced directly; %d extra copies produced", len(viaOutbox), len(direct), produced-len(direct))
	// Every copy of a key must sit in the partition the relay used, or
	// per-key order (and so the dedup above) would rest on luck.
	// The relay also publishes the intents the executor journaled for the
	// direct messages (the store's outbox sends every intent.recorded to the
	// intents topic): a third, harmless copy of each.
	copies := w.broker.ReadAll(t, cfg.Topic(events.TopicIntents), len(viaOutbox)+produced+len(direct), 30*time.Second)
	partsOf := map[string]map[int32]int{}
	for _, r := range copies {
		if partsOf[string(r.Key)] == nil {
			partsOf[string(r.Key)] = map[int32]int{}
		}
		partsOf[string(r.Key)][r.Partition]++
	}
	split := 0
	for _, op := range all {
		n := 0
		for _, c := range partsOf[op.key] {
			n += c
		}
		if len(partsOf[op.key]) != 1 || n < 2 {
			split++
			t.Errorf("%s: copies per partition %v, want at least 2, all in one partition", op.key, partsOf[op.key])
		}
	}
	f.wrongState += split
	f.note("intents topic holds %d messages (%d from the relay); keys whose copies all share a partition: %d of %d",
		len(copies), len(copies)-produced, len(all)-split, len(all))
	for _, op := range all {
		if rec := recs[op.key]; rec.Evidence != 0 || rec.Attempt != 1 {
			f.wrongState++
			t.Errorf("%s: attempt %d, %d evidence events: a copy was treated as a new intent", op.key, rec.Attempt, rec.Evidence)
		}
	}
	f.report(t)
	if err := p.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// faultWaitGroupCaughtUp waits until consumer group has committed offsets at the
// end of every partition of topic.
func faultWaitGroupCaughtUp(ctx context.Context, t *testing.T, cfg kafka.Config, group, topic string) {
	t.Helper()
	client, err := sarama.NewClient(cfg.Brokers, cfg.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	var lag map[int32]int64
	ok := waitForSoft(ctx, func() bool {
		parts, err := client.Partitions(topic)
		if err != nil {
			return false
		}
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			return false
		}
		lag = map[int32]int64{}
		for _, part := range parts {
			end, err := client.GetOffset(topic, part, sarama.OffsetNewest)
			if err != nil {
				return false
			}
			committed := int64(0)
			if b := resp.GetBlock(topic, part); b != nil && b.Offset > 0 {
				committed = b.Offset
			}
			if committed < end {
				lag[part] = end - committed
			}
		}
		return len(lag) == 0
	})
	if !ok {
		t.Fatalf("group %s did not catch up on %s: lag %v", group, topic, lag)
	}
}

// TestFaultReplayIntentsFromOffsetZero runs a batch to completion (with lost
// responses on the way, so the topics hold unknowns, undos and
// reconciliations), stops the binary, deletes the consumer groups of the
// executor, the projector and the reconciler, and starts it again: every
// topic is replayed from offset 0. Nothing may happen: no request to the
// downstream that changes anything, no event appended, no read-model row
// rewritten to another state.
func TestFaultReplayIntentsFromOffsetZero(t *testing.T) {
	t.Parallel()
	w := newFaultWorld(t, faultWorldOptions{})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	f := &faultFigures{test: "replay from offset 0 (consumer groups deleted after a completed run, binary restarted)"}
	ops := faultOps("replay", faultScaled(30))
	first := faultStartPipeline(t, w, "effectline (first run)")
	lose := []testenv.Fault{testenv.FaultLoseResponse, testenv.FaultNone, testenv.FaultLoseResponse}
	faultFeedPhased(ctx, t, w, pool, ops, []faultPhase{{events.Irreversible, lose}, {events.Compensable, lose}, {events.Idempotent, lose}})
	sctx, cancel := context.WithTimeout(ctx, faultSettleTimeout)
	defer cancel()
	faultWaitSettled(sctx, st, ops)
	if lag := faultReadModelLag(ctx, t, pool, ops); lag != 0 {
		t.Fatalf("the read model did not converge before the replay")
	}
	cfg := kafka.Config{Brokers: w.broker.Addrs, Partitions: 3}.WithDefaults()
	faultWaitGroupCaughtUp(ctx, t, cfg, "effectline-executor", cfg.Topic(events.TopicIntents))
	if err := first.stop(15 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	before := faultTakeSnapshot(ctx, t, w, pool)

	admin, err := sarama.NewClusterAdmin(cfg.Brokers, cfg.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	groups := []string{"effectline-executor", "effectline-projector", "effectline-reconciler"}
	for _, g := range groups {
		if err := admin.DeleteConsumerGroup(g); err != nil {
			t.Fatalf("deleting consumer group %s: %v", g, err)
		}
	}
	listed, err := admin.ListConsumerGroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if _, ok := listed[g]; ok {
			t.Fatalf("consumer group %s still exists after deletion", g)
		}
	}

	second := faultStartPipeline(t, w, "effectline (replaying)")
	faultWaitGroupCaughtUp(ctx, t, cfg, "effectline-executor", cfg.Topic(events.TopicIntents))
	faultWaitGroupCaughtUp(ctx, t, cfg, "effectline-projector", cfg.Topic(events.TopicOutcomes))
	faultWaitGroupCaughtUp(ctx, t, cfg, "effectline-reconciler", cfg.Topic(events.TopicOutcomes))
	time.Sleep(2 * time.Second) // the executor's dispatched advances, the poller, a sweep
	after := faultTakeSnapshot(ctx, t, w, pool)

	recs := faultReload(ctx, t, st, ops, nil)
	faultJudge(ctx, t, f, w, pool, ops, recs, faultOnlyCompleted)
	changed := 0
	for key, b := range before.ops {
		if a := after.ops[key]; a != b {
			changed++
			t.Errorf("%s changed by the replay: %s -> %s", key, b, a)
		}
	}
	f.wrongState += changed
	if after.events != before.events {
		f.wrongState++
		t.Errorf("the replay appended %d events", after.events-before.events)
	}
	if d := after.changing - before.changing; d != 0 {
		f.duplicates += d
		t.Errorf("the replay sent %d invoke or compensate requests downstream", d)
	}
	f.note("replayed %d intent and %d outcome messages; seq, status and read-model row of %d operations unchanged: %t; events %d -> %d; downstream invokes+releases %d -> %d, reconcile queries %d -> %d",
		before.intents, before.outcomes, len(before.ops), changed == 0, before.events, after.events,
		before.changing, after.changing, before.queries, after.queries)
	f.report(t)
	if err := second.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// faultSnapshot is what a replay must leave unchanged.
type faultSnapshot struct {
	// ops maps each operation to its seq, status and read-model row.
	ops               map[string]string
	events            int
	changing, queries int
	intents, outcomes int64
}

func faultTakeSnapshot(ctx context.Context, t *testing.T, w *world, pool *pgxpool.Pool) faultSnapshot {
	t.Helper()
	s := faultSnapshot{ops: map[string]string{}}
	rows, err := pool.Query(ctx, `SELECT o.operation_key, o.seq, o.status, s.last_seq, s.status, coalesce(octet_length(s.body), octet_length(s.record::text)), s.projected_at
		FROM operations o JOIN operation_state s USING (operation_key)`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, status, rmStatus string
		var seq, rmSeq, recordBytes int64
		var projected time.Time
		if err := rows.Scan(&key, &seq, &status, &rmSeq, &rmStatus, &recordBytes, &projected); err != nil {
			t.Fatal(err)
		}
		s.ops[key] = fmt.Sprintf("seq %d %s, read model seq %d %s (%d bytes, projected %s)",
			seq, status, rmSeq, rmStatus, recordBytes, projected.Format(time.RFC3339Nano))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&s.events); err != nil {
		t.Fatal(err)
	}
	s.changing = w.fake.Requests(testenv.RouteInvoke) + w.fake.Requests(testenv.RouteCompensate)
	s.queries = w.fake.Requests(testenv.RouteReconcile)
	cfg := kafka.Config{Brokers: w.broker.Addrs}.WithDefaults()
	s.intents = faultTopicSize(t, cfg, cfg.Topic(events.TopicIntents))
	s.outcomes = faultTopicSize(t, cfg, cfg.Topic(events.TopicOutcomes))
	return s
}

func faultTopicSize(t *testing.T, cfg kafka.Config, topic string) int64 {
	t.Helper()
	client, err := sarama.NewClient(cfg.Brokers, cfg.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		n += end
	}
	return n
}
