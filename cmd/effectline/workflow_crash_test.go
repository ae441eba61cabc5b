package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/workflow"
)

// crashWorkflowTools adds a four-step workflow to workflowTools: two
// reservations before the charge (the pivot), so an unwind has two undos
// and a crash can fall between them.
const crashWorkflowTools = workflowTools + `  - name: crash.order
    steps:
      - {name: hold1, tool: inventory.reserve, args: {sku: a, quantity: 1}}
      - {name: hold2, tool: inventory.reserve, args: {sku: b, quantity: 1}}
      - {name: charge, tool: payments.charge, args: {amount: 100, currency: EUR}}
      - {name: confirm, tool: email.send, args: {text: done}}
`

var crashWorkflowSteps = []string{"hold1", "hold2", "charge", "confirm"}

// wfCrashCells are the workflow boundaries a process is killed at: the
// forward points on the first transition (hold1 completed → hold2), the
// unwind's on the transition between its two undos (hold2 undone → hold1's
// undo).
var wfCrashCells = []struct {
	point  string
	unwind bool
}{
	{workflow.PointBeforeIntent, false},
	{workflow.PointAfterTransition, false},
	{workflow.PointUndoBeforeIntent, true},
	{workflow.PointUndoAfterTransition, true},
}

type wfCrashResult struct {
	point                                    string
	trials, duplicates, lost, outOfOrder     int
	orphaned, requests, notKilled, unsettled int
}

// TestWorkflowCrashMatrix SIGKILLs a process running every component at
// the workflow driver's crash points, with the run between two steps or in
// the middle of an unwind, then lets a fresh process recover. The figures
// per cell: duplicate effects (standing effects beyond one per step), lost
// steps (a step never run, or never undone in an unwind), steps run out of
// order (forward, and undos last first), orphaned reservations (standing
// after the run unwound, or not a completed step's). All must be zero.
func TestWorkflowCrashMatrix(t *testing.T) {
	t.Parallel()
	bin, err := crashBinary()
	if err != nil {
		t.Fatal(err)
	}
	var results []*wfCrashResult
	var mu sync.Mutex
	sem := make(chan struct{}, 2)
	t.Run("cells", func(t *testing.T) {
		for _, c := range wfCrashCells {
			res := &wfCrashResult{point: c.point}
			results = append(results, res)
			t.Run(c.point, func(t *testing.T) {
				t.Parallel()
				for trial := range max(*crashTrials, 3) {
					sem <- struct{}{}
					runWorkflowCrashCell(t, bin, c.point, c.unwind, trial, res, &mu)
					<-sem
				}
			})
		}
	})
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nworkflow crash matrix\n%-32s %6s %5s %5s %9s %8s\n", "point", "trials", "dups", "lost", "disorder", "orphaned")
	total := 0
	for _, r := range results {
		if r.trials == 0 {
			continue
		}
		fmt.Fprintf(&sb, "%-32s %6d %5d %5d %9d %8d\n", r.point, r.trials, r.duplicates, r.lost, r.outOfOrder, r.orphaned)
		total += r.duplicates + r.lost + r.outOfOrder + r.orphaned + r.notKilled + r.unsettled
	}
	t.Log(sb.String())
	if total != 0 {
		t.Errorf("workflow crash matrix: %d bad figures%s", total, sb.String())
	}
}

func runWorkflowCrashCell(t *testing.T, bin, point string, unwind bool, trial int, res *wfCrashResult, mu *sync.Mutex) {
	t.Helper()
	w := newFaultWorld(t, faultWorldOptions{tools: crashWorkflowTools})
	id := fmt.Sprintf("crash-%s-%d", strings.TrimPrefix(point, "workflow_"), trial)
	if unwind {
		// The charge fails for good: before the pivot, so the run unwinds
		// hold2, then hold1.
		w.fake.Script(testenv.RouteInvoke, testenv.FaultNone, testenv.FaultNone,
			testenv.FaultFailBeforeEffect(http.StatusUnprocessableEntity, ""))
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	first := startBinary(t, bin, "effectline (crashing at "+point+")",
		w.with(map[string]string{envCrashPoint: point, envInsecureOpenAPI: "true", envHTTPAddr: addr}),
		"run", "--components", "relay,executor,projector,reconciler,workflow,api")
	ctx := untilCtx(t, 3*time.Minute)
	h := &wfHarness{t: t, ctx: ctx, base: "http://" + addr, fake: w.fake, hc: &http.Client{Timeout: 30 * time.Second}}
	waitFor(t, ctx, "the API to be ready", func() bool {
		resp, err := h.hc.Get(h.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if code, body := h.do("POST", "/v1/workflows", map[string]any{"workflow_id": id, "workflow": "crash.order", "input": map[string]any{}}); code != http.StatusAccepted {
		t.Fatalf("start %s: %d %v", id, code, body)
	}
	if err := first.wait(90 * time.Second); err == nil || !first.killedBySignal() {
		mu.Lock()
		res.notKilled++
		mu.Unlock()
		t.Errorf("the process did not die at %s: %v\n%s", point, err, first.output())
		return
	}

	second := start(t, "effectline (recovering)", w.env, "run", "--components", "relay,executor,projector,reconciler,workflow")
	pool := testenv.NewPool(t, w.db)
	want := events.WorkflowCompleted
	if unwind {
		want = events.WorkflowUnwound
	}
	var rec events.Workflow
	settled := waitForSoft(ctx, func() bool {
		var raw []byte
		if err := pool.QueryRow(ctx, `SELECT record FROM workflows WHERE workflow_id = $1`, id).Scan(&raw); err != nil {
			return false
		}
		rec = events.Workflow{}
		return json.Unmarshal(raw, &rec) == nil && !rec.Status.Active()
	})
	// Give a wrong extra request the time to happen before counting.
	time.Sleep(500 * time.Millisecond)
	if err := second.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	res.trials++
	if !settled || rec.Status != want {
		res.unsettled++
		t.Errorf("%s: status %s, want %s: %+v", id, rec.Status, want, rec)
	}
	figures := wfCrashFigures(w.fake, id, rec, unwind)
	res.duplicates += figures.duplicates
	res.lost += figures.lost
	res.outOfOrder += figures.outOfOrder
	res.orphaned += figures.orphaned
	if figures != (wfCrashResult{}) {
		t.Errorf("%s at %s: %+v\nrequests: %v\nrecord: %+v", id, point, figures, h.calls(id), rec)
	}
}

// wfCrashFigures counts what the downstream saw of run id against the
// run's final record.
func wfCrashFigures(fake *testenv.FakeTool, id string, rec events.Workflow, unwind bool) wfCrashResult {
	var f wfCrashResult
	stepOf := func(key string) int {
		rest := strings.TrimPrefix(key, "wf:"+id+"/")
		name, _, _ := strings.Cut(rest, "~")
		return slices.Index(crashWorkflowSteps, name)
	}
	// Duplicates: standing effects beyond one per step operation.
	standing := map[string]int{}
	var standingReservations []string
	for _, e := range fake.EffectLog() {
		if !strings.HasPrefix(e.IdempotencyKey, "wf:"+id+"/") || e.Released {
			continue
		}
		base, _, _ := strings.Cut(e.IdempotencyKey, "~c")
		standing[base]++
		if e.Path == "/effects/reservations" {
			standingReservations = append(standingReservations, e.IdempotencyKey)
		}
	}
	for _, n := range standing {
		f.duplicates += max(0, n-1)
	}
	// Order: the steps' first invokes in step order; undos last first,
	// after the failed step.
	var invoked, released []int
	for _, r := range fake.RequestLog() {
		if !strings.HasPrefix(r.IdempotencyKey, "wf:"+id+"/") {
			continue
		}
		i := stepOf(r.IdempotencyKey)
		switch r.Route {
		case testenv.RouteInvoke:
			if !slices.Contains(invoked, i) {
				invoked = append(invoked, i)
			}
		case testenv.RouteCompensate:
			if !slices.Contains(released, i) {
				released = append(released, i)
			}
		}
	}
	for j := 1; j < len(invoked); j++ {
		if invoked[j] < invoked[j-1] {
			f.outOfOrder++
		}
	}
	for j := 1; j < len(released); j++ {
		if released[j] > released[j-1] {
			f.outOfOrder++
		}
	}
	// Lost: a step never run (forward), or a completed reservation never
	// undone (unwind).
	if unwind {
		for _, name := range []string{"hold1", "hold2"} {
			if i := slices.Index(crashWorkflowSteps, name); !slices.Contains(released, i) || rec.Steps[i].Status != events.StepUndone {
				f.lost++
			}
		}
		f.orphaned = len(standingReservations)
		return f
	}
	for i := range crashWorkflowSteps {
		if !slices.Contains(invoked, i) || len(rec.Steps) <= i || rec.Steps[i].Status != events.StepCompleted {
			f.lost++
		}
	}
	for _, k := range standingReservations {
		i := stepOf(k)
		if i < 0 || len(rec.Steps) <= i || rec.Steps[i].Status != events.StepCompleted {
			f.orphaned++
		}
	}
	return f
}
