package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// These tests run the built binary the way a newcomer and an operator do:
// `effectline dev --demo` end to end, and `effectline run` stopped with
// SIGTERM while tool calls are in flight.

var (
	devAPILine       = regexp.MustCompile(`^\s*API\s+http://(127\.0\.0\.1:\d+)/v1/`)
	devOperationLine = regexp.MustCompile(`^operations: (.*)$`)
	// The API of `run` logs its bound address (JSON logs).
	runAPIListening = regexp.MustCompile(`"msg":"http api listening".*"addr":"([^"]+)"`)
)

// devDemoKeys are the demo's operation keys for order ord-1001, in step order.
var devDemoKeys = []string{"wf:ord-1001/reserve", "wf:ord-1001/charge", "wf:ord-1001/confirm"}

// devDemoHeld are the operations of the demo's second order, ord-1001-2,
// whose charge nobody can confirm: it waits for an approver.
var devDemoHeld = []string{"wf:ord-1001-2/reserve=completed", "wf:ord-1001-2/charge=escalated"}

// TestDevDemo runs `effectline dev --demo` on a fresh database and the
// embedded broker, checks the worked example's timeline and figures, then
// the API it keeps serving, then SIGTERM; a second run against the same
// database resumes the same order without a new downstream effect.
func TestDevDemo(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	// No EFFECTLINE_KAFKA_BROKERS: dev starts its embedded broker.
	env := map[string]string{envDatabaseURL: db, envHTTPAddr: "127.0.0.1:0"}

	began := time.Now()
	dev := start(t, "dev --demo", env, "dev", "--demo")
	addr := dev.waitLine(devAPILine, 60*time.Second)[1]
	base := "http://" + addr
	ops := dev.waitLine(devOperationLine, 60*time.Second)[1]
	t.Logf("demo summary after %s", time.Since(began).Round(time.Millisecond))
	out := dev.output()

	// The summary's figures.
	want := make([]string, len(devDemoKeys))
	for i, k := range devDemoKeys {
		want[i] = k + "=completed"
	}
	all := append(slices.Clone(want), devDemoHeld...)
	if ops != strings.Join(all, " ") {
		t.Errorf("operations line = %q, want %q", ops, strings.Join(all, " "))
	}
	if !regexp.MustCompile(`(?m)^duplicates: 0$`).MatchString(out) {
		t.Errorf("summary does not say duplicates: 0")
	}
	if strings.Contains(out, "DUPLICATE EFFECTS") {
		t.Errorf("the demo reports duplicate effects")
	}
	tallies := devTallies(t, out)
	for svc, w := range map[string]devTally{
		// Reserve: the lost response, then the retry under ~c1; the first
		// reservation is released. The second order's reserve: one more.
		"inventory": {requests: 3, effects: 2, undone: 1},
		// Charge: one request; reconciliation found it, nothing sent again.
		// The second order's charge: one request, never repeated.
		"payments": {requests: 2, effects: 2},
		// Confirm: the 429, then the delayed retry.
		"email": {requests: 2, effects: 1},
	} {
		if got := tallies[svc]; got != w {
			t.Errorf("summary for %s = %+v, want %+v", svc, got, w)
		}
	}

	// dev runs with its soft memory limit when GOMEMLIMIT is unset (the
	// test's environment has none): the Go collector on /metrics says so.
	if res, err := http.Get(base + "/metrics"); err != nil {
		t.Errorf("GET /metrics: %v", err)
	} else {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		m := regexp.MustCompile(`(?m)^go_gc_gomemlimit_bytes (\S+)$`).FindSubmatch(b)
		if m == nil {
			t.Errorf("/metrics has no go_gc_gomemlimit_bytes")
		} else if v, _ := strconv.ParseFloat(string(m[1]), 64); v != devMemoryLimit {
			t.Errorf("go_gc_gomemlimit_bytes = %s, want dev's soft limit %d", m[1], devMemoryLimit)
		}
	}

	// The timeline shows the rules at work.
	reserve := devSection(out, "inventory.reserve  (", "payments.charge  (")
	devInOrder(t, "reserve", reserve,
		regexp.MustCompile(`attempt 1 UNKNOWN .*compensable: undo first`),
		regexp.MustCompile(`undo →\s+release wf:ord-1001/reserve`),
		regexp.MustCompile(`attempt 2 →\s+Idempotency-Key: wf:ord-1001/reserve~c1\b`),
		regexp.MustCompile(`attempt 2 succeeded`))
	charge := devSection(out, "payments.charge  (", "email.send  (")
	devInOrder(t, "charge", charge,
		regexp.MustCompile(`attempt 1 →\s+Idempotency-Key: wf:ord-1001/charge$`),
		regexp.MustCompile(`attempt 1 UNKNOWN .*never retried blindly`),
		regexp.MustCompile(`reconciled: it happened`))
	if n := len(regexp.MustCompile(`(?m)attempt \d+ →`).FindAllString(charge, -1)); n != 1 {
		t.Errorf("the charge was attempted %d times, want exactly 1:\n%s", n, charge)
	}
	confirm := devSection(out, "email.send  (", "Second order")
	devInOrder(t, "confirm", confirm,
		regexp.MustCompile(`attempt 1 failed\s+http_429, nothing happened: retry in 1\.\ds`),
		regexp.MustCompile(`attempt 2 →\s+Idempotency-Key: wf:ord-1001/confirm \(after waiting (\d+\.\d)s\)`),
		regexp.MustCompile(`attempt 2 succeeded`))
	if m := regexp.MustCompile(`after waiting (\d+\.\d)s`).FindStringSubmatch(confirm); m != nil {
		if w, _ := strconv.ParseFloat(m[1], 64); w < 1.0 {
			t.Errorf("the confirm's retry waited %ss, want at least the Retry-After of 1s", m[1])
		}
	}

	// The workflow's own events sit between the steps: each next intent is
	// recorded with the previous step's completion.
	devInOrder(t, "workflow ord-1001", devSection(out, "Worked example", "Second order"),
		regexp.MustCompile(`workflow started\s+workflow ord-1001:`),
		regexp.MustCompile(`step reserve completed\s+next: charge`),
		regexp.MustCompile(`step charge completed\s+next: confirm`),
		regexp.MustCompile(`workflow completed`))
	// The second order's charge is attempted once, reconciliation cannot
	// tell, and the workflow waits on it for an approver.
	held := devSection(out, "Second order", "Summary after ")
	devInOrder(t, "ord-1001-2", held,
		regexp.MustCompile(`attempt 1 →\s+Idempotency-Key: wf:ord-1001-2/charge$`),
		regexp.MustCompile(`attempt 1 UNKNOWN .*never retried blindly`),
		regexp.MustCompile(`asked \(1\)\s+did it happen\? the ledger answers 503`),
		regexp.MustCompile(`asked \(5\)\s+did it happen\?`), // the reconciler's default MaxAsks
		regexp.MustCompile(`ESCALATED\s+cannot_tell`),
		regexp.MustCompile(`^Waiting: workflow ord-1001-2 waits on wf:ord-1001-2/charge \(escalated\) for an approver: http://.*/ui/workflows/ord-1001-2$`))
	if n := len(regexp.MustCompile(`asked \(\d+\)`).FindAllString(held, -1)); n != 5 {
		t.Errorf("the timeline shows %d unanswered asks before the escalation, want the reconciler's 5:\n%s", n, held)
	}
	if n := len(regexp.MustCompile(`(?m)attempt \d+ →\s+Idempotency-Key: wf:ord-1001-2/charge`).FindAllString(held, -1)); n != 1 {
		t.Errorf("the second order's charge was attempted %d times, want exactly 1:\n%s", n, held)
	}

	// The API serves the three operations, completed, with their histories.
	ctx := untilCtx(t, 60*time.Second)
	for _, key := range devDemoKeys {
		var op devOperationBody
		if code := devGetJSON(t, ctx, base+"/v1/operations/"+url.PathEscape(key), &op); code != http.StatusOK {
			t.Fatalf("GET operation %s: %d", key, code)
		}
		if op.OperationKey != key || op.Status != events.StatusCompleted {
			t.Errorf("GET operation %s: key %q status %s, want completed", key, op.OperationKey, op.Status)
		}
		hist := op.history(t)
		switch key {
		case "wf:ord-1001/charge":
			if n := devCount(hist, events.AttemptStarted); n != 1 {
				t.Errorf("%s: %d attempts in the history, want 1 (irreversible, found by reconciliation)", key, n)
			}
			if devCount(hist, events.ReconciliationResolved) != 1 {
				t.Errorf("%s: no reconciliation in the history", key)
			}
		case "wf:ord-1001/confirm":
			// The retry started at least Retry-After (1s) after the 429 was
			// journaled: measured on the journal's own clock, not the
			// timeline's polling. The retry is due 1s after the clock read
			// that classified the 429, which precedes the failure's own
			// occurred_at by the time it takes to build the event: allow
			// for that, not for an early retry.
			var failedAt, retriedAt time.Time
			for _, e := range hist {
				switch {
				case e.Type == events.AttemptFailed && e.Attempt == 1:
					failedAt = e.OccurredAt
				case e.Type == events.AttemptStarted && e.Attempt == 2:
					retriedAt = e.OccurredAt
				}
			}
			if failedAt.IsZero() || retriedAt.IsZero() {
				t.Errorf("%s: history lacks the 429 or the retry: %v", key, devTypes(hist))
			} else if d := retriedAt.Sub(failedAt); d < time.Second-10*time.Millisecond {
				t.Errorf("%s: retried %s after the 429, want at least 1s (Retry-After: 1)", key, d)
			}
		}
	}
	// The list comes from the read model, which the projector fills
	// asynchronously: poll.
	var listed []string
	listedAll := waitForSoft(ctx, func() bool {
		var page struct {
			Items []devOperationBody `json:"items"`
		}
		if devGetJSON(t, ctx, base+"/v1/operations?status=completed", &page) != http.StatusOK {
			return false
		}
		listed = listed[:0]
		for _, it := range page.Items {
			listed = append(listed, it.OperationKey)
		}
		for _, k := range devDemoKeys {
			if !slices.Contains(listed, k) {
				return false
			}
		}
		return true
	})
	if !listedAll {
		t.Errorf("GET /v1/operations?status=completed lists %v, want %v", listed, devDemoKeys)
	}

	// Without --exit-after-demo, dev keeps serving until it is told to stop.
	for _, path := range []string{"/healthz", "/ui/"} {
		if code := devGetStatus(ctx, base+path); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, code)
		}
	}
	select {
	case <-dev.done:
		t.Fatalf("dev --demo exited after the demo (%v); it should serve until SIGTERM", dev.err)
	default:
	}
	stopAt := time.Now()
	if err := dev.stop(15 * time.Second); err != nil {
		t.Fatalf("dev --demo on SIGTERM: %v", err)
	}
	took := time.Since(stopAt)
	t.Logf("dev --demo exited 0 %s after SIGTERM", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("dev --demo took %s to exit after SIGTERM, want a prompt exit", took)
	}

	// The same order again, on the same database: the demo resumes each
	// step from the journal. The demo's downstream is new in each process,
	// so any request it counts would be a second effect.
	again := start(t, "dev --demo --exit-after-demo (resume)", env, "dev", "--demo", "--exit-after-demo", "--order-id", "ord-1001")
	if err := again.wait(60 * time.Second); err != nil {
		t.Fatalf("resumed demo: %v", err)
	}
	out = again.output()
	for _, key := range append(slices.Clone(devDemoKeys), "wf:ord-1001-2/reserve", "wf:ord-1001-2/charge") {
		if !strings.Contains(out, "(operation "+key+" already exists: resuming it)") {
			t.Errorf("resumed demo does not say it resumes %s", key)
		}
	}
	for _, svc := range []string{"inventory", "payments", "email"} {
		if got := devTallies(t, out)[svc]; got.requests != 0 || got.effects != 0 {
			t.Errorf("resumed demo: %s got %d requests, %d effects; want none", svc, got.requests, got.effects)
		}
	}
	if !regexp.MustCompile(`(?m)^duplicates: 0$`).MatchString(out) ||
		!strings.Contains(out, "operations: "+strings.Join(all, " ")) {
		t.Errorf("resumed demo's summary is not duplicates 0 and every operation completed")
	}
	if strings.Contains(out, "retry in -") {
		t.Errorf("the replayed timeline shows a negative retry delay")
	}
}

// TestDevUnreachableDatabase: dev without PostgreSQL fails at once and says
// how to start it, without a panic or a stack trace.
func TestDevUnreachableDatabase(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"dev"}, {"dev", "--demo"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			env := map[string]string{envDatabaseURL: "postgres://postgres@127.0.0.1:1/x", envHTTPAddr: "127.0.0.1:0"}
			began := time.Now()
			p := start(t, strings.Join(args, " "), env, args...)
			err := p.wait(20 * time.Second)
			took := time.Since(began)
			out := p.output()
			var exit interface{ ExitCode() int }
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("want a non-zero exit, got %v", err)
			}
			t.Logf("exited %d after %s", exit.ExitCode(), took.Round(time.Millisecond))
			if took > 12*time.Second {
				t.Errorf("took %s to give up on an unreachable database", took)
			}
			for _, s := range []string{"PostgreSQL must be running", envDatabaseURL, "pg_ctlcluster", "docker compose"} {
				if !strings.Contains(out, s) {
					t.Errorf("the message does not mention %q:\n%s", s, out)
				}
			}
			for _, s := range []string{"panic", "goroutine ", ".go:", "runtime."} {
				if strings.Contains(out, s) {
					t.Errorf("the output contains %q:\n%s", s, out)
				}
			}
		})
	}
}

// TestGracefulShutdownLosesNothing stops `effectline run` with SIGTERM
// while tool calls are in flight, and checks that nothing in flight is lost
// or misreported, then that a fresh process finishes the work with one
// standing effect per operation.
func TestGracefulShutdownLosesNothing(t *testing.T) {
	t.Parallel()
	t.Run("calls finish within the grace", func(t *testing.T) {
		t.Parallel()
		gsWithinGrace(t)
	})
	t.Run("calls cut by the grace are unknown", func(t *testing.T) {
		t.Parallel()
		gsCutByGrace(t)
	})
	t.Run("readyz turns 503 before the API stops", func(t *testing.T) {
		t.Parallel()
		gsReadyzDrain(t)
	})
}

// gsTools cycles through the three effect classes of e2eTools.
var gsTools = []struct {
	tool  string
	class events.EffectClass
}{
	{"cache.set", events.Idempotent},
	{"inventory.reserve", events.Compensable},
	{"payments.charge", events.Irreversible},
}

const gsComponents = "relay,executor,projector,reconciler"

// gsSubmit records n intents from the test, as an agent service would,
// and returns their keys.
func gsSubmit(t *testing.T, ctx context.Context, db, prefix string, from, n int) []string {
	t.Helper()
	pool := testenv.NewPool(t, db)
	var keys []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := from; i < from+n; i++ {
			c := gsTools[i%len(gsTools)]
			key := fmt.Sprintf("%s/%02d/%s", prefix, i, c.class)
			if _, err := outbox.Append(ctx, tx, outbox.Intent{OperationKey: key, Tool: c.tool, EffectClass: c.class,
				Args: json.RawMessage(`{"amount":100}`), Principal: "graceful-test"}); err != nil {
				return err
			}
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// gsLoad returns the head record of every key.
func gsLoad(t *testing.T, ctx context.Context, st *store.Store, keys []string) map[string]events.Operation {
	t.Helper()
	ops, err := st.LoadMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

func gsCount(ops map[string]events.Operation, s events.Status) int {
	n := 0
	for _, op := range ops {
		if op.Status == s {
			n++
		}
	}
	return n
}

// gsLive counts the standing effects the fake holds for an operation,
// under its key or a key derived from it after a compensation (key~cN).
func gsLive(fake *testenv.FakeTool, key string) (live, applied int) {
	for _, e := range fake.EffectLog() {
		if e.IdempotencyKey == key || strings.HasPrefix(e.IdempotencyKey, key+"~") {
			applied++
			if !e.Released {
				live++
			}
		}
	}
	return live, applied
}

// gsInvokes counts the invoke requests the fake received for an operation.
func gsInvokes(fake *testenv.FakeTool, key string) int {
	n := 0
	for _, r := range fake.RequestLog() {
		if r.Route == testenv.RouteInvoke && (r.IdempotencyKey == key || strings.HasPrefix(r.IdempotencyKey, key+"~")) {
			n++
		}
	}
	return n
}

// gsStop sends SIGTERM and checks for exit 0 within limit.
func gsStop(t *testing.T, p *proc, limit time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	if err := p.stop(limit); err != nil {
		t.Fatalf("%s on SIGTERM: %v", p.name, err)
	}
	took := time.Since(began)
	t.Logf("%s exited 0 %s after SIGTERM", p.name, took.Round(time.Millisecond))
	return took
}

// gsRecover starts a fresh process and waits until every operation is
// settled per its class, then checks the effects.
func gsRecover(t *testing.T, ctx context.Context, w *world, st *store.Store, keys []string, want func(events.EffectClass) events.Status) {
	t.Helper()
	second := start(t, "effectline (after restart)", w.with(map[string]string{envHTTPAddr: "127.0.0.1:0"}), "run", "--components", gsComponents)
	var ops map[string]events.Operation
	settled := waitForSoft(ctx, func() bool {
		ops = gsLoad(t, ctx, st, keys)
		for _, k := range keys {
			if op := ops[k]; op.Status != want(op.EffectClass) {
				return false
			}
		}
		return true
	})
	if !settled {
		for _, k := range keys {
			if op := ops[k]; op.Status != want(op.EffectClass) {
				t.Errorf("%s (%s): %s after restart, want %s", k, op.EffectClass, op.Status, want(op.EffectClass))
			}
		}
		t.FailNow()
	}
	// Give a wrong retry the time to happen before counting.
	time.Sleep(500 * time.Millisecond)
	for _, k := range keys {
		op := gsLoad(t, ctx, st, []string{k})[k]
		live, applied := gsLive(w.fake, k)
		invokes := gsInvokes(w.fake, k)
		wantLive := 0
		if op.Status == events.StatusCompleted {
			wantLive = 1
		}
		if op.Status != want(op.EffectClass) || live != wantLive {
			t.Errorf("%s (%s): %s with %d standing effects (%d applied, %d invokes), want %s with %d",
				k, op.EffectClass, op.Status, live, applied, invokes, want(op.EffectClass), wantLive)
		}
		if op.EffectClass == events.Irreversible && invokes > 1 {
			t.Errorf("%s: an irreversible effect was sent %d times", k, invokes)
		}
	}
	gsStop(t, second, 15*time.Second)
}

// gsWithinGrace: calls stall 1.5s and the grace is 5s, so every call in
// flight at SIGTERM finishes and its outcome is journaled before the
// process exits. Intents recorded during the shutdown stay pending for the
// next process.
func gsWithinGrace(t *testing.T) {
	const stall, grace = 1500 * time.Millisecond, 5 * time.Second
	w := newWorld(t, testenv.WithDefaultFault(testenv.FaultStall(stall), testenv.RouteInvoke))
	ctx := untilCtx(t, 90*time.Second)
	st := store.New(testenv.NewPool(t, w.db))
	first := start(t, "effectline (stopped)", w.with(map[string]string{
		envShutdownGrace: grace.String(), envHTTPAddr: "127.0.0.1:0",
	}), "run", "--components", gsComponents)

	keys := gsSubmit(t, ctx, w.db, "graceful", 0, 15)
	waitFor(t, ctx, "calls in flight", func() bool {
		return gsCount(gsLoad(t, ctx, st, keys), events.StatusInProgress) >= 5
	})
	// A call in flight is one the fake tool holds: that is what SIGTERM
	// must not lose.
	atTerm := gsLoad(t, ctx, st, keys)
	var inFlight []string
	for _, k := range keys {
		if atTerm[k].Status == events.StatusInProgress {
			inFlight = append(inFlight, k)
		}
	}
	sent := time.Now()
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	// Intents keep arriving while the process drains.
	late := gsSubmit(t, ctx, w.db, "graceful", 15, 5)
	keys = append(keys, late...)
	if err := first.wait(grace + 5*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM (grace %s): %v", grace, err)
	}
	t.Logf("exited 0 %s after SIGTERM", time.Since(sent).Round(time.Millisecond))

	// Nothing in flight was lost: every call held at SIGTERM finished
	// within the grace, and its success is in the journal.
	after := gsLoad(t, ctx, st, keys)
	for _, k := range inFlight {
		if after[k].Status != events.StatusCompleted {
			t.Errorf("%s was in flight at SIGTERM and is %s after a graceful exit, want completed", k, after[k].Status)
		}
	}
	// Nothing is misreported: an effect that happened is journaled as
	// completed, and an operation not completed has no effect (pending, or
	// claimed and recoverable when its lease expires).
	for _, k := range keys {
		op, ok := after[k]
		live, applied := gsLive(w.fake, k)
		switch {
		case !ok:
			t.Errorf("%s: not journaled", k)
		case op.Status == events.StatusCompleted:
			if live != 1 {
				t.Errorf("%s: completed with %d standing effects", k, live)
			}
		case op.Status == events.StatusPending:
			if applied != 0 {
				t.Errorf("%s: pending although the downstream applied it", k)
			}
		case op.Status == events.StatusInProgress:
			if applied != 0 || op.LeaseUntil == nil {
				t.Errorf("%s: in progress after exit, applied %d, lease %v: not recoverable", k, applied, op.LeaseUntil)
			}
			t.Logf("%s: claimed but not called at exit; recovered when its lease expires", k)
		default:
			t.Errorf("%s: %s after a graceful exit", k, op.Status)
		}
	}
	t.Logf("at SIGTERM %d of %d in flight; after exit %d completed, %d pending, %d in progress",
		len(inFlight), len(keys)-len(late), gsCount(after, events.StatusCompleted),
		gsCount(after, events.StatusPending), gsCount(after, events.StatusInProgress))

	gsRecover(t, ctx, w, st, keys, func(events.EffectClass) events.Status { return events.StatusCompleted })
}

// gsCutByGrace: calls stall 2s and the grace is 500ms, so shutdown cuts the
// calls in flight. The request had left, so each is journaled
// attempt.unknown, never attempt.failed; after a restart each settles per
// its class: idempotent retried under the same key, compensable undone and
// retried under a new key, irreversible reconciled (absent: the stall was cut
// before the effect) and escalated, never sent again.
func gsCutByGrace(t *testing.T) {
	// The stall stays under the invoke timeout (3s), so the restarted
	// process's calls succeed.
	const stall, grace = 2 * time.Second, 500 * time.Millisecond
	w := newWorld(t, testenv.WithDefaultFault(testenv.FaultStall(stall), testenv.RouteInvoke))
	ctx := untilCtx(t, 90*time.Second)
	st := store.New(testenv.NewPool(t, w.db))
	first := start(t, "effectline (stopped)", w.with(map[string]string{
		envShutdownGrace: grace.String(), envHTTPAddr: "127.0.0.1:0",
	}), "run", "--components", gsComponents)

	keys := gsSubmit(t, ctx, w.db, "cut", 0, 9)
	// Every request has reached the fake tool, which holds it.
	waitFor(t, ctx, "every call in flight", func() bool { return w.fake.Requests(testenv.RouteInvoke) >= len(keys) })
	gsStop(t, first, grace+5*time.Second)
	// The fake applies an effect only when its stall runs out: none did, so
	// every call was cut at the grace, before the downstream acted.
	if n := w.fake.Applied(); n != 0 {
		t.Fatalf("the fake applied %d effects; shutdown should have cut the calls at the grace of %s", n, grace)
	}

	for _, k := range keys {
		evs, err := st.Events(ctx, k, 0)
		if err != nil {
			t.Fatal(err)
		}
		var hist []events.Envelope
		for _, e := range evs {
			hist = append(hist, e.Envelope)
		}
		if n := devCount(hist, events.AttemptFailed); n != 0 {
			t.Errorf("%s: a call cut by shutdown was journaled attempt.failed: %v", k, devTypes(hist))
		}
		if devCount(hist, events.AttemptStarted) != 1 || devCount(hist, events.AttemptUnknown) != 1 {
			t.Errorf("%s: want one attempt, journaled unknown: %v", k, devTypes(hist))
			continue
		}
		for _, e := range hist {
			if e.Type != events.AttemptUnknown {
				continue
			}
			d, err := e.DecodeData()
			if err != nil {
				t.Fatal(err)
			}
			u := d.(*events.AttemptUnknownData)
			t.Logf("%s: attempt.unknown %s, next %s", k, u.ErrorClass, u.Next)
		}
	}

	gsRecover(t, ctx, w, st, keys, func(c events.EffectClass) events.Status {
		if c == events.Irreversible {
			return events.StatusEscalated
		}
		return events.StatusCompleted
	})
}

// gsReadyzDrain: with the api component, SIGTERM turns /readyz 503 while
// the API keeps serving for a while (so load balancers drain it), and calls
// in flight still finish.
func gsReadyzDrain(t *testing.T) {
	const stall, grace = 1500 * time.Millisecond, 3 * time.Second
	w := newWorld(t, testenv.WithDefaultFault(testenv.FaultStall(stall), testenv.RouteInvoke))
	ctx := untilCtx(t, 90*time.Second)
	st := store.New(testenv.NewPool(t, w.db))
	p := start(t, "effectline with api", w.with(map[string]string{
		envShutdownGrace: grace.String(), envHTTPAddr: "127.0.0.1:0",
	}), "run", "--components", "relay,executor,api", "--insecure-open")
	base := "http://" + p.waitLine(runAPIListening, 60*time.Second)[1]
	if code := devGetStatus(ctx, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before shutdown: %d", code)
	}

	keys := gsSubmit(t, ctx, w.db, "readyz", 0, 3)
	waitFor(t, ctx, "calls in flight", func() bool { return w.fake.Requests(testenv.RouteInvoke) >= len(keys) })

	type probe struct {
		at           time.Duration
		ready, alive int
	}
	var probes []probe
	sent := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	for time.Since(sent) < grace+5*time.Second {
		pr := probe{at: time.Since(sent), ready: devGetStatus(ctx, base+"/readyz"), alive: devGetStatus(ctx, base+"/healthz")}
		probes = append(probes, pr)
		if pr.ready == 0 && pr.alive == 0 {
			break // the listener is closed
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.wait(grace + 5*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	t.Logf("exited 0 %s after SIGTERM", time.Since(sent).Round(time.Millisecond))

	// The probes: 200 until the signal is handled, then 503 while the API
	// still answers, then nothing. Never ready again once unready.
	var first503, closed time.Duration = -1, -1
	for _, pr := range probes {
		switch {
		case pr.ready == http.StatusServiceUnavailable:
			if first503 < 0 {
				first503 = pr.at
			}
			// /healthz is asked just after; 0 there is the listener closing
			// in between.
			if pr.alive != http.StatusOK && pr.alive != 0 {
				t.Errorf("at +%s /readyz 503 but /healthz %d: the API should still serve", pr.at, pr.alive)
			}
		case pr.ready == http.StatusOK:
			if first503 >= 0 {
				t.Errorf("at +%s /readyz 200 again after 503", pr.at)
			}
		case pr.ready == 0:
			if closed < 0 {
				closed = pr.at
			}
		default:
			t.Errorf("at +%s /readyz %d", pr.at, pr.ready)
		}
	}
	t.Logf("/readyz 503 from +%s, listener closed at +%s (%d probes)", first503.Round(time.Millisecond), closed.Round(time.Millisecond), len(probes))
	switch {
	case first503 < 0:
		t.Errorf("/readyz never answered 503 during the shutdown")
	case closed >= 0 && closed-first503 < time.Second:
		t.Errorf("/readyz was 503 for only %s before the API stopped; load balancers need a drain window", closed-first503)
	}
	ops := gsLoad(t, ctx, st, keys)
	for _, k := range keys {
		if ops[k].Status != events.StatusCompleted {
			t.Errorf("%s: %s after a graceful exit, want completed (the call finished within the grace)", k, ops[k].Status)
		}
	}
}

// devOperationBody is what the tests read of GET /v1/operations/{key}.
type devOperationBody struct {
	OperationKey string            `json:"operation_key"`
	Status       events.Status     `json:"status"`
	Events       []json.RawMessage `json:"events"`
}

func (b devOperationBody) history(t *testing.T) []events.Envelope {
	t.Helper()
	var out []events.Envelope
	for _, raw := range b.Events {
		var e events.Envelope
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("decoding an event of %s: %v", b.OperationKey, err)
		}
		out = append(out, e)
	}
	return out
}

func devCount(hist []events.Envelope, typ events.Type) int {
	n := 0
	for _, e := range hist {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func devTypes(hist []events.Envelope) []string {
	var out []string
	for _, e := range hist {
		out = append(out, fmt.Sprintf("%d:%s", e.Attempt, e.Type))
	}
	return out
}

var devClient = &http.Client{Timeout: 5 * time.Second}

// devGetStatus returns the status of GET u, or 0 when the request fails
// (connection refused once the listener is closed).
func devGetStatus(ctx context.Context, u string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0
	}
	resp, err := devClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// devGetJSON decodes the body of GET u into v when it answers 200.
func devGetJSON(t *testing.T, ctx context.Context, u string, v any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := devClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: decoding %s: %v", u, body, err)
		}
	} else {
		t.Logf("GET %s: %d %s", u, resp.StatusCode, body)
	}
	return resp.StatusCode
}

// devSection returns the part of out from the line starting with from up to
// the next line starting with to.
func devSection(out, from, to string) string {
	i := strings.Index(out, "\n"+from)
	if i < 0 {
		return ""
	}
	rest := out[i+1:]
	if j := strings.Index(rest, "\n"+to); j >= 0 {
		rest = rest[:j+1]
	}
	return rest
}

// devInOrder checks that section has lines matching res, in that order.
func devInOrder(t *testing.T, name, section string, res ...*regexp.Regexp) {
	t.Helper()
	lines := strings.Split(section, "\n")
	i := 0
	for _, re := range res {
		for i < len(lines) && !re.MatchString(lines[i]) {
			i++
		}
		if i == len(lines) {
			t.Errorf("%s timeline: no line matching %s in order:\n%s", name, re, section)
			return
		}
		i++
	}
}

type devTally struct{ requests, effects, undone, duplicates int }

// devTallies parses the summary table of the demo.
func devTallies(t *testing.T, out string) map[string]devTally {
	t.Helper()
	re := regexp.MustCompile(`(?m)^  (inventory|payments|email)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`)
	got := map[string]devTally{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		n := make([]int, 4)
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+2])
		}
		got[m[1]] = devTally{n[0], n[1], n[2], n[3]}
	}
	if len(got) != 3 {
		t.Errorf("summary table: found %d services, want 3", len(got))
	}
	return got
}
