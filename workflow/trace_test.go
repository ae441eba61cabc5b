package workflow

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// settle journals one attempt of key's operation that succeeded, or failed
// for good, as the executor would.
func settle(t *testing.T, st *store.Store, key string, ok bool) {
	t.Helper()
	ctx := context.Background()
	op, err := st.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var end events.Type = events.AttemptSucceeded
	var data any = events.AttemptSucceededData{Result: json.RawMessage(`{}`), DownstreamID: "d-" + key}
	if !ok {
		end, data = events.AttemptFailed, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422", StatusCode: 422}
	}
	started, err := events.New(events.AttemptStarted, key, op.Seq+1, op.Tool, op.EffectClass, 1,
		events.AttemptStartedData{DownstreamKey: key, Worker: "w", LeaseUntil: now.Add(time.Minute)}, now)
	if err != nil {
		t.Fatal(err)
	}
	ended, err := events.New(end, key, op.Seq+2, op.Tool, op.EffectClass, 1, data, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append(ctx, store.Append{Base: op, Events: []events.Envelope{started, ended}}); err != nil {
		t.Fatal(err)
	}
}

func traceOf(t *testing.T, st *store.Store, key string) string {
	t.Helper()
	tp, err := st.Traceparent(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		t.Fatalf("%s: traceparent %q", key, tp)
	}
	return parts[1]
}

// A run is one trace: every step's and undo's intent is recorded with the
// trace context the run was started in, the caller's span, so the spans
// of each step's operation are children of it. A run started without one
// gets a trace of its own.
func TestRunIsOneTrace(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	st := store.New(testenv.NewPool(t, storedb.New(t)))
	svc := NewService(st, e.defs, e.reg, "")
	drv := NewDriver(svc, nil, DriverConfig{})
	ctx := context.Background()

	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
	})
	// The charge fails for good: an unwind before the pivot undoes the
	// reservation, under the same trace.
	start := func(ctx context.Context, id string) {
		if _, _, err := svc.Start(ctx, Start{WorkflowID: id, Workflow: "order",
			Input: json.RawMessage(`{"sku":"s","amount":1}`), Principal: "p"}); err != nil {
			t.Fatal(err)
		}
		settle(t, st, StepKey(id, "reserve", 0), true)
		if _, err := drv.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		settle(t, st, StepKey(id, "charge", 0), false)
		if _, err := drv.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		rec, err := svc.Get(ctx, id)
		if err != nil || rec.Status != events.WorkflowUnwinding {
			t.Fatalf("%s: %s %v, want unwinding", id, rec.Status, err)
		}
	}
	start(trace.ContextWithSpanContext(ctx, caller), "traced")
	for _, k := range []string{StepKey("traced", "reserve", 0), StepKey("traced", "charge", 0), UndoKey("traced", "reserve", 0)} {
		if got := traceOf(t, st, k); got != caller.TraceID().String() {
			t.Errorf("%s: trace %s, want the caller's %s", k, got, caller.TraceID())
		}
	}

	start(ctx, "untraced")
	own := traceOf(t, st, StepKey("untraced", "reserve", 0))
	if own == caller.TraceID().String() || own == strings.Repeat("0", 32) {
		t.Errorf("a run started without a trace context got trace %s", own)
	}
	for _, k := range []string{StepKey("untraced", "charge", 0), UndoKey("untraced", "reserve", 0)} {
		if got := traceOf(t, st, k); got != own {
			t.Errorf("%s: trace %s, want the run's own %s", k, got, own)
		}
	}
}
