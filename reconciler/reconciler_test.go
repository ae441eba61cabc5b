package reconciler_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/service"
)

// A charge whose response was lost, but which the downstream committed, is
// found by the reconcile request: the operation completes with the
// downstream's record, with no new attempt and exactly one effect. The
// trigger is the attempt.unknown message on the outcomes topic (the sweep
// of unresolved operations is pushed out of the way), behind a malformed
// message that must not block it.
func TestLostResponseOnCommittedChargeCompletes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	kcfg := newKafka(t)
	e.fake.Script(testenv.RouteInvoke, testenv.FaultLoseResponse)

	op := e.newIntent(t, "order-1/charge", charge, `{"amount":100,"currency":"EUR"}`)
	op = started(t, e.st, op, time.Now().Add(time.Minute))
	res := e.invoke(t, op)
	if res.Outcome != events.Unknown {
		t.Fatalf("lost response classified %s (%s), want unknown", res.Outcome, res.ErrorClass)
	}
	op = unknownOutcome(t, e.st, op, events.NextReconcile, res.ErrorClass)

	// Same key, so same partition, ahead of the real events.
	p, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Send(context.Background(), []kafka.Record{{Topic: kcfg.Topic(events.TopicOutcomes),
		Key: []byte(op.Key), Value: []byte(`{"not":"an event"`)}})
	_ = p.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, kcfg, op.Key)
	obs := newObserved(t)
	_, stop := runReconciler(t, e, reconciler.Config{Kafka: kcfg, SweepInterval: 50 * time.Millisecond, ResweepAfter: time.Hour,
		Base: service.Base{TracerProvider: obs.tp, MeterProvider: obs.mp}})

	op = waitFor(t, e.st, op.Key, "reconciled", statusIs(events.StatusCompleted))
	stop()
	types, evs := journal(t, e.st, op.Key)
	if got := countType(types, events.AttemptStarted); got != 1 || op.Attempt != 1 {
		t.Fatalf("%d attempts started (record says %d), want 1: %v", got, op.Attempt, types)
	}
	r := lastOf[events.ReconciliationResolvedData](t, evs, events.ReconciliationResolved)
	if !r.Found || r.Source != reconciler.SourceReconcile || r.DownstreamID != "eff_1" {
		t.Fatalf("resolution = %+v, want found by reconcile with downstream id eff_1", r)
	}
	if op.DownstreamID != "eff_1" || !strings.Contains(string(op.Result), `"eff_1"`) {
		t.Fatalf("record: downstream_id %q result %s", op.DownstreamID, op.Result)
	}
	if n := e.fake.Applied(); n != 1 {
		t.Fatalf("%d effects applied, want exactly 1", n)
	}
	if n := e.fake.Requests(testenv.RouteInvoke); n != 1 {
		t.Fatalf("%d invoke requests, want 1 (no new attempt)", n)
	}
	// The "reconciliation" span continues the operation's trace, and the
	// resolution is journaled under it.
	span := obs.span(t, "reconciliation")
	if span.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || span.SpanKind() != trace.SpanKindClient {
		t.Fatalf("reconciliation span: trace %s kind %s", span.SpanContext().TraceID(), span.SpanKind())
	}
	for k, v := range map[string]string{"effectline.operation_key": op.Key, "effectline.tool": charge,
		"effectline.effect_class": "irreversible", "effectline.attempt": "1", "effectline.reconcile_answer": "found"} {
		if got := spanAttr(span, k); got != v {
			t.Errorf("span attribute %s = %q, want %q", k, got, v)
		}
	}
	if tp := evs[len(evs)-1].Traceparent; !strings.Contains(tp, span.SpanContext().SpanID().String()) {
		t.Fatalf("the resolution's traceparent %q is not the reconciliation span %s", tp, span.SpanContext().SpanID())
	}
	if n := obs.counter(t, "effectline.reconciliations", map[string]string{"tool": charge, "answer": "found"}); n != 1 {
		t.Fatalf("effectline.reconciliations{found} = %d, want 1", n)
	}
	checkReplay(t, e.st, op.Key)
}

// A charge that did not commit is provably absent: the irreversible effect
// is never retried on its own, so the operation is escalated with evidence
// (secrets redacted) and nothing happens downstream. An approver's retry
// makes it due at once, and the real executor's poller runs it to one
// effect.
func TestAbsentChargeEscalatesAndRetryDecisionRuns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	kcfg := newKafka(t)
	e.fake.Script(testenv.RouteInvoke, testenv.FaultStallForever)

	op := e.newIntent(t, "order-2/charge", charge,
		`{"amount":250,"currency":"EUR","card_number":"4242424242424242","pin":"9731"}`)
	op = started(t, e.st, op, time.Now().Add(time.Minute))
	res := e.invoke(t, op) // times out after the request was written
	if res.Outcome != events.Unknown {
		t.Fatalf("stalled call classified %s (%s), want unknown", res.Outcome, res.ErrorClass)
	}
	op = unknownOutcome(t, e.st, op, events.NextReconcile, res.ErrorClass)
	e.publish(t, kcfg, op.Key)
	obs := newObserved(t)
	_, stopRec := runReconciler(t, e, reconciler.Config{Kafka: kcfg, SweepInterval: 50 * time.Millisecond, ResweepAfter: time.Hour,
		Base: service.Base{TracerProvider: obs.tp, MeterProvider: obs.mp}})

	op = waitFor(t, e.st, op.Key, "escalated", statusIs(events.StatusEscalated))
	stopRec()
	rs, es := obs.span(t, "reconciliation"), obs.span(t, "escalation")
	if es.Parent().SpanID() != rs.SpanContext().SpanID() || es.SpanKind() != trace.SpanKindInternal ||
		spanAttr(rs, "effectline.reconcile_answer") != "absent" {
		t.Fatalf("escalation span: parent %s (reconciliation %s), kind %s, answer %q", es.Parent().SpanID(),
			rs.SpanContext().SpanID(), es.SpanKind(), spanAttr(rs, "effectline.reconcile_answer"))
	}
	if n := obs.counter(t, "effectline.escalations", map[string]string{"tool": charge, "reason": reconciler.ReasonAbsentDownstream}); n != 1 {
		t.Fatalf("effectline.escalations{absent_downstream} = %d, want 1", n)
	}
	types, evs := journal(t, e.st, op.Key)
	n := len(types)
	if n < 2 || types[n-2] != events.ReconciliationResolved || types[n-1] != events.OperationEscalated {
		t.Fatalf("journal ends %v, want reconciliation.resolved then operation.escalated", types)
	}
	if r := lastOf[events.ReconciliationResolvedData](t, evs, events.ReconciliationResolved); r.Found || r.RetryAt != nil {
		t.Fatalf("resolution = %+v, want absent without a retry", r)
	}
	esc := lastOf[events.EscalationData](t, evs, events.OperationEscalated)
	if esc.Reason != reconciler.ReasonAbsentDownstream || esc.ProposedAction != events.ActionRetry || esc.Detail == "" {
		t.Fatalf("escalation = %+v", esc)
	}
	req := string(esc.Request)
	for _, secret := range []string{"4242424242424242", "9731"} {
		if strings.Contains(req, secret) || strings.Contains(string(esc.Downstream), secret) {
			t.Fatalf("escalation evidence leaks %q: request %s downstream %s", secret, req, esc.Downstream)
		}
	}
	var evidence struct {
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(esc.Request, &evidence); err != nil {
		t.Fatal(err)
	}
	if evidence.Args["card_number"] != "[redacted]" || evidence.Args["pin"] != "[redacted]" || evidence.Args["amount"] != 250.0 {
		t.Fatalf("request evidence args = %v, want card_number and pin redacted, amount kept", evidence.Args)
	}
	if e.fake.Applied() != 0 {
		t.Fatalf("%d effects applied, want none before the decision", e.fake.Applied())
	}

	now := time.Now()
	op, err := reconciler.Decide(t.Context(), e.st, op.Key, events.ActionRetry, "no charge in the PSP dashboard", "alice", now)
	if err != nil {
		t.Fatal(err)
	}
	if op.Status != events.StatusPending || op.DueAt == nil || !op.DueAt.Equal(now.UTC()) || !op.Approved {
		t.Fatalf("after retry: %s due %v approved %v, want pending due now and approved", op.Status, op.DueAt, op.Approved)
	}

	ex, err := executor.New(e.st, e.tools, executor.Config{Kafka: kcfg, PollInterval: 50 * time.Millisecond, Base: service.Base{Logger: testLogger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor: %v", err)
		}
	}()
	op = waitFor(t, e.st, op.Key, "retried by the executor", statusIs(events.StatusCompleted))
	if op.Attempt != 2 || e.fake.Applied() != 1 || e.fake.EffectsForKey(op.Key) != 1 {
		t.Fatalf("after the retry: attempt %d, %d effects applied (%d for the key), want attempt 2 and one effect",
			op.Attempt, e.fake.Applied(), e.fake.EffectsForKey(op.Key))
	}
	checkReplay(t, e.st, op.Key)
}

// A downstream that cannot answer is asked exactly MaxAsks times, with
// backoff, and then the operation is escalated; a tool without a reconcile
// request escalates at once. These run from the sweep of unresolved
// operations (no message is published), which also proves the sweep does
// not multiply asks for an operation already waiting for its re-ask.
func TestCannotTellEscalatesAfterMaxAsks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		fault   testenv.Fault
		maxAsks int
		tool    string
		reason  string
	}{
		{"downstream answers 500", testenv.FaultFailBeforeEffect(500, ""), 3, charge, reconciler.ReasonCannotTell},
		{"downstream stalls", testenv.FaultStallForever, 2, charge, reconciler.ReasonCannotTell},
		{"no reconcile request", testenv.FaultNone, 3, email, reconciler.ReasonCannotAsk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, testenv.WithDefaultFault(tt.fault, testenv.RouteReconcile))
			kcfg := newKafka(t)
			op := e.newIntent(t, "order-3/"+tt.tool, tt.tool, `{"amount":1}`)
			op = started(t, e.st, op, time.Now().Add(time.Minute))
			op = unknownOutcome(t, e.st, op, events.NextReconcile, "timeout_after_send")

			_, stop := runReconciler(t, e, reconciler.Config{
				Kafka: kcfg, SweepInterval: 20 * time.Millisecond, ResweepAfter: time.Millisecond,
				MaxAsks: tt.maxAsks, AskBackoff: reconciler.Backoff{Base: 20 * time.Millisecond, Max: 80 * time.Millisecond},
				AskTimeout: 300 * time.Millisecond,
			})
			op = waitFor(t, e.st, op.Key, "escalated", statusIs(events.StatusEscalated))
			stop() // every ask has returned: the count is final

			want := tt.maxAsks
			if tt.reason == reconciler.ReasonCannotAsk {
				want = 0
			}
			if got := e.fake.Requests(testenv.RouteReconcile); got != want {
				t.Fatalf("%d reconcile requests, want exactly %d", got, want)
			}
			_, evs := journal(t, e.st, op.Key)
			esc := lastOf[events.EscalationData](t, evs, events.OperationEscalated)
			if esc.Reason != tt.reason || esc.ProposedAction != events.ActionRetry || !strings.Contains(esc.Detail, "irreversible") {
				t.Fatalf("escalation = %+v, want %s proposing retry with the risk spelled out", esc, tt.reason)
			}
			var shown struct {
				Answer string `json:"answer"`
				Asks   int    `json:"asks"`
			}
			if err := json.Unmarshal(esc.Downstream, &shown); err != nil || shown.Asks != want {
				t.Fatalf("downstream evidence %s: asks %d, want %d", esc.Downstream, shown.Asks, want)
			}
			if op.Escalation == nil || op.Escalation.Reason != tt.reason {
				t.Fatalf("record's escalation = %+v", op.Escalation)
			}
			if countType(journalTypes(t, e, op.Key), events.OperationEscalated) != 1 {
				t.Fatal("escalated more than once")
			}
		})
	}
}

func journalTypes(t *testing.T, e *env, key string) []events.Type {
	types, _ := journal(t, e.st, key)
	return types
}

// A worker killed while holding the lease (attempt.started with a lease in
// the past, no outcome) is declared Unknown by the sweep, never failed, and
// what follows is the class's rule: reconcile for irreversible (the effect
// is found, no second call), a retry under the same key for idempotent, an
// undo then a retry under a new key for compensable. An undo whose worker
// died becomes compensation.failed{unknown}, and the effect still standing
// is escalated. In every case the downstream holds exactly one live effect.
func TestExpiredLease(t *testing.T) {
	t.Parallel()
	type check func(t *testing.T, e *env, kcfg kafka.Config, op events.Operation)
	runExecutor := func(t *testing.T, e *env, kcfg kafka.Config) {
		ex, err := executor.New(e.st, e.tools, executor.Config{Kafka: kcfg, PollInterval: 50 * time.Millisecond, Base: service.Base{Logger: testLogger(t)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ex.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("executor: %v", err)
			}
		})
	}
	tests := []struct {
		name       string
		tool       string
		next       events.Next
		compensate bool // the worker died during the undo, not the attempt
		check      check
	}{
		{"irreversible reconciles", charge, events.NextReconcile, false, func(t *testing.T, e *env, _ kafka.Config, op events.Operation) {
			op = waitFor(t, e.st, op.Key, "reconciled", statusIs(events.StatusCompleted))
			if op.Attempt != 1 || e.fake.Requests(testenv.RouteInvoke) != 1 || e.fake.Applied() != 1 {
				t.Fatalf("attempt %d, %d invokes, %d effects: want one of each", op.Attempt,
					e.fake.Requests(testenv.RouteInvoke), e.fake.Applied())
			}
		}},
		{"idempotent retries under the same key", status, events.NextRetry, false, func(t *testing.T, e *env, kcfg kafka.Config, op events.Operation) {
			op = waitFor(t, e.st, op.Key, "due for a retry", func(op events.Operation) bool {
				return op.Status == events.StatusPending && op.DueAt != nil
			})
			runExecutor(t, e, kcfg)
			op = waitFor(t, e.st, op.Key, "retried", statusIs(events.StatusCompleted))
			if op.Attempt != 2 || e.fake.Applied() != 1 || e.fake.EffectsForKey(op.Key) != 1 {
				t.Fatalf("attempt %d, %d effects: the retry must be deduplicated downstream", op.Attempt, e.fake.Applied())
			}
		}},
		{"compensable undoes, then retries under a new key", reserve, events.NextCompensate, false, func(t *testing.T, e *env, kcfg kafka.Config, op events.Operation) {
			op = waitFor(t, e.st, op.Key, "due for the undo", func(op events.Operation) bool {
				return op.Status == events.StatusPending && op.Phase == events.PhaseCompensation && op.DueAt != nil
			})
			runExecutor(t, e, kcfg)
			op = waitFor(t, e.st, op.Key, "undone and retried", statusIs(events.StatusCompleted))
			if e.fake.EffectsForKey(op.Key) != 0 || e.fake.EffectsForKey(op.Key+"~c1") != 1 || e.fake.Effects() != 1 {
				t.Fatalf("live effects: %d under %s, %d under ~c1, %d in all; want only the retry's",
					e.fake.EffectsForKey(op.Key), op.Key, e.fake.EffectsForKey(op.Key+"~c1"), e.fake.Effects())
			}
		}},
		{"undo's worker died: escalated", reserve, events.NextCompensate, true, func(t *testing.T, e *env, _ kafka.Config, op events.Operation) {
			op = waitFor(t, e.st, op.Key, "escalated", statusIs(events.StatusEscalated))
			_, evs := journal(t, e.st, op.Key)
			f := lastOf[events.CompensationFailedData](t, evs, events.CompensationFailed)
			if f.Outcome != events.Unknown || f.ErrorClass != "lease_expired" {
				t.Fatalf("compensation.failed = %+v", f)
			}
			esc := lastOf[events.EscalationData](t, evs, events.OperationEscalated)
			if esc.Reason != reconciler.ReasonCompensationFailed || esc.ProposedAction != events.ActionCompensate {
				t.Fatalf("escalation = %+v", esc)
			}
			if e.fake.Effects() != 1 {
				t.Fatalf("%d live effects, want the one the undo never released", e.fake.Effects())
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			kcfg := newKafka(t)
			op := e.newIntent(t, "order-4/"+tt.tool, tt.tool, `{"amount":3}`)
			past := time.Now().Add(-time.Second)
			if !tt.compensate {
				op = started(t, e.st, op, past)
				if r := e.invoke(t, op); r.Outcome != events.Succeeded {
					t.Fatalf("invoke: %s %v", r.Outcome, r.Err)
				}
				// ...and the worker is SIGKILLed before journaling the outcome.
			} else {
				op = started(t, e.st, op, time.Now().Add(time.Minute))
				e.invoke(t, op)
				op = unknownOutcome(t, e.st, op, events.NextCompensate, "timeout_after_send")
				op = appendEvents(t, e.st, op, spec{events.CompensationStarted, op.Attempt, &events.CompensationStartedData{
					DownstreamKey: op.DownstreamKey, Worker: "worker-1", LeaseUntil: past,
				}})
			}
			obs := newObserved(t)
			runReconciler(t, e, reconciler.Config{Kafka: kcfg, SweepInterval: 20 * time.Millisecond, ResweepAfter: time.Hour,
				Base: service.Base{TracerProvider: obs.tp, MeterProvider: obs.mp}})
			tt.check(t, e, kcfg, op)
			if n := obs.counter(t, "effectline.leases_expired", map[string]string{"tool": tt.tool}); n != 1 {
				t.Fatalf("effectline.leases_expired = %d, want 1", n)
			}

			_, evs := journal(t, e.st, op.Key)
			if !tt.compensate {
				u := lastOf[events.AttemptUnknownData](t, evs, events.AttemptUnknown)
				if u.ErrorClass != "lease_expired" || u.Next != tt.next {
					t.Fatalf("attempt.unknown = %+v, want lease_expired with next %s", u, tt.next)
				}
			}
			for _, ev := range evs {
				if ev.Type == events.AttemptFailed {
					t.Fatal("an expired lease was journaled as a failure")
				}
			}
			checkReplay(t, e.st, op.Key)
		})
	}
}

// A lease the executor renewed (the column, not the record) is not expired.
func TestRenewedLeaseIsNotExpired(t *testing.T) {
	t.Parallel()
	e := setup(t)
	kcfg := newKafka(t)
	past := time.Now().Add(-time.Second)
	renewed := started(t, e.st, e.newIntent(t, "renewed", charge, `{"amount":1}`), past)
	if ok, err := e.st.ExtendLease(t.Context(), renewed.Key, renewed.Seq, time.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("ExtendLease = %v, %v", ok, err)
	}
	witness := started(t, e.st, e.newIntent(t, "witness", charge, `{"amount":1}`), past)
	runReconciler(t, e, reconciler.Config{Kafka: kcfg, SweepInterval: 20 * time.Millisecond, ResweepAfter: time.Hour})
	waitFor(t, e.st, witness.Key, "the witness's lease expired", func(op events.Operation) bool { return op.Seq > witness.Seq })
	op, err := e.st.Load(t.Context(), renewed.Key)
	if err != nil {
		t.Fatal(err)
	}
	if op.Seq != renewed.Seq || op.Status != events.StatusInProgress {
		t.Fatalf("a renewed lease was expired: %s at seq %d", op.Status, op.Seq)
	}
}

// Two reconcilers on one database: only the holder of the advisory lock
// sweeps, every expired lease is handled exactly once, and when the leader
// stops the other takes over.
func TestOneSweeperAtATime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	kcfg := newKafka(t)
	const n = 8
	keys := make([]string, n)
	for i := range n {
		op := started(t, e.st, e.newIntent(t, "batch/"+string(rune('a'+i)), charge, `{"amount":1}`), time.Now().Add(-time.Second))
		e.invoke(t, op)
		keys[i] = op.Key
	}
	cfg := reconciler.Config{Kafka: kcfg, SweepInterval: 10 * time.Millisecond, ResweepAfter: time.Hour}
	a, stopA := runReconciler(t, e, cfg)
	b, stopB := runReconciler(t, e, cfg)

	// Sample leadership while the sweeps run: never both at once.
	var mu sync.Mutex
	both, leaderSeen := false, false
	sampleDone := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for {
			la, lb := a.Leader(), b.Leader()
			mu.Lock()
			both = both || (la && lb)
			leaderSeen = leaderSeen || la || lb
			mu.Unlock()
			select {
			case <-stopSampling:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	for _, k := range keys {
		waitFor(t, e.st, k, "reconciled", statusIs(events.StatusCompleted))
	}
	var holders int
	if err := e.st.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = $1`, reconciler.DefaultLeaderLockKey).Scan(&holders); err != nil {
		t.Fatal(err)
	}
	close(stopSampling)
	<-sampleDone
	if both || !leaderSeen {
		t.Fatalf("leadership: both at once %v, any leader %v", both, leaderSeen)
	}
	if holders != 1 {
		t.Fatalf("%d sessions hold the sweeper lock, want 1", holders)
	}
	for _, k := range keys {
		types := journalTypes(t, e, k)
		if countType(types, events.AttemptUnknown) != 1 || countType(types, events.ReconciliationResolved) != 1 {
			t.Fatalf("%s: %v, want one attempt.unknown and one resolution", k, types)
		}
	}
	if e.fake.Applied() != n || e.fake.Requests(testenv.RouteInvoke) != n {
		t.Fatalf("%d effects, %d invokes, want %d each", e.fake.Applied(), e.fake.Requests(testenv.RouteInvoke), n)
	}

	// Failover: stop the leader; the other takes the lock.
	leader, other, stopLeader := a, b, stopA
	if b.Leader() {
		leader, other, stopLeader = b, a, stopB
	}
	stopLeader()
	if leader.Leader() {
		t.Fatal("a stopped reconciler still reports leadership")
	}
	deadline := time.Now().Add(20 * time.Second)
	for !other.Leader() {
		if time.Now().After(deadline) {
			t.Fatal("the other reconciler never took over the sweep")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
