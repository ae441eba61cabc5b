package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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

	"github.com/jackc/pgx/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
)

// fanOuts are the statements on the co-located tables that name no
// operation key, each with the reason it may; docs/design.md, "Beyond one
// primary", names every one. Keep the two in step: a new statement that
// names no key is made to name one, or added to both with a reason as good
// as these.
var fanOuts = []fanOut{
	// The relay (store/outbox.go, store/rotate.go): one relay loop per
	// shard, on that shard's outbox.
	{fragment: "WITH claim AS MATERIALIZED", reason: "the relay's claim of the oldest rows, FOR UPDATE SKIP LOCKED"},
	{fragment: "SELECT count(*), min(created_at) FROM outbox", reason: "the relay's backlog gauge, over an outbox that holds only the backlog"},
	{fragment: "SELECT EXISTS (SELECT 1 FROM outbox_", reason: "the rotator's check that a partition is drained, before and under its lock"},
	{fragment: "LOCK TABLE outbox_", reason: "the rotator's lock of a drained partition"},
	{fragment: "TRUNCATE outbox_", reason: "the rotator's TRUNCATE of a drained partition"},
	{fragment: "UPDATE outbox_slot SET", reason: "the rotation's update of the one-row reference table outbox_slot"},
	// The pollers (store/due.go): plain reads whose ORDER BY … LIMIT Citus
	// pushes to every shard; each step they find is then taken by key.
	{fragment: "WHERE due_at <= $1 ORDER BY due_at LIMIT $2", reason: "the executor's due-time poller"},
	{fragment: "WHERE status = 'in_progress' AND lease_until < $1 ORDER BY lease_until LIMIT $2", reason: "the reconciler's expired-lease sweep"},
	{fragment: "WHERE status = 'needs_reconciliation' AND updated_at <= $1 ORDER BY updated_at LIMIT $2", reason: "the reconciler's unresolved poller"},
	// Retention (store/prune.go): per shard, like the relay.
	{fragment: "WITH RECURSIVE t(tool)", reason: "the pruner's list of the tools with settled operations"},
	{fragment: "SELECT o.operation_key, o.updated_at FROM operations o", reason: "the pruner's page of a tool's oldest settled operations, " +
		"a plain read by (tool, updated_at) after a cursor; the page is then locked and pruned by key"},
	{fragment: "WHERE pruned_at < $1 ORDER BY pruned_at", reason: "the tombstone expiry, FOR UPDATE SKIP LOCKED"},
	// The read model (projector/reader.go, projector/rebuild.go).
	{fragment: "DESC, operation_key DESC LIMIT", reason: "the list of operations: a multi-shard keyset read the coordinator merges"},
	{fragment: "LOCK TABLE operation_state IN EXCLUSIVE MODE", reason: "the rebuild's lock of the read model"},
	{fragment: "DELETE FROM operation_state", whole: true, reason: "the rebuild's clearing of the read model"},
	{fragment: "WHERE (operation_key, seq) > ($1, $2)", reason: "the rebuild's read of the whole journal, page by page"},
	// Lookups that cannot name a key.
	{fragment: "WHERE tool = $1 AND (downstream_id = $2 OR record->>'downstream_id' = $2)", reason: "a webhook that names only the tool's id for the effect: " +
		"found on the secondary index of every shard, then locked key by key (store/lock.go)"},
	{fragment: "FROM workflows w CROSS JOIN LATERAL", reason: "the workflow driver's sweep: waiting runs joined to their awaited operations, " +
		"which hash apart from the runs; to become two statements (docs/design.md)"},
}

// fanOut is an allowed fan-out statement.
type fanOut struct {
	// fragment is part of the statement, its white space collapsed; with
	// whole, the statement itself.
	fragment string
	whole    bool
	reason   string
}

// matches reports whether f names sql.
func (f fanOut) matches(sql string) bool {
	if f.whole {
		return collapse(sql) == f.fragment
	}
	return strings.Contains(collapse(sql), f.fragment)
}

// collapse turns every run of white space in s into one space.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// coLocated are the tables distributed on operation_key in one colocation
// group, the outbox's partitions with their parent.
var coLocated = map[string]bool{"operations": true, "events": true, "outbox": true, "operation_state": true}

// referenceTables are replicated to every node: reading them is local
// anywhere, writing them is a fan-out.
var referenceTables = map[string]bool{"outbox_slot": true}

// mentionsTables finds the statements to check by their text: those that
// name one of the tables (or an outbox partition) as a word.
var mentionsTables = regexp.MustCompile(`\b(operations|events|outbox|outbox_[0-9]+|operation_state|outbox_slot)\b`)

// TestStatementsAreDistributable is the proof that the schema stays
// distributable on Citus, co-located on operation_key (docs/design.md,
// "Beyond one primary"): every statement the process runs on operations,
// events, outbox and operation_state names one operation key or a set of
// them, except the fan-outs listed above.
//
// The statements are the ones run, not the ones written: a tracer on the
// process's pool records the text of every statement while one process
// runs every component through submits, successes, failures, retries,
// unknown outcomes reconciled, compensation, approvals and decisions,
// webhooks, waits, leases renewed and expired, workflows and their
// unwinding, outbox rotations, pruning and tombstones, agents' appends, the
// read model's reads and its rebuild. Each distinct statement is then
// judged by its generic plan on a freshly migrated database, planned with
// sequential scans disabled so the question is which access the statement
// allows rather than what suits an empty table: every read of those tables
// must carry an equality on operation_key to a parameter (= $n, = ANY($n)),
// to the key of a co-located row, or to a value unnested from parameters;
// every insert must take its key from one of those; and no statement may
// write the reference table or read a table of another colocation group.
//
// It fails on a statement that breaks this and is not on fanOuts, and on
// an entry of fanOuts that matches no statement run (or only statements
// that name a key): a list that is not exercised proves nothing.
func TestStatementsAreDistributable(t *testing.T) {
	t.Parallel()
	began := time.Now()
	w := newDistWorld(t)
	w.exercise()
	ran := time.Since(began)

	judge := newPlanJudge(t)
	used := make([]bool, len(fanOuts))
	var keyed, fanned int
	for _, sql := range w.log.statements() {
		if !mentionsTables.MatchString(sql) {
			continue
		}
		problems := judge.problems(sql)
		match := -1
		for i, f := range fanOuts {
			if f.matches(sql) {
				if match >= 0 {
					t.Errorf("fanOuts entries %q and %q both match a statement: make them tell it apart\n%s", fanOuts[match].fragment, f.fragment, sql)
				}
				match = i
			}
		}
		switch {
		case len(problems) == 0 && match < 0:
			keyed++
		case len(problems) == 0:
			t.Errorf("fanOuts entry %q matches a statement that names its keys: drop the entry (and its line in docs/design.md)\n%s",
				fanOuts[match].fragment, sql)
		case match < 0:
			t.Errorf("a statement names no operation key, and is not an allowed fan-out (fanOuts, docs/design.md \"Beyond one primary\"):\n%s\n%s",
				sql, strings.Join(problems, "\n"))
		default:
			used[match] = true
			fanned++
		}
	}
	for i, f := range fanOuts {
		if !used[i] {
			t.Errorf("fanOuts entry %q (%s) matches no fan-out statement the pipeline ran: exercise it, or drop it", f.fragment, f.reason)
		}
	}
	t.Logf("%d statements name their keys (or read only outbox_slot), %d are allowed fan-outs; the pipeline ran for %v",
		keyed, fanned, ran.Round(time.Millisecond))
}

// statementLog is a pgx tracer that records the text of every statement
// run on the connections it is set on, those of batches included.
type statementLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[sql] = true
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// statements returns the distinct statements seen so far, sorted.
func (l *statementLog) statements() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.seen))
	for s := range l.seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// has reports whether a statement containing fragment (white space
// collapsed) was seen.
func (l *statementLog) has(fragment string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.seen {
		if strings.Contains(collapse(s), fragment) {
			return true
		}
	}
	return false
}

// distTools gives each scripted path a fake downstream of its own
// (OK/RETRY/… are replaced by the fakes' URLs), so the paths run side by
// side without taking each other's scripted faults.
const distTools = `tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "OK/effects/cache", timeout: 3s}
    reconcile: {method: GET, url: "OK/effects?idempotency_key={{.Key}}", timeout: 2s}
    signing_secret_env: DIST_SIGNING_SECRET
  - name: approved.set
    effect: idempotent
    invoke: {method: POST, url: "OK/effects/approved", timeout: 3s}
    approval: {not_requester: false}
  - name: retry.set
    effect: idempotent
    invoke: {method: POST, url: "RETRY/effects/retry", timeout: 3s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 100ms, deadline: 30s}
  - name: fail.set
    effect: idempotent
    invoke: {method: POST, url: "FAIL/effects/fail", timeout: 3s}
  - name: pay.charge
    effect: irreversible
    invoke: {method: POST, url: "UNKNOWN/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "UNKNOWN/effects?idempotency_key={{.Key}}", timeout: 2s}
  - name: inv.reserve
    effect: compensable
    invoke: {method: POST, url: "COMP/effects/reservations", timeout: 3s}
    compensate: {method: POST, url: "COMP/effects/release", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 100ms, deadline: 30s}
  - name: esc.charge
    effect: irreversible
    invoke: {method: POST, url: "ESC/effects/charges", timeout: 3s}
  - name: slow.set
    effect: idempotent
    invoke: {method: POST, url: "SLOW/effects/slow", timeout: 10s}
  - name: lease.set
    effect: idempotent
    invoke: {method: POST, url: "LEASE/effects/lease", timeout: 10s}
    reconcile: {method: GET, url: "LEASE/effects?idempotency_key={{.Key}}", timeout: 2s}
  - name: wf.reserve
    effect: compensable
    invoke: {method: POST, url: "WF/effects/reservations", timeout: 3s}
    compensate: {method: POST, url: "WF/effects/release", timeout: 2s}
  - name: wf.charge
    effect: irreversible
    invoke: {method: POST, url: "WF/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "WF/effects?idempotency_key={{.Key}}", timeout: 2s}
workflows:
  - name: trip
    input_schema: {type: object}
    steps:
      - name: reserve
        tool: wf.reserve
        args: {sku: "{{.Input.sku}}"}
      - name: charge
        tool: wf.charge
        args: {amount: 5, reservation: "{{.Steps.reserve.DownstreamID}}"}
`

const distSecret = "whsec_c2VjcmV0LW9mLXRoZS1kaXN0cmlidXRhYmxlLXRlc3Q="

// distWorld is one process running every component on a traced pool,
// with a fake downstream per scripted path.
type distWorld struct {
	t     *testing.T
	ctx   context.Context
	app   *App
	log   *statementLog
	db    string
	base  string
	fakes map[string]*testenv.FakeTool
}

func newDistWorld(t *testing.T) *distWorld {
	t.Helper()
	w := &distWorld{t: t, log: &statementLog{}, db: storedb.New(t), fakes: map[string]*testenv.FakeTool{}}
	yaml := distTools
	for _, name := range []string{"OK", "RETRY", "FAIL", "UNKNOWN", "COMP", "ESC", "SLOW", "LEASE", "WF"} {
		w.fakes[name] = testenv.NewFakeTool(t)
		yaml = strings.ReplaceAll(yaml, `"`+name+`/`, `"`+w.fakes[name].URL+`/`)
	}
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	broker := testenv.NewBroker(t)
	ctx, cancel := context.WithCancel(context.Background())
	a, err := Open(ctx, Options{
		Config: Config{DatabaseURL: w.db, KafkaBrokers: broker.Addrs, HTTPAddr: "127.0.0.1:0",
			Partitions: 3, Replication: 1, LogLevel: "error", ToolsFile: tools,
			// A lease renewed every 500ms, so a call of 800ms renews it.
			Lease: 1500 * time.Millisecond, SweepInterval: 100 * time.Millisecond, ShutdownGrace: time.Second,
			Retention: time.Hour, PruneInterval: 100 * time.Millisecond},
		Stdout: discard{},
		Getenv: func(k string) string {
			if k == "DIST_SIGNING_SECRET" {
				return distSecret
			}
			return ""
		},
		Components: Components, Open: true, tracer: w.log,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	w.app, w.base = a, "http://"+a.APIAddr()
	var stop context.CancelFunc
	w.ctx, stop = context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(stop)
	return w
}

// exercise runs every path the process has that runs statements.
func (w *distWorld) exercise() {
	t := w.t
	w.fakes["RETRY"].Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(http.StatusServiceUnavailable, ""))
	w.fakes["FAIL"].Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(http.StatusUnprocessableEntity, ""))
	w.fakes["UNKNOWN"].Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	w.fakes["COMP"].Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	w.fakes["ESC"].Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	w.fakes["SLOW"].Script(testenv.RouteInvoke, testenv.FaultStall(800*time.Millisecond))
	w.fakes["LEASE"].Script(testenv.RouteInvoke, testenv.FaultStall(3*time.Second))

	// A second projector, cold, catches up beside everything else.
	stopCold := w.coldProjector()

	// A submit that waits for its outcome, then every other path at once.
	if code, body := w.do("POST", "/v1/intents", map[string]any{"operation_key": "d/ok", "tool": "cache.set", "args": map[string]any{"k": "d/ok"}},
		"Prefer", "wait=5"); code != http.StatusOK {
		t.Fatalf("POST d/ok waiting: %d %v", code, body)
	}
	for key, tool := range map[string]string{"d/retry": "retry.set", "d/fail": "fail.set", "d/unknown": "pay.charge",
		"d/comp": "inv.reserve", "d/esc": "esc.charge", "d/approve": "approved.set", "d/slow": "slow.set", "d/lease": "lease.set"} {
		w.submit(key, tool)
	}
	w.startWorkflow("w-ok")

	// The lease of d/lease's stalled call ends early, as if its worker had
	// died: the sweep expires it.
	w.waitStatus("d/lease", events.StatusInProgress)
	w.expireLease("d/lease")

	// Decisions: an approval, and an abandon of an unknown charge.
	w.waitStatus("d/approve", events.StatusEscalated)
	w.decide("d/approve", "retry")
	w.waitStatus("d/esc", events.StatusEscalated)
	w.decide("d/esc", "abandon")

	// Webhooks of cache.set: by idempotency key, and by downstream id only.
	op := w.load("d/ok")
	w.webhook(map[string]any{"type": "effect.succeeded", "idempotency_key": "d/ok", "downstream_id": op.DownstreamID})
	w.webhook(map[string]any{"type": "effect.succeeded", "downstream_id": op.DownstreamID})

	// An agent service's appends in its own transaction: a new intent, then
	// the same one again (the retry of the agent's own step).
	w.agentAppend("d/agent")
	w.agentAppend("d/agent")

	for key, want := range map[string]events.Status{"d/retry": events.StatusCompleted, "d/fail": events.StatusFailed,
		"d/unknown": events.StatusCompleted, "d/comp": events.StatusCompleted, "d/esc": events.StatusFailed,
		"d/approve": events.StatusCompleted, "d/slow": events.StatusCompleted, "d/agent": events.StatusCompleted} {
		w.waitStatus(key, want)
	}
	w.waitWorkflow("w-ok", "completed")
	// A run whose charge fails: the reservation is undone.
	w.fakes["WF"].Script(testenv.RouteInvoke, testenv.FaultNone, testenv.FaultFailBeforeEffect(http.StatusUnprocessableEntity, ""))
	w.startWorkflow("w-unwind")
	w.waitWorkflow("w-unwind", "unwound")
	// The paths the outcomes alone do not show were taken.
	for what, ok := range map[string]bool{
		"d/retry retried":        w.fakes["RETRY"].Requests(testenv.RouteInvoke) >= 2,
		"d/unknown reconciled":   w.fakes["UNKNOWN"].Requests(testenv.RouteReconcile) >= 1,
		"d/comp compensated":     w.fakes["COMP"].Releases() >= 1,
		"w-unwind's step undone": w.fakes["WF"].Releases() >= 1,
		"d/slow's lease renewed": w.log.has("UPDATE operations SET lease_until = $3"),
	} {
		if !ok {
			t.Errorf("not exercised: %s", what)
		}
	}

	// The reads: of one operation (waiting, and its event stream), of the
	// list under each filter and past a page, of runs, of the approval
	// queue, of the metrics (the relay's backlog gauge).
	for _, path := range []string{"/v1/operations/" + url.PathEscape("d/ok"), "/v1/operations/" + url.PathEscape("d/ok") + "?wait=1s",
		"/v1/operations", "/v1/operations?status=completed", "/v1/operations?tool=cache.set", "/v1/operations?status=failed&tool=fail.set",
		"/v1/workflows/w-ok", "/v1/workflows", "/v1/workflows?status=unwound"} {
		if code, body := w.do("GET", path, nil); code != http.StatusOK {
			t.Errorf("GET %s: %d %v", path, code, body)
		}
	}
	if _, page := w.do("GET", "/v1/operations?limit=1", nil); page["next_cursor"] == nil {
		t.Errorf("GET /v1/operations?limit=1 has no next page: %v", page)
	} else if code, body := w.do("GET", "/v1/operations?limit=1&cursor="+url.QueryEscape(page["next_cursor"].(string)), nil); code != http.StatusOK {
		t.Errorf("GET the second page: %d %v", code, body)
	}
	w.get("/v1/operations/" + url.PathEscape("d/ok") + "/events")
	w.get("/ui/")
	w.get("/metrics")
	// The read model's readers that the API does not use: an agent's
	// (examples/gotool) and the load generator's.
	reader := projector.NewReader(w.app.Pool)
	if _, err := reader.Get(w.ctx, "d/ok"); err != nil {
		t.Errorf("reading d/ok from the read model: %v", err)
	}
	if _, err := reader.Settled(w.ctx, []string{"d/ok", "d/fail"}); err != nil {
		t.Errorf("reading settled operations from the read model: %v", err)
	}
	stopCold()

	w.rotate()
	w.prune()

	if _, err := projector.Rebuild(w.ctx, w.app.Store, workflow.NewJournal(w.app.Pool)); err != nil {
		t.Errorf("rebuilding the read model: %v", err)
	}
}

// do sends a request to the API and decodes a JSON answer; header is
// name, value pairs.
func (w *distWorld) do(method, path string, body any, header ...string) (int, map[string]any) {
	w.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(w.ctx, method, w.base+path, rd)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// get reads path for at most half a second (a stream does not end).
func (w *distWorld) get(path string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", w.base+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		w.t.Errorf("GET %s: %d", path, resp.StatusCode)
	}
}

func (w *distWorld) submit(key, tool string) {
	w.t.Helper()
	code, body := w.do("POST", "/v1/intents", map[string]any{"operation_key": key, "tool": tool, "args": map[string]any{"k": key}})
	if code != http.StatusAccepted && code != http.StatusOK {
		w.t.Fatalf("POST intent %s: %d %v", key, code, body)
	}
}

func (w *distWorld) decide(key, action string) {
	w.t.Helper()
	if code, body := w.do("POST", "/v1/operations/"+url.PathEscape(key)+"/decisions", map[string]any{"action": action, "note": "test"}); code != http.StatusOK {
		w.t.Fatalf("deciding %s on %s: %d %v", action, key, code, body)
	}
}

func (w *distWorld) load(key string) events.Operation {
	w.t.Helper()
	op, err := w.app.Store.Load(w.ctx, key)
	if err != nil {
		w.t.Fatal(err)
	}
	return op
}

// waitStatus polls the head record of key until it has status want.
func (w *distWorld) waitStatus(key string, want events.Status) {
	w.t.Helper()
	var got events.Status
	for w.ctx.Err() == nil {
		op, err := w.app.Store.Load(w.ctx, key)
		if err == nil && op.Status == want {
			return
		}
		if err == nil {
			got = op.Status
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.t.Fatalf("%s did not become %s (last %s)", key, want, got)
}

func (w *distWorld) startWorkflow(id string) {
	w.t.Helper()
	if code, body := w.do("POST", "/v1/workflows", map[string]any{"workflow_id": id, "workflow": "trip", "input": map[string]any{"sku": id}}); code != http.StatusAccepted {
		w.t.Fatalf("starting %s: %d %v", id, code, body)
	}
}

func (w *distWorld) waitWorkflow(id, want string) {
	w.t.Helper()
	var last map[string]any
	for w.ctx.Err() == nil {
		if _, last = w.do("GET", "/v1/workflows/"+id, nil); last["status"] == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.t.Fatalf("workflow %s did not become %s: %v", id, want, last)
}

// expireLease moves the lease of key's running step into the past, again
// until the sweep took it (the worker's renewals move it forward).
func (w *distWorld) expireLease(key string) {
	w.t.Helper()
	pool := testenv.NewPool(w.t, w.db) // not traced: this is the test's statement
	for !w.log.has("AND status = 'in_progress' FOR UPDATE") {
		if w.ctx.Err() != nil {
			w.t.Fatalf("the sweep did not expire the lease of %s", key)
		}
		if _, err := pool.Exec(w.ctx, `UPDATE operations SET lease_until = now() - interval '1 minute'
			WHERE operation_key = $1 AND status = 'in_progress'`, key); err != nil {
			w.t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// webhook posts a signed callback from cache.set.
func (w *distWorld) webhook(cb map[string]any) {
	w.t.Helper()
	body, _ := json.Marshal(cb)
	wh, err := standardwebhooks.NewWebhook(distSecret)
	if err != nil {
		w.t.Fatal(err)
	}
	id, at := fmt.Sprintf("msg_%d", time.Now().UnixNano()), time.Now()
	sig, err := wh.Sign(id, at, body)
	if err != nil {
		w.t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(w.ctx, "POST", w.base+"/v1/webhooks/cache.set", bytes.NewReader(body))
	req.Header.Set(standardwebhooks.HeaderWebhookID, id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		w.t.Errorf("webhook %s: %d", body, resp.StatusCode)
	}
}

// agentAppend records an intent as an agent service does, in a transaction
// of its own on the traced pool, and returns what Append said.
func (w *distWorld) agentAppend(key string) outbox.Appended {
	w.t.Helper()
	var out outbox.Appended
	err := pgx.BeginFunc(w.ctx, w.app.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = outbox.Append(w.ctx, tx, outbox.Intent{OperationKey: key, Tool: "cache.set",
			EffectClass: events.Idempotent, Args: json.RawMessage(`{"k":"agent"}`), Principal: "agent"})
		return err
	})
	if err != nil {
		w.t.Fatalf("appending %s as an agent: %v", key, err)
	}
	w.app.Store.NotifyAppended()
	return out
}

// coldProjector runs a second projector, as one restarted or given
// partitions in a rebalance: with nothing in memory (its cache off) it
// reads the rows it writes.
// It returns the function that waits for that read and stops it.
func (w *distWorld) coldProjector() (stop func()) {
	w.t.Helper()
	p, err := projector.New(projector.Config{Kafka: w.app.Kafka, Store: w.app.Store, Base: service.Base{Logger: w.app.Log},
		Group: "dist-cold", WorkflowGroup: "dist-cold-workflows", CacheSize: -1, Workflows: workflow.NewJournal(w.app.Pool)})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return func() {
		w.t.Helper()
		for !w.log.has(", record, body FROM operation_state WHERE operation_key = ANY($1)") && w.ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			w.t.Errorf("the second projector: %v", err)
		}
	}
}

// rotate moves the outbox on until a partition the relay drained has been
// truncated, as the relay's rotator does every few seconds.
func (w *distWorld) rotate() {
	w.t.Helper()
	var rotated, truncated bool
	for !rotated || !truncated {
		if w.ctx.Err() != nil {
			w.t.Fatalf("the outbox did not rotate and truncate (rotated %v, truncated %v)", rotated, truncated)
		}
		// Something to drain in the partition now current.
		w.agentAppend(fmt.Sprintf("d/rotate-%d", time.Now().UnixNano()))
		r, err := w.app.Store.RotateOutbox(w.ctx, store.RotateOptions{Every: time.Nanosecond})
		if err != nil {
			w.t.Fatal(err)
		}
		rotated, truncated = rotated || r.Rotated, truncated || r.Truncated > 0
		time.Sleep(20 * time.Millisecond)
	}
}

// prune prunes every settled operation, answers a late duplicate and an
// agent's retry from a tombstone, and expires the tombstones.
func (w *distWorld) prune() {
	w.t.Helper()
	cfg := PruneConfig(w.app.Config, w.app.Tools, w.app.Workflows.Defs())
	cfg.Windows, cfg.Default = nil, time.Nanosecond
	pass := func(tombstones time.Duration) pruner.Counts {
		cfg.TombstoneRetention = tombstones
		p, err := pruner.New(w.app.Store, cfg)
		if err != nil {
			w.t.Fatal(err)
		}
		n, err := p.RunOnce(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		return n
	}
	// d/ok's last events may still wait in the outbox, which keeps it.
	for w.ctx.Err() == nil {
		pass(0)
		if _, err := w.app.Store.Load(w.ctx, "d/ok"); errors.Is(err, store.ErrPruned) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := w.do("GET", "/v1/operations/"+url.PathEscape("d/ok"), nil); code != http.StatusOK || body["pruned"] != true {
		w.t.Errorf("GET a pruned operation: %d %v", code, body)
	}
	w.submit("d/ok", "cache.set")
	if a := w.agentAppend("d/agent"); !a.Pruned {
		w.t.Errorf("an agent's retry of a pruned intent: %+v", a)
	}
	if n := pass(time.Nanosecond); n.Expired == 0 {
		w.t.Errorf("no tombstone expired: %+v", n)
	}
}
