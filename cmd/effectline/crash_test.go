package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

var crashTrials = flag.Int("crash.trials", 2, "trials per cell of the crash matrix (the long form uses 10 or more)")

// pointDownstreamCommitted is the crash point the executor cannot see: the
// downstream applied the effect and the executor dies before the response
// arrives. The test kills the process while the fake tool holds the
// response.
const pointDownstreamCommitted = "after_downstream_commit"

var crashPoints = []string{
	executor.PointBeforeCall, pointDownstreamCommitted, executor.PointAfterResponse, executor.PointAfterJournal,
}

var crashClasses = []struct {
	tool  string
	class events.EffectClass
}{
	{"cache.set", events.Idempotent},
	{"inventory.reserve", events.Compensable},
	{"payments.charge", events.Irreversible},
}

// cellResult is the figure of one cell of the crash matrix.
type cellResult struct {
	point, class, receiver string
	trials                 int
	duplicates, lost       int
	wrongState             int
	retriedIrreversible    int
	applications           int
	states                 map[events.Status]int
}

// TestCrashMatrix kills a real executor process with SIGKILL at each point
// that matters, for each effect class, against receivers that honor
// idempotency keys and receivers that ignore them; a second process then
// recovers. The figures per cell: duplicate effects, lost operations,
// wrong final states. Target: all zero, and an irreversible operation is
// never retried automatically.
//
// Duplicate effects count standing effects beyond one per operation. An
// idempotent effect applied twice by a receiver that ignores keys is the
// same effect by definition of the class, so those applications are
// reported, not counted as duplicates.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var results []*cellResult
	sem := make(chan struct{}, 6)
	t.Run("cells", func(t *testing.T) {
		for _, point := range crashPoints {
			for _, c := range crashClasses {
				for _, honor := range []bool{true, false} {
					receiver := "honors-keys"
					if !honor {
						receiver = "ignores-keys"
					}
					res := &cellResult{point: point, class: string(c.class), receiver: receiver, states: map[events.Status]int{}}
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					t.Run(point+"/"+string(c.class)+"/"+receiver, func(t *testing.T) {
						t.Parallel()
						for trial := range *crashTrials {
							sem <- struct{}{}
							runCrashCell(t, point, c.tool, c.class, honor, trial, res)
							<-sem
						}
					})
				}
			}
		}
	})
	sort.Slice(results, func(i, j int) bool {
		a, b := results[i], results[j]
		return a.point+a.class+a.receiver < b.point+b.class+b.receiver
	})
	var sb strings.Builder
	fmt.Fprintf(&sb, "\ncrash matrix (%d trials per cell)\n", *crashTrials)
	fmt.Fprintf(&sb, "%-24s %-13s %-13s %6s %5s %6s %7s %9s  %s\n", "point", "class", "receiver", "dups", "lost", "wrong", "applied", "irrev.re", "final states")
	total := 0
	for _, r := range results {
		if r.trials == 0 {
			continue // not run: filtered out by -run
		}
		fmt.Fprintf(&sb, "%-24s %-13s %-13s %6d %5d %6d %7d %9d  %v\n", r.point, r.class, r.receiver,
			r.duplicates, r.lost, r.wrongState, r.applications, r.retriedIrreversible, r.states)
		total += r.duplicates + r.lost + r.wrongState + r.retriedIrreversible
	}
	t.Log(sb.String())
	if total != 0 {
		t.Errorf("crash matrix: %d bad figures%s", total, sb.String())
	}
}

func runCrashCell(t *testing.T, point, toolName string, class events.EffectClass, honor bool, trial int, res *cellResult) {
	t.Helper()
	w := newWorld(t, testenv.WithHonorKeys(honor))
	key := fmt.Sprintf("crash/%s/%s/%d", point, class, trial)

	crashEnv := map[string]string{}
	if point == pointDownstreamCommitted {
		w.fake.Script(testenv.RouteInvoke, testenv.FaultApplyThenStall)
	} else {
		crashEnv[envCrashPoint] = point
	}
	bin, err := crashBinary()
	if err != nil {
		t.Fatal(err)
	}
	first := startBinary(t, bin, "executor (crashing)", w.with(crashEnv), "run", "--components", "relay,executor")
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := untilCtx(t, 90*time.Second)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Append(ctx, tx, outbox.Intent{OperationKey: key, Tool: toolName, EffectClass: class,
			Args: json.RawMessage(`{"amount":100}`), Principal: "crash-test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	if point == pointDownstreamCommitted {
		waitFor(t, ctx, "the downstream to apply the effect", func() bool { return w.fake.Applied() >= 1 })
		first.kill()
	} else if err := first.wait(60 * time.Second); err == nil || !first.killedBySignal() {
		t.Fatalf("the executor did not die at %s: %v", point, err)
	}

	// Recovery: a fresh process with every component, up before anything
	// is judged (a SIGTERM that lands before the process installed its
	// handler would kill it, which says nothing about recovery).
	second := start(t, "effectline (recovering)", w.env, "run", "--components", "relay,executor,projector,reconciler")
	second.waitLine(regexp.MustCompile(`"msg":"effectline running"`), 60*time.Second)
	want := map[events.Status]bool{events.StatusCompleted: true}
	if class == events.Irreversible && point == executor.PointBeforeCall {
		// The request never left, and the reconciler proves it: absent.
		// An irreversible effect is not retried blindly; a human decides.
		want = map[events.Status]bool{events.StatusEscalated: true}
	}
	var op events.Operation
	settled := func() bool {
		var err error
		op, err = st.Load(ctx, key)
		return err == nil && (want[op.Status] || op.Status.Terminal())
	}
	if !waitForSoft(ctx, settled) {
		res.add(func(r *cellResult) { r.lost++; r.trials++ })
		t.Errorf("%s: operation not settled: %+v", key, op)
		_ = second.stop(10 * time.Second)
		return
	}
	// Give a wrong retry the time to happen before counting.
	time.Sleep(500 * time.Millisecond)
	op, _ = st.Load(ctx, key)
	invokes := w.fake.Requests(testenv.RouteInvoke)
	res.add(func(r *cellResult) {
		r.trials++
		r.states[op.Status]++
		r.applications += w.fake.Applied()
		if !want[op.Status] {
			r.wrongState++
			t.Errorf("%s: final state %s, want %v", key, op.Status, want)
		}
		if live := w.fake.Effects(); class != events.Idempotent && live > 1 {
			r.duplicates += live - 1
			t.Errorf("%s: %d standing effects", key, live)
		}
		if class == events.Idempotent && honor && w.fake.Effects() > 1 {
			r.duplicates += w.fake.Effects() - 1
		}
		if class == events.Irreversible && invokes > 1 {
			r.retriedIrreversible++
			t.Errorf("%s: an irreversible effect was sent %d times", key, invokes)
		}
	})
	if err := second.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

func (r *cellResult) add(f func(*cellResult)) {
	cellMu.Lock()
	defer cellMu.Unlock()
	f(r)
}

var cellMu sync.Mutex

func (p *proc) killedBySignal() bool {
	if p.cmd.ProcessState == nil {
		return false
	}
	return strings.Contains(p.cmd.ProcessState.String(), "killed")
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if !waitForSoft(ctx, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func waitForSoft(ctx context.Context, cond func() bool) bool {
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// TestCrashPointOnlyInTaggedBuild: the production build has no crash hook.
// Its binary does not even hold the variable's name, so nothing can set
// it; the build the crash tests use does.
func TestCrashPointOnlyInTaggedBuild(t *testing.T) {
	tagged, err := crashBinary()
	if err != nil {
		t.Fatal(err)
	}
	for bin, want := range map[string]bool{binary: false, tagged: true} {
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte(envCrashPoint)); got != want {
			t.Errorf("%s holds %s: %v, want %v", filepath.Base(bin), envCrashPoint, got, want)
		}
	}
}
