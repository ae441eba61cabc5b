package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// driverWorld is a service and a driver over a fresh database, with the
// driver's backoff clock in the test's hands.
type driverWorld struct {
	t   *testing.T
	st  *store.Store
	svc *Service
	drv *Driver
	now time.Time
}

func newDriverWorld(t *testing.T, cfg DriverConfig) *driverWorld {
	t.Helper()
	e := newEngine(t)
	w := &driverWorld{t: t, st: store.New(storedb.NewPool(t)), now: time.Now()}
	w.svc = NewService(w.st, e.defs, e.reg, "")
	w.drv = NewDriver(w.svc, nil, cfg)
	w.drv.clock = func() time.Time { return w.now }
	return w
}

// started starts the runs ids and completes their first step (reserve),
// so each has one transition due.
func (w *driverWorld) started(ids ...string) {
	w.t.Helper()
	for _, id := range ids {
		if _, _, err := w.svc.Start(w.t.Context(), Start{WorkflowID: id, Workflow: "order",
			Input: json.RawMessage(`{"sku":"s-` + id + `","amount":1}`), Principal: "p"}); err != nil {
			w.t.Fatal(err)
		}
		settle(w.t, w.st, StepKey(id, "reserve", 0), true)
	}
}

// awaiting returns the operation run id waits on.
func (w *driverWorld) awaiting(id string) string {
	w.t.Helper()
	rec, err := w.svc.Get(w.t.Context(), id)
	if err != nil {
		w.t.Fatal(err)
	}
	return rec.Awaiting
}

func runErrors(err error) map[string]*RunError {
	out := map[string]*RunError{}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	for _, e := range errs {
		var re *RunError
		if errors.As(e, &re) {
			out[re.WorkflowID] = re
		}
	}
	return out
}

// A round advances its runs in one transaction, one commit, with the crash
// points at the same places as for one run: every run's events journaled
// before any intent is recorded, and the after points once the round
// committed.
func TestDriverRoundAdvancesRunsInOneCommit(t *testing.T) {
	t.Parallel()
	var points []string
	w := newDriverWorld(t, DriverConfig{CrashPoint: func(p string) { points = append(points, p) }})
	var ids []string
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("many-%02d", i))
	}
	w.started(ids...)

	n, err := w.drv.RunOnce(t.Context())
	if err != nil || n != len(ids) {
		t.Fatalf("RunOnce = %d, %v; want %d transitions", n, err, len(ids))
	}
	for _, id := range ids {
		if got, want := w.awaiting(id), StepKey(id, "charge", 0); got != want {
			t.Errorf("%s awaits %q, want %q", id, got, want)
		}
		if _, err := w.st.Load(t.Context(), StepKey(id, "charge", 0)); err != nil {
			t.Errorf("%s: the charge's intent: %v", id, err)
		}
	}
	want := append(slices.Repeat([]string{PointBeforeIntent}, len(ids)), slices.Repeat([]string{PointAfterTransition}, len(ids))...)
	if !slices.Equal(points, want) {
		t.Errorf("crash points %v, want %v", points, want)
	}
	if c := w.drv.Counts(); c.Rounds != 1 || c.Transitions != int64(len(ids)) || c.Isolated != 0 || c.Failures != 0 {
		t.Errorf("counts %+v, want one round of %d", c, len(ids))
	}
	transitions, rounds, err := NewJournal(w.st.Pool()).CountTransitions(t.Context(), "many-")
	if err != nil || transitions != int64(len(ids)) || rounds != 1 {
		t.Errorf("CountTransitions = %d, %d, %v; want %d in 1", transitions, rounds, err, len(ids))
	}
	// Nothing is due any more: a replay takes nothing.
	if n, err := w.drv.RunOnce(t.Context()); n != 0 || err != nil {
		t.Errorf("second RunOnce = %d, %v; want nothing", n, err)
	}
}

// One run failing does not hold back the others of its round: the round's
// batched write fails, the round is taken again one run at a time, the
// others advance and the failing run is left where it was, with a
// RunError and a backoff, and tried again once the backoff ends. Two ways
// to fail: the database refusing the run's events (a trigger, dropped
// later: the retry succeeds) and the next step's key already recorded for
// another call (for good: the retry fails again, counted).
func TestDriverRoundWithAFailingRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newDriverWorld(t, DriverConfig{RetryBackoff: time.Minute, MaxRetryBackoff: 10 * time.Minute})
	w.started("good-1", "refused", "taken", "good-2")

	pool := w.st.Pool()
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_run() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.workflow_id = 'refused' THEN RAISE EXCEPTION 'refused by the test'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_run BEFORE INSERT ON workflow_events FOR EACH ROW EXECUTE FUNCTION refuse_run();`); err != nil {
		t.Fatal(err)
	}
	other, err := events.New(events.IntentRecorded, StepKey("taken", "charge", 0), 1, "payments.charge", events.Irreversible, 0,
		events.IntentData{Args: json.RawMessage(`{"amount":999}`), Principal: "someone else"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.st.Append(ctx, store.Append{Events: []events.Envelope{other}}); err != nil {
		t.Fatal(err)
	}
	seqOf := func(id string) int64 {
		t.Helper()
		rec, err := w.svc.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Seq
	}
	refusedSeq, takenSeq := seqOf("refused"), seqOf("taken")

	n, err := w.drv.RunOnce(ctx)
	res := runErrors(err)
	if n != 2 || len(res) != 2 || res["refused"] == nil || res["taken"] == nil {
		t.Fatalf("RunOnce = %d, %v; want the two good runs advanced and a RunError for refused and taken", n, err)
	}
	if !errors.Is(res["taken"], ErrPayloadConflict) || res["taken"].Attempt != 1 || res["refused"].Attempt != 1 {
		t.Errorf("run errors %v / %v", res["taken"], res["refused"])
	}
	if !res["refused"].RetryAt.Equal(w.now.Add(time.Minute)) {
		t.Errorf("refused is retried at %s, want a minute after %s", res["refused"].RetryAt, w.now)
	}
	for _, id := range []string{"good-1", "good-2"} {
		if got := w.awaiting(id); got != StepKey(id, "charge", 0) {
			t.Errorf("%s awaits %q, want its charge", id, got)
		}
	}
	// The failing runs are where they were: nothing of their transition
	// written.
	for id, seq := range map[string]int64{"refused": refusedSeq, "taken": takenSeq} {
		if got := w.awaiting(id); got != StepKey(id, "reserve", 0) || seqOf(id) != seq {
			t.Errorf("%s awaits %q at seq %d, want its reserve at %d", id, got, seqOf(id), seq)
		}
	}
	if _, err := w.st.Load(ctx, StepKey("refused", "charge", 0)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused's charge: %v, want no intent", err)
	}
	if c := w.drv.Counts(); c.Rounds != 1 || c.Transitions != 2 || c.Isolated != 1 || c.Failures != 2 {
		t.Errorf("counts %+v", c)
	}

	// Backing off: the rounds leave them out.
	if n, err := w.drv.RunOnce(ctx); n != 0 || err != nil {
		t.Errorf("RunOnce while backing off = %d, %v; want nothing", n, err)
	}

	// The cause of one failure goes away; the backoff ends.
	if _, err := pool.Exec(ctx, `DROP TRIGGER refuse_run ON workflow_events`); err != nil {
		t.Fatal(err)
	}
	w.now = w.now.Add(time.Minute + time.Second)
	n, err = w.drv.RunOnce(ctx)
	res = runErrors(err)
	if n != 1 || len(res) != 1 || res["taken"] == nil || res["taken"].Attempt != 2 {
		t.Fatalf("RunOnce after the backoff = %d, %v; want refused advanced and taken failing a second time", n, err)
	}
	if !res["taken"].RetryAt.Equal(w.now.Add(2 * time.Minute)) {
		t.Errorf("taken is retried at %s, want two minutes after %s (doubled)", res["taken"].RetryAt, w.now)
	}
	if got := w.awaiting("refused"); got != StepKey("refused", "charge", 0) {
		t.Errorf("refused awaits %q after its retry, want its charge", got)
	}
	if c := w.drv.Counts(); c.Rounds != 2 || c.Transitions != 3 || c.Failures != 3 {
		t.Errorf("counts %+v", c)
	}
}

// The transactional writer still takes the run's step completion and the
// next step's intent together: a context cancelled at the crash point
// before the intents leaves no trace of the transition.
func TestDriverRoundRollsBackWhole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := newDriverWorld(t, DriverConfig{CrashPoint: func(p string) {
		if p == PointBeforeIntent {
			cancel()
		}
	}})
	w.started("cut-1", "cut-2")
	if n, err := w.drv.RunOnce(ctx); err == nil || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want the round to fail", n, err)
	}
	for _, id := range []string{"cut-1", "cut-2"} {
		if got := w.awaiting(id); got != StepKey(id, "reserve", 0) {
			t.Errorf("%s awaits %q, want its reserve still", id, got)
		}
	}
	// Taken again, the same transitions happen.
	w.drv.cfg.CrashPoint = nil
	if n, err := w.drv.RunOnce(t.Context()); n != 2 || err != nil {
		t.Fatalf("RunOnce again = %d, %v", n, err)
	}
}
