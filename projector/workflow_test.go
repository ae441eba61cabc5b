package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

// sagaFile declares an order saga: a compensable reservation, the pivot
// (an irreversible charge, undone by a refund) and a confirmation after it.
const sagaFile = `tools:
  - name: inventory.reserve
    effect: compensable
    invoke: {url: "http://127.0.0.1:9/r"}
    compensate: {url: "http://127.0.0.1:9/release"}
  - name: payments.charge
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/c"}
  - name: payments.refund
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/f"}
  - name: email.send
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/e"}
workflows:
  - name: order
    steps:
      - {name: reserve, tool: inventory.reserve, args: {sku: "{{.Input.sku}}"}}
      - {name: charge, tool: payments.charge, args: {amount: "{{.Input.amount}}", reservation: "{{.Steps.reserve.DownstreamID}}"}, undo_with: payments.refund}
      - {name: confirm, tool: email.send, args: {text: "order {{.Input.sku}}"}}
`

// The runs of sagaRuns: one that unwinds on its own, one that escalates
// twice (after the pivot, then on a failed undo) and is unwound by
// decisions, and one still waiting on its first step.
const (
	runUnwound   = "ord-unwind"
	runEscalated = "ord-escalate"
	runRunning   = "ord-running"
)

// saga drives real workflow runs with the workflow component, playing the
// executor by journaling each step's operation to its end.
type saga struct {
	h   *harness
	svc *workflow.Service
	drv *workflow.Driver
}

// newSaga returns the saga's service and driver; pub nil leaves the
// workflow events unpublished, for tests that publish them themselves.
func newSaga(h *harness, pub workflow.Publisher) *saga {
	h.t.Helper()
	reg, err := httptool.Parse([]byte(sagaFile), nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defs, err := workflow.Parse([]byte(sagaFile), reg)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := workflow.RegisterUndoTools(reg, defs); err != nil {
		h.t.Fatal(err)
	}
	svc := workflow.NewService(h.store, defs, reg, h.kafka.WithDefaults().TopicPrefix)
	return &saga{h: h, svc: svc, drv: workflow.NewDriver(svc, pub, workflow.DriverConfig{Logger: h.log})}
}

// settle journals the rest of key's operation: one attempt that succeeded
// or failed for good.
func (s *saga) settle(key string, ok bool) {
	s.h.t.Helper()
	ctx := s.h.t.Context()
	head, err := s.h.store.Load(ctx, key)
	if err != nil {
		s.h.t.Fatalf("loading %s: %v", key, err)
	}
	at := head.UpdatedAt.Add(time.Second)
	start, err := events.New(events.AttemptStarted, key, head.Seq+1, head.Tool, head.EffectClass, 1,
		events.AttemptStartedData{DownstreamKey: key, Worker: "test-worker", LeaseUntil: at.Add(time.Minute)}, at)
	if err != nil {
		s.h.t.Fatal(err)
	}
	var end events.Envelope
	if ok {
		end, err = events.New(events.AttemptSucceeded, key, head.Seq+2, head.Tool, head.EffectClass, 1,
			events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"ds-` + key + `"}`), DownstreamID: "ds-" + key}, at)
	} else {
		end, err = events.New(events.AttemptFailed, key, head.Seq+2, head.Tool, head.EffectClass, 1,
			events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_422", StatusCode: 422}, at)
	}
	if err != nil {
		s.h.t.Fatal(err)
	}
	if _, err := s.h.store.Append(ctx, store.Append{Base: head, Events: []events.Envelope{start, end}}); err != nil {
		s.h.t.Fatalf("settling %s: %v", key, err)
	}
}

// advance takes the transitions that are due and publishes their events.
func (s *saga) advance() {
	s.h.t.Helper()
	ctx := s.h.t.Context()
	if _, err := s.drv.RunOnce(ctx); err != nil {
		s.h.t.Fatalf("advancing: %v", err)
	}
	for {
		n, err := s.drv.PublishOnce(ctx)
		if err != nil {
			s.h.t.Fatalf("publishing: %v", err)
		}
		if n == 0 {
			return
		}
	}
}

func (s *saga) start(id string) {
	s.h.t.Helper()
	_, _, err := s.svc.Start(s.h.t.Context(), workflow.Start{WorkflowID: id, Workflow: "order",
		Input: json.RawMessage(`{"sku":"sku-` + id + `","amount":1200,"card_number":"4111111111111111"}`), Principal: "billing-agent"})
	if err != nil {
		s.h.t.Fatalf("starting %s: %v", id, err)
	}
	s.advance() // publishes the start
}

func (s *saga) decide(id string, a events.WorkflowAction) {
	s.h.t.Helper()
	if _, err := s.svc.Decide(s.h.t.Context(), id, a, "checked with the customer", "ops"); err != nil {
		s.h.t.Fatalf("deciding %s on %s: %v", a, id, err)
	}
	s.advance()
}

// runAll plays the three runs and checks they ended where the saga rule
// says.
func (s *saga) runAll() {
	s.h.t.Helper()
	// The reservation succeeds, the charge (the pivot) fails for good: the
	// reservation is undone and the run ends unwound.
	s.start(runUnwound)
	s.settle(workflow.StepKey(runUnwound, "reserve", 0), true)
	s.advance()
	s.settle(workflow.StepKey(runUnwound, "charge", 0), false)
	s.advance()
	s.settle(workflow.UndoKey(runUnwound, "reserve", 0), true)
	s.advance()

	// The confirmation after the pivot fails: the run escalates; an
	// approver unwinds, the refund fails and escalates again, the approver
	// retries it, and both undos complete.
	s.start(runEscalated)
	s.settle(workflow.StepKey(runEscalated, "reserve", 0), true)
	s.advance()
	s.settle(workflow.StepKey(runEscalated, "charge", 0), true)
	s.advance()
	s.settle(workflow.StepKey(runEscalated, "confirm", 0), false)
	s.advance()
	s.decide(runEscalated, events.WorkflowUnwind)
	s.settle(workflow.UndoKey(runEscalated, "charge", 0), false)
	s.advance()
	s.decide(runEscalated, events.WorkflowRetryStep)
	s.settle(workflow.UndoKey(runEscalated, "charge", 1), true)
	s.advance()
	s.settle(workflow.UndoKey(runEscalated, "reserve", 0), true)
	s.advance()

	s.start(runRunning)

	for id, want := range map[string]events.WorkflowStatus{runUnwound: events.WorkflowUnwound,
		runEscalated: events.WorkflowUnwound, runRunning: events.WorkflowRunning} {
		rec, err := s.svc.Get(s.h.t.Context(), id)
		if err != nil || rec.Status != want {
			s.h.t.Fatalf("run %s is %s (%v), want %s", id, rec.Status, err, want)
		}
	}
	var decisions int
	if err := s.h.pool.QueryRow(s.h.t.Context(), `SELECT count(*) FROM workflow_events WHERE type = $1`,
		string(events.WorkflowDecisionRecorded)).Scan(&decisions); err != nil || decisions != 2 {
		s.h.t.Fatalf("%d decisions journaled (%v), want 2", decisions, err)
	}
}

// withWorkflows has the projector project the workflows topic too, in
// consumer group group.
func (h *harness) withWorkflows(group string) func(*projector.Config) {
	return func(c *projector.Config) {
		c.Workflows, c.WorkflowGroup = workflow.NewJournal(h.pool), group
	}
}

// headSeqs returns the seq of every run's head (the workflows table).
func (h *harness) headSeqs() map[string]int64 {
	h.t.Helper()
	return h.idSeqs(`SELECT workflow_id, seq FROM workflows`)
}

func (h *harness) idSeqs(sql string) map[string]int64 {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), sql)
	if err != nil {
		h.t.Fatalf("reading seqs: %v", err)
	}
	got := map[string]int64{}
	var (
		k string
		s int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&k, &s}, func() error { got[k] = s; return nil }); err != nil {
		h.t.Fatalf("reading seqs: %v", err)
	}
	return got
}

// waitWorkflowSeqs polls until workflow_state holds exactly the runs of
// want, each at its seq.
func (h *harness) waitWorkflowSeqs(want map[string]int64) {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := h.idSeqs(`SELECT workflow_id, seq FROM workflow_state`)
		if mapsEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("workflow projection did not converge in %s:\n got %v\nwant %v", waitTimeout, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// workflowSnapshot is snapshot for workflow_state.
func (h *harness) workflowSnapshot() map[string]string {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), `SELECT workflow_id, (to_jsonb(s) - 'projected_at')::text FROM workflow_state s`)
	if err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	out := map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	return out
}

// assertRowsAreTheHeads checks that every row of workflow_state is its
// run's head as the workflow component wrote it (the same fold), with the
// trace the run was started in, and the typed columns agree with it.
func (h *harness) assertRowsAreTheHeads() {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), `
SELECT w.workflow_id, s.workflow_id IS NOT NULL,
       coalesce(s.record = w.record AND s.seq = w.seq AND s.status = w.status AND s.workflow = w.workflow
                AND s.principal = w.record->>'principal' AND s.awaiting = coalesce(w.awaiting, '')
                AND s.current_step = coalesce(w.record->>'current_step', '')
                AND s.created_at = w.created_at AND s.updated_at = w.updated_at
                AND s.traceparent = e.traceparent AND s.traceparent <> '', false),
       coalesce(s.record::text, ''), w.record::text
  FROM workflows w
  JOIN workflow_events e ON e.workflow_id = w.workflow_id AND e.seq = 1
  LEFT JOIN workflow_state s ON s.workflow_id = w.workflow_id`)
	if err != nil {
		h.t.Fatal(err)
	}
	var (
		id, got, want string
		present, same bool
		n             int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &present, &same, &got, &want}, func() error {
		n++
		switch {
		case !present:
			h.t.Errorf("run %s has no row in workflow_state", id)
		case !same:
			h.t.Errorf("the row of run %s is not its head:\n got %s\nwant %s", id, got, want)
		}
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
	if n == 0 {
		h.t.Fatal("no runs in the journal")
	}
}

// countStream returns the projector's event counter for one stream and
// outcome.
func (r *running) countStream(t testing.TB, stream, outcome string) int64 {
	t.Helper()
	sum, _ := r.metric(t, projector.MetricEvents).(metricdata.Sum[int64])
	for _, dp := range sum.DataPoints {
		s, _ := dp.Attributes.Value("stream")
		o, _ := dp.Attributes.Value("outcome")
		if s.AsString() == stream && o.AsString() == outcome {
			return dp.Value
		}
	}
	return 0
}

// journaledWorkflowEvents returns the journaled events of id with the
// given seqs, in the order asked.
func (h *harness) journaledWorkflowEvents(id string, seqs ...int64) []events.JournaledWorkflowEvent {
	h.t.Helper()
	all, err := workflow.NewJournal(h.pool).WorkflowEvents(h.t.Context(), id, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	out := make([]events.JournaledWorkflowEvent, 0, len(seqs))
	for _, s := range seqs {
		if s < 1 || int(s) > len(all) {
			h.t.Fatalf("run %s has no seq %d (it has %d)", id, s, len(all))
		}
		out = append(out, all[s-1])
	}
	return out
}

// publishWorkflow sends journaled workflow events to the workflows topic
// in the order given, as the driver does (key and subject the workflow id,
// the run's trace context as headers); withTrace false leaves the trace
// context out, as a publisher without a propagator would.
func (h *harness) publishWorkflow(withTrace bool, evs ...events.JournaledWorkflowEvent) {
	h.t.Helper()
	recs := make([]kafka.Record, len(evs))
	for i, e := range evs {
		raw, err := json.Marshal(e.WorkflowEnvelope)
		if err != nil {
			h.t.Fatal(err)
		}
		ctx := context.Background()
		if withTrace {
			ctx = traceparent.ContextWith(ctx, e.Traceparent)
		}
		recs[i] = kafka.EventRecord(ctx, h.kafka.Topic(events.TopicWorkflows), events.Envelope{
			EventID: e.EventID, Type: events.Type(e.Type), OperationKey: e.WorkflowID, Seq: e.Seq, OccurredAt: e.OccurredAt,
		}, raw)
	}
	if err := h.prod.Send(context.Background(), recs); err != nil {
		h.t.Fatalf("publishing %d workflow events: %v", len(recs), err)
	}
}

// The projector follows real runs from the workflows topic as the driver
// publishes them: each row is its run's head; a rebuild from the journal
// writes the same table; replaying the topic from offset 0 into an empty
// table writes it again, and a replay over the full table changes nothing.
func TestWorkflowProjectionIsTheHeadsAndRebuildsTheSame(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := t.Context()
	live := h.start(projector.DefaultGroup, h.withWorkflows("wf-live"))
	s := newSaga(h, h.prod)
	s.runAll()
	heads := h.headSeqs()
	h.waitWorkflowSeqs(heads)
	h.assertRowsAreTheHeads()
	liveRows := h.workflowSnapshot()
	live.stop()
	if got := live.countStream(t, projector.StreamWorkflows, projector.OutcomeRejected); got != 0 {
		t.Errorf("%d workflow events rejected, want 0", got)
	}

	rebuilt, err := projector.Rebuild(ctx, h.store, workflow.NewJournal(h.pool))
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.Workflows != len(heads) {
		t.Errorf("Rebuild wrote %d runs, want %d", rebuilt.Workflows, len(heads))
	}
	assertSameTable(t, "rebuilt workflow_state", h.workflowSnapshot(), liveRows)
	for _, sizes := range [][2]int{{1, 1}, {3, 2}} {
		if _, err := projector.RebuildPaged(ctx, h.store, workflow.NewJournal(h.pool), sizes[0], sizes[1]); err != nil {
			t.Fatal(err)
		}
		assertSameTable(t, fmt.Sprintf("workflow_state rebuilt in pages %v", sizes), h.workflowSnapshot(), liveRows)
	}

	if _, err := h.pool.Exec(ctx, `DELETE FROM workflow_state`); err != nil {
		t.Fatal(err)
	}
	first := h.start("replay-ops-1", h.withWorkflows("wf-replay-1"))
	h.waitWorkflowSeqs(heads)
	first.stop()
	assertSameTable(t, "workflow_state replayed from offset 0 into an empty table", h.workflowSnapshot(), liveRows)
	writtenAt := h.idTimes(`SELECT workflow_id, projected_at FROM workflow_state`)

	var total int64
	for _, seq := range heads {
		total += seq
	}
	second := h.start("replay-ops-2", h.withWorkflows("wf-replay-2"))
	waitUntil(t, "the second replay to skip every workflow event", func() bool {
		return second.countStream(t, projector.StreamWorkflows, projector.OutcomeSkipped) == total
	})
	second.stop()
	if got := second.countStream(t, projector.StreamWorkflows, projector.OutcomeApplied); got != 0 {
		t.Errorf("the replay over the full table applied %d workflow events, want 0", got)
	}
	assertSameTable(t, "workflow_state after a replay over it", h.workflowSnapshot(), liveRows)
	if got := h.idTimes(`SELECT workflow_id, projected_at FROM workflow_state`); !mapsEqual(got, writtenAt) {
		t.Errorf("the replay over the full table rewrote rows: projected_at %v, was %v", got, writtenAt)
	}
}

func (h *harness) idTimes(sql string) map[string]time.Time {
	h.t.Helper()
	rows, err := h.pool.Query(h.t.Context(), sql)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]time.Time{}
	var (
		k  string
		at time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&k, &at}, func() error { out[k] = at; return nil }); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// Workflow events delivered out of order, more than once, with a gap
// before the only one delivered, or without their trace context, converge
// on the heads: an event at or below a row's seq changes nothing, and one
// further ahead is preceded by the journal's events up to it.
func TestWorkflowDuplicateAndOutOfOrderDeliveryConverges(t *testing.T) {
	t.Parallel()
	h := setup(t)
	s := newSaga(h, nil) // the test publishes
	s.runAll()
	heads := h.headSeqs()
	if heads[runUnwound] != 5 {
		t.Fatalf("run %s has %d events, want 5", runUnwound, heads[runUnwound])
	}
	run := h.start(projector.DefaultGroup, h.withWorkflows(projector.DefaultWorkflowGroup))

	// One key per run, so one partition each: the projector sees these
	// orders exactly.
	h.publishWorkflow(true, h.journaledWorkflowEvents(runUnwound, 1, 3, 2, 2, 4, 5, 5, 1)...)
	last := heads[runEscalated]
	h.publishWorkflow(true, h.journaledWorkflowEvents(runEscalated, last, 2, last-1)...)
	// The first event without a trace context: the row's trace comes from
	// the journal.
	h.publishWorkflow(false, h.journaledWorkflowEvents(runRunning, 1, 1)...)

	h.waitWorkflowSeqs(heads)
	h.assertRowsAreTheHeads()
	waitUntil(t, "every workflow message to be handled", func() bool {
		return run.countStream(t, projector.StreamWorkflows, projector.OutcomeApplied)+
			run.countStream(t, projector.StreamWorkflows, projector.OutcomeSkipped) == 8+3+2
	})
	// How many events were filled depends on how the messages were
	// batched (a batch folds in seq order); the escalated run was never
	// delivered its first event, so some were.
	if got := run.countStream(t, projector.StreamWorkflows, projector.OutcomeGapFilled); got == 0 {
		t.Errorf("no gap was filled, but run %s was never delivered its seq 1", runEscalated)
	}
	if got := run.countStream(t, projector.StreamWorkflows, projector.OutcomeRejected); got != 0 {
		t.Errorf("%d workflow events rejected, want 0", got)
	}
}

// A workflow message that is not an event, or whose key is not its
// workflow id, is rejected without blocking the run's later events.
func TestMalformedWorkflowMessagesDoNotBlockThePartition(t *testing.T) {
	t.Parallel()
	h := setup(t)
	s := newSaga(h, nil)
	s.start(runRunning)
	s.settle(workflow.StepKey(runRunning, "reserve", 0), true)
	s.advance()
	run := h.start(projector.DefaultGroup, h.withWorkflows(projector.DefaultWorkflowGroup))
	evs := h.journaledWorkflowEvents(runRunning, 1, 2)
	h.publishWorkflow(true, evs[0])
	topic := h.kafka.Topic(events.TopicWorkflows)
	raw, _ := json.Marshal(evs[1].WorkflowEnvelope)
	for _, r := range []kafka.Record{
		{Topic: topic, Key: []byte(runRunning), Value: []byte("not json")},
		{Topic: topic, Key: []byte(runRunning), Value: []byte(`{"type":"workflow.nonsense","workflow_id":"x","seq":1,"data":{}}`)},
		{Topic: topic, Key: []byte("another-key"), Value: raw},
	} {
		if err := h.prod.Send(context.Background(), []kafka.Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	h.publishWorkflow(true, evs[1])
	h.waitWorkflowSeqs(map[string]int64{runRunning: 2})
	h.assertRowsAreTheHeads()
	waitUntil(t, "three rejected messages", func() bool { return run.rejected(t) == 3 })
}

// Migration 0007 fills workflow_state from the heads of the runs recorded
// before it: each row is its run's head with the run's trace, so the
// projector takes over at the head's seq.
func TestMigrationFillsWorkflowStateFromTheHeads(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	ctx := t.Context()
	newSaga(h, nil).runAll()
	// Back to the schema before 0007, with the runs in it.
	if _, err := h.pool.Exec(ctx, `DROP TABLE workflow_state;
		CREATE INDEX workflows_status ON workflows (status, created_at, workflow_id);
		DELETE FROM effectline_migrations WHERE version = 7`); err != nil {
		t.Fatal(err)
	}
	applied, err := store.Migrate(ctx, h.pool)
	if err != nil || !slices.Equal(applied, []int{7}) {
		t.Fatalf("Migrate = %v, %v; want [7]", applied, err)
	}
	h.assertRowsAreTheHeads()
	filled := h.workflowSnapshot()
	if _, err := projector.Rebuild(ctx, h.store, workflow.NewJournal(h.pool)); err != nil {
		t.Fatal(err)
	}
	assertSameTable(t, "workflow_state filled by the migration", filled, h.workflowSnapshot())
}
