package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/service"
)

func TestOperationKey(t *testing.T) {
	t.Parallel()
	key, err := outbox.OperationKey("order-42", "charge")
	if err != nil || key != "wf:order-42/charge" {
		t.Fatalf(`OperationKey("order-42", "charge") = %q, %v; want "wf:order-42/charge"`, key, err)
	}
	again, _ := outbox.OperationKey("order-42", "charge")
	if again != key {
		t.Fatalf("OperationKey is not deterministic: %q then %q", key, again)
	}
	// A workflow id may contain '/': the step never does, so the last '/'
	// splits the parts and distinct pairs give distinct keys.
	k1, err1 := outbox.OperationKey("tenant/7/order-42", "charge")
	k2, err2 := outbox.OperationKey("tenant/7", "order-42")
	if err1 != nil || err2 != nil || k1 == k2 {
		t.Fatalf("keys %q (%v) and %q (%v); want two distinct valid keys", k1, err1, k2, err2)
	}

	for _, tc := range []struct {
		name, workflow, step, field string
	}{
		{"empty workflow", "", "charge", "workflow_id"},
		{"empty step", "order-42", "", "step"},
		{"slash in step", "order-42", "charge/retry", "step"},
		{"too long", strings.Repeat("x", events.MaxOperationKeyBytes), "charge", "operation_key"},
		{"NUL", "order\x0042", "charge", "operation_key"},
		{"invalid UTF-8", "order-\xff", "charge", "operation_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := outbox.OperationKey(tc.workflow, tc.step)
			var ie *outbox.InvalidIntentError
			if !errors.As(err, &ie) || ie.Field != tc.field || !errors.Is(err, outbox.ErrInvalidIntent) {
				t.Fatalf("OperationKey = %q, %v; want an InvalidIntentError on %s", key, err, tc.field)
			}
		})
	}
}

// TestAppendValidation needs no database: invalid intents are refused
// before the transaction is touched (tx is nil here).
func TestAppendValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(*outbox.Intent)
		field string
	}{
		{"no key", func(in *outbox.Intent) { in.OperationKey = "" }, "operation_key"},
		{"key too long", func(in *outbox.Intent) { in.OperationKey = strings.Repeat("k", events.MaxOperationKeyBytes+1) }, "operation_key"},
		// The one key rule of events.CheckOperationKey, the API's and the
		// decoder's too: a key with a newline used to pass here.
		{"key with a newline", func(in *outbox.Intent) { in.OperationKey = "wf:o-1\nreserve" }, "operation_key"},
		{"key with a NUL", func(in *outbox.Intent) { in.OperationKey = "wf:o-1\x00" }, "operation_key"},
		{"key of invalid UTF-8", func(in *outbox.Intent) { in.OperationKey = "wf:o-\xff" }, "operation_key"},
		{"key with DEL", func(in *outbox.Intent) { in.OperationKey = "wf:o-1\x7f" }, "operation_key"},
		{"no tool", func(in *outbox.Intent) { in.Tool = "" }, "tool"},
		{"no class", func(in *outbox.Intent) { in.EffectClass = "" }, "effect_class"},
		{"unknown class", func(in *outbox.Intent) { in.EffectClass = "retryable" }, "effect_class"},
		{"no principal", func(in *outbox.Intent) { in.Principal = "" }, "principal"},
		{"no args", func(in *outbox.Intent) { in.Args = nil }, "args"},
		{"array args", func(in *outbox.Intent) { in.Args = json.RawMessage(`[1,2]`) }, "args"},
		{"broken args", func(in *outbox.Intent) { in.Args = json.RawMessage(`{"a":`) }, "args"},
		{"duplicate member", func(in *outbox.Intent) { in.Args = json.RawMessage(`{"a":1,"a":2}`) }, "args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testIntent("wf:o-1/reserve")
			tc.edit(&in)
			_, err := outbox.Append(context.Background(), nil, in)
			var ie *outbox.InvalidIntentError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("Append = %v; want an InvalidIntentError on %s", err, tc.field)
			}
		})
	}
	// One invalid intent refuses the whole call before anything is sent.
	_, err := outbox.AppendMany(context.Background(), nil, []outbox.Intent{testIntent("a"), {OperationKey: "b"}})
	if !errors.Is(err, outbox.ErrInvalidIntent) || !strings.Contains(err.Error(), "intent 2 of 2 (b)") {
		t.Fatalf("AppendMany with one invalid intent = %v; want ErrInvalidIntent naming intent 2", err)
	}
}

// TestAppendIsPartOfTheCallersTransaction: a rolled-back transaction leaves
// no intent, no outbox row and no message; a committed one gives exactly one
// message on each of the intent's topics, keyed by the operation key, with
// the CloudEvents headers and a traceparent that continues the agent's
// trace through the relay's span.
func TestAppendIsPartOfTheCallersTransaction(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	if _, err := h.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	agentCtx, agentSpan := tp.Tracer("agent").Start(ctx, "agent step")
	defer agentSpan.End()

	relay := outbox.NewRelay(h.store, h.producer(t), outbox.RelayConfig{Base: service.Base{TracerProvider: tp, Logger: newTestLogger(t).logs}})
	runRelay(t, relay)

	businessTx := func(orderID string, commit bool) {
		t.Helper()
		tx, err := h.pool.Begin(agentCtx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(agentCtx, `INSERT INTO orders (id, total) VALUES ($1, 4200)`, orderID); err != nil {
			t.Fatal(err)
		}
		key, err := outbox.OperationKey(orderID, "reserve")
		if err != nil {
			t.Fatal(err)
		}
		got, err := outbox.Append(agentCtx, tx, testIntent(key))
		if err != nil || !got.Created || got.Operation.Status != events.StatusPending || got.Operation.Seq != 1 {
			t.Fatalf("Append = %+v, %v; want a new pending operation", got, err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	businessTx("o-rolled-back", false)
	businessTx("o-committed", true)

	var rows int
	if err := h.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM operations WHERE operation_key = 'wf:o-rolled-back/reserve')
		+ (SELECT count(*) FROM events WHERE operation_key = 'wf:o-rolled-back/reserve')
		+ (SELECT count(*) FROM outbox WHERE operation_key = 'wf:o-rolled-back/reserve')
		+ (SELECT count(*) FROM orders WHERE id = 'o-rolled-back')`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("the rolled-back transaction left %d rows", rows)
	}

	// Once the outbox is empty the relay has published everything it ever
	// will; then each topic must hold exactly the committed intent.
	eventual(t, 10*time.Second, "the outbox to drain", func() bool {
		n, _, err := h.store.OutboxBacklog(ctx)
		return err == nil && n == 0
	})
	op, err := h.store.Load(ctx, "wf:o-committed/reserve")
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"effectline.intents", "effectline.outcomes"} {
		recs := consume(t, h.broker.Addrs, topic, 2*time.Second, func(rs []*kgo.Record) bool { return len(rs) > 1 })
		if len(recs) != 1 {
			t.Fatalf("%s holds %d messages; want exactly 1", topic, len(recs))
		}
		checkIntentMessage(t, recs[0], op, agentSpan.SpanContext(), spans)
	}

	// One "relay publish" span per message, children of the agent's span.
	var publishSpans int
	for _, s := range spans.Ended() {
		if s.Name() != "relay publish" {
			continue
		}
		publishSpans++
		if s.SpanKind() != trace.SpanKindProducer || s.Parent().SpanID() != agentSpan.SpanContext().SpanID() {
			t.Errorf("relay publish span: kind %v, parent %v; want a producer span under the agent's span", s.SpanKind(), s.Parent().SpanID())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		for k, want := range map[attribute.Key]string{
			"effectline.operation_key": op.Key,
			"effectline.event_type":    "intent.recorded",
		} {
			if v, ok := attrs.Value(k); !ok || v.AsString() != want {
				t.Errorf("relay publish span: %s = %v; want %s", k, v.Emit(), want)
			}
		}
		if v, ok := attrs.Value("effectline.seq"); !ok || v.AsInt64() != 1 {
			t.Errorf("relay publish span: effectline.seq = %v; want 1", v.Emit())
		}
		if _, ok := attrs.Value("messaging.destination.name"); !ok {
			t.Errorf("relay publish span: no messaging.destination.name")
		}
	}
	if publishSpans != 2 {
		t.Errorf("%d relay publish spans; want 2 (one per topic)", publishSpans)
	}
}

func checkIntentMessage(t *testing.T, r *kgo.Record, op events.Operation, agent trace.SpanContext, spans *tracetest.SpanRecorder) {
	t.Helper()
	e := decodeRecord(t, r)
	if string(r.Key) != op.Key || e.Type != events.IntentRecorded || e.Seq != 1 {
		t.Fatalf("%s: key %q, %s seq %d; want %s intent.recorded seq 1", r.Topic, r.Key, e.Type, e.Seq, op.Key)
	}
	h := map[string]string{}
	for _, hd := range r.Headers {
		h[hd.Key] = string(hd.Value)
	}
	for k, want := range map[string]string{
		kafka.HeaderSpecVersion: "1.0",
		kafka.HeaderID:          e.EventID,
		kafka.HeaderType:        "intent.recorded",
		kafka.HeaderSubject:     op.Key,
		kafka.HeaderSource:      kafka.Source,
		kafka.HeaderContentType: "application/json",
	} {
		if h[k] != want {
			t.Errorf("%s: header %s = %q; want %q", r.Topic, k, h[k], want)
		}
	}
	if at, err := time.Parse(time.RFC3339Nano, h[kafka.HeaderTime]); err != nil || !at.Equal(e.OccurredAt) {
		t.Errorf("%s: header ce_time = %q; want %s", r.Topic, h[kafka.HeaderTime], e.OccurredAt)
	}
	// traceparent: same trace as the agent, parent = the relay's span.
	parts := strings.Split(h[kafka.HeaderTraceparent], "-")
	if len(parts) != 4 || parts[1] != agent.TraceID().String() {
		t.Fatalf("%s: traceparent %q; want the agent's trace %s", r.Topic, h[kafka.HeaderTraceparent], agent.TraceID())
	}
	found := false
	for _, s := range spans.Ended() {
		if s.Name() == "relay publish" && s.SpanContext().SpanID().String() == parts[2] {
			found = true
		}
	}
	if !found {
		t.Errorf("%s: traceparent %q does not name a relay publish span", r.Topic, h[kafka.HeaderTraceparent])
	}
}

// TestAppendSameKey: the same key with the same call is a no-op returning
// the recorded operation; with other args (or another tool) it is a
// PayloadConflictError, writes nothing, and leaves the caller's transaction
// usable.
func TestAppendSameKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	if _, err := h.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	const key = "wf:o-1/charge"
	first := testIntent(key)
	first.Args = json.RawMessage(`{"sku":"A-1","qty":2}`)
	var created outbox.Appended
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		var err error
		created, err = outbox.Append(ctx, tx, first)
		return err
	})
	if err != nil || !created.Created {
		t.Fatalf("first Append = %+v, %v", created, err)
	}

	// The same args serialized differently: same canonical form, same hash.
	same := first
	same.Args = json.RawMessage(" {\n \"qty\": 2.0, \"sku\": \"A-1\" }")
	var again outbox.Appended
	err = pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		var err error
		again, err = outbox.Append(ctx, tx, same)
		return err
	})
	if err != nil || again.Created || again.Operation.Key != key || again.Operation.PayloadHash != created.Operation.PayloadHash {
		t.Fatalf("Append with the same args = %+v, %v; want Created false and the recorded operation", again, err)
	}

	for _, tc := range []struct {
		name   string
		edit   func(*outbox.Intent)
		reason string
	}{
		{"other args", func(in *outbox.Intent) { in.Args = json.RawMessage(`{"sku":"A-1","qty":3}`) }, ""},
		{"other tool", func(in *outbox.Intent) { in.Tool = "inventory.release" }, "tool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := first
			tc.edit(&other)
			err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
				_, err := outbox.Append(ctx, tx, other)
				var pc *outbox.PayloadConflictError
				if !errors.As(err, &pc) || !errors.Is(err, outbox.ErrPayloadConflict) || !outbox.IsPayloadConflict(err) {
					t.Fatalf("Append = %v; want a PayloadConflictError", err)
				}
				if pc.OperationKey != key || pc.ExistingHash != created.Operation.PayloadHash || pc.NewHash == "" ||
					!strings.Contains(pc.Reason, tc.reason) {
					t.Fatalf("conflict = %+v", pc)
				}
				if tc.reason == "" && pc.NewHash == pc.ExistingHash {
					t.Fatalf("conflict on args with equal hashes: %+v", pc)
				}
				// The conflict did not abort the caller's transaction.
				_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, tc.name)
				return err
			})
			if err != nil {
				t.Fatalf("the caller's transaction failed after a conflict: %v", err)
			}
		})
	}

	var evs, rows, orders int
	if err := h.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM events WHERE operation_key = $1),
		(SELECT count(*) FROM outbox WHERE operation_key = $1), (SELECT count(*) FROM orders)`, key).Scan(&evs, &rows, &orders); err != nil {
		t.Fatal(err)
	}
	if evs != 1 || rows != 2 || orders != 2 {
		t.Fatalf("after the repeats: %d events, %d outbox rows, %d orders; want 1, 2, 2", evs, rows, orders)
	}
}

// TestAppendMany: several intents in one transaction, pipelined; a key
// repeated with the same call inside the batch is reported as existing.
func TestAppendMany(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()

	keys := []string{"wf:o-9/reserve", "wf:o-9/charge", "wf:o-9/confirm", "wf:o-9/reserve"}
	ins := make([]outbox.Intent, len(keys))
	for i, k := range keys {
		ins[i] = testIntent(k)
	}
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := outbox.AppendMany(ctx, tx, ins)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, true, false} {
		if res[i].Created != want || res[i].Operation.Key != keys[i] {
			t.Errorf("result %d = %s created %v; want %s created %v", i, res[i].Operation.Key, res[i].Created, keys[i], want)
		}
	}

	// A conflict inside the batch fails the call; the caller rolls back.
	bad := testIntent("wf:o-9/charge")
	bad.Args = json.RawMessage(`{"other":true}`)
	if _, err := outbox.AppendMany(ctx, tx, []outbox.Intent{testIntent("wf:o-9/ship"), bad}); !outbox.IsPayloadConflict(err) {
		t.Fatalf("AppendMany with a conflicting intent = %v; want a PayloadConflictError", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	n, _, err := h.store.OutboxBacklog(ctx)
	if err != nil || n != 8 {
		t.Fatalf("outbox holds %d rows, %v; want 8 (4 intents × 2 topics)", n, err)
	}
}
