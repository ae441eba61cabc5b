package reconciler_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/reconciler"
)

func newWebhooks(t *testing.T, e *env) *reconciler.Webhooks {
	t.Helper()
	w, err := reconciler.NewWebhooks(e.st, e.tools, reconciler.WebhookConfig{
		Secrets: func(source string) (string, bool) { s, ok := e.secrets[source]; return s, ok },
		Logger:  testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// deliver signs body as source would and hands it to Handle.
func deliver(t *testing.T, e *env, w *reconciler.Webhooks, source, id string, body []byte) (events.WebhookResult, error) {
	t.Helper()
	now := time.Now()
	return w.Handle(t.Context(), source, signed(t, e.secrets[source], id, now, body), body, now)
}

func deliveries(t *testing.T, e *env, source, id string) int {
	t.Helper()
	var n int
	if err := e.st.Pool().QueryRow(t.Context(),
		`SELECT count(*) FROM webhook_deliveries WHERE source = $1 AND webhook_id = $2`, source, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWebhookAuthentication(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := newWebhooks(t, e)
	op := started(t, e.st, e.newIntent(t, "wh-auth", charge, `{"amount":1}`), time.Now().Add(time.Minute))
	body := callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_9")
	now := time.Now()

	tests := []struct {
		name    string
		source  string
		headers http.Header
		want    error
	}{
		{"forged signature", charge, signed(t, newSecret(t), "msg_forged", now, body), events.ErrBadSignature},
		{"another source's secret", charge, signed(t, e.secrets[reserve], "msg_cross", now, body), events.ErrBadSignature},
		{"no signature headers", charge, http.Header{}, events.ErrBadSignature},
		{"stale timestamp", charge, signed(t, e.secrets[charge], "msg_stale", now.Add(-10*time.Minute), body), events.ErrStaleTimestamp},
		{"timestamp from the future", charge, signed(t, e.secrets[charge], "msg_future", now.Add(10*time.Minute), body), events.ErrStaleTimestamp},
		{"unknown source", "payments.unknown", signed(t, e.secrets[charge], "msg_src", now, body), events.ErrUnknownSource},
		{"tool without a signing secret", status, signed(t, e.secrets[charge], "msg_nosecret", now, body), events.ErrUnknownSource},
	}
	for _, tt := range tests {
		res, err := w.Handle(t.Context(), tt.source, tt.headers, body, now)
		if !isErr(err, tt.want) {
			t.Fatalf("%s: Handle = %+v, %v; want %v", tt.name, res, err, tt.want)
		}
	}
	// A tampered body under a genuine signature.
	h := signed(t, e.secrets[charge], "msg_tampered", now, body)
	if _, err := w.Handle(t.Context(), charge, h, callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_evil"), now); !isErr(err, events.ErrBadSignature) {
		t.Fatalf("tampered body: %v, want events.ErrBadSignature", err)
	}
	var n int
	if err := e.st.Pool().QueryRow(t.Context(), `SELECT count(*) FROM webhook_deliveries`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d deliveries recorded for refused requests (%v), want 0", n, err)
	}
	if got, _ := e.st.Load(t.Context(), op.Key); got.Seq != op.Seq {
		t.Fatalf("a refused callback changed the operation: seq %d → %d", op.Seq, got.Seq)
	}
}

func TestWebhookResolves(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := newWebhooks(t, e)

	t.Run("in progress and unknown operations complete", func(t *testing.T) {
		inProgress := started(t, e.st, e.newIntent(t, "wh-running", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		unknown := unknownOutcome(t, e.st,
			started(t, e.st, e.newIntent(t, "wh-unknown", charge, `{"amount":1}`), time.Now().Add(time.Minute)),
			events.NextReconcile, "timeout_after_send")
		for _, op := range []events.Operation{inProgress, unknown} {
			res, err := deliver(t, e, w, charge, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_"+op.Key))
			if err != nil {
				t.Fatal(err)
			}
			if !res.Applied || res.Duplicate || res.OperationKey != op.Key || res.Status != events.StatusCompleted {
				t.Fatalf("%s: result %+v, want applied and completed", op.Key, res)
			}
			got, _ := e.st.Load(t.Context(), op.Key)
			_, evs := journal(t, e.st, op.Key)
			r := lastOf[events.ReconciliationResolvedData](t, evs, events.ReconciliationResolved)
			if got.Status != events.StatusCompleted || !r.Found || r.Source != "webhook:"+charge ||
				got.DownstreamID != "eff_"+op.Key || got.Attempt != 1 {
				t.Fatalf("%s: %s, resolution %+v", op.Key, got.Status, r)
			}
			checkReplay(t, e.st, op.Key)
		}
	})

	t.Run("the same delivery twice changes the state once", func(t *testing.T) {
		op := started(t, e.st, e.newIntent(t, "wh-dup", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		id := newWebhookID()
		body := callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_dup")
		first, err := deliver(t, e, w, charge, id, body)
		if err != nil || !first.Applied {
			t.Fatalf("first delivery: %+v, %v", first, err)
		}
		before := len(journalTypes(t, e, op.Key))
		second, err := deliver(t, e, w, charge, id, body)
		if err != nil || !second.Duplicate || second.Applied {
			t.Fatalf("second delivery: %+v, %v; want a duplicate", second, err)
		}
		if after := len(journalTypes(t, e, op.Key)); after != before {
			t.Fatalf("the duplicate appended %d events", after-before)
		}
		// A new delivery id for an operation already completed is a no-op.
		third, err := deliver(t, e, w, charge, newWebhookID(), body)
		if err != nil || third.Applied || third.Ignored != "already_completed" {
			t.Fatalf("callback for a completed operation: %+v, %v", third, err)
		}
		if after := len(journalTypes(t, e, op.Key)); after != before {
			t.Fatalf("a callback for a completed operation appended %d events", after-before)
		}
	})

	t.Run("unknown operation is recorded and ignored", func(t *testing.T) {
		id := newWebhookID()
		res, err := deliver(t, e, w, charge, id, callbackBody(reconciler.CallbackSucceeded, "never-heard-of", ""))
		if err != nil || res.Applied || res.Ignored != "unknown_operation" {
			t.Fatalf("result %+v, %v", res, err)
		}
		if deliveries(t, e, charge, id) != 1 {
			t.Fatal("an ignored delivery was not recorded: the sender would retry forever")
		}
	})

	// The delivery id is inserted before the business logic, in the same
	// transaction: when the logic fails, the id is rolled back with it, and
	// the sender's corrected retry under the same id is processed.
	t.Run("failed business logic rolls back the delivery id", func(t *testing.T) {
		op := started(t, e.st, e.newIntent(t, "wh-rollback", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		id := newWebhookID()
		if _, err := deliver(t, e, w, charge, id, []byte(`{"type":"effect.succeeded","idempotency_key":`)); !isErr(err, events.ErrInvalidPayload) {
			t.Fatalf("broken body: %v, want events.ErrInvalidPayload", err)
		}
		if _, err := deliver(t, e, w, charge, id, []byte(`{"type":"effect.succeeded"}`)); !isErr(err, events.ErrInvalidPayload) {
			t.Fatalf("body without a key: %v, want events.ErrInvalidPayload", err)
		}
		if deliveries(t, e, charge, id) != 0 {
			t.Fatal("the delivery id survived the rollback of its business logic")
		}
		res, err := deliver(t, e, w, charge, id, callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_rb"))
		if err != nil || res.Duplicate || !res.Applied {
			t.Fatalf("corrected retry under the same id: %+v, %v; want applied", res, err)
		}
	})

	t.Run("by downstream id", func(t *testing.T) {
		op := appendEvents(t, e.st, started(t, e.st, e.newIntent(t, "wh-byid", charge, `{"amount":1}`), time.Now().Add(time.Minute)),
			spec{events.AttemptSucceeded, 1, &events.AttemptSucceededData{StatusCode: 200, DownstreamID: "ch_byid", Result: []byte(`{}`)}})
		res, err := deliver(t, e, w, charge, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, "", "ch_byid"))
		if err != nil || res.OperationKey != op.Key || res.Ignored != "already_completed" {
			t.Fatalf("result %+v, %v; want the operation found by its downstream id", res, err)
		}
		// Another tool's callback never touches this tool's operations.
		res, err = deliver(t, e, w, reserve, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, "", "ch_byid"))
		if err != nil || res.OperationKey != "" || res.Ignored != "unknown_operation" {
			t.Fatalf("cross-tool callback: %+v, %v", res, err)
		}
	})

	t.Run("another tool's operation is not settled", func(t *testing.T) {
		op := started(t, e.st, e.newIntent(t, "wh-cross", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		res, err := deliver(t, e, w, reserve, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_x"))
		if err != nil || res.Applied || res.Ignored != "unknown_operation" {
			t.Fatalf("result %+v, %v", res, err)
		}
		if got, _ := e.st.Load(t.Context(), op.Key); got.Status != events.StatusInProgress {
			t.Fatalf("a callback from %s settled a %s operation: %s", reserve, charge, got.Status)
		}
	})

	// After an undo the retry runs under "<key>~c1". A success for the old
	// key speaks of the undone effect and settles nothing; one for the new
	// key settles the retry.
	t.Run("compensated keys", func(t *testing.T) {
		op := started(t, e.st, e.newIntent(t, "wh-comp", reserve, `{"amount":1}`), time.Now().Add(time.Minute))
		op = unknownOutcome(t, e.st, op, events.NextCompensate, "timeout_after_send")
		retryAt := time.Now().UTC()
		op = appendEvents(t, e.st, op,
			spec{events.CompensationStarted, 1, &events.CompensationStartedData{DownstreamKey: op.Key, Worker: "w", LeaseUntil: time.Now().Add(time.Minute)}},
			spec{events.CompensationSucceeded, 1, &events.CompensationSucceededData{StatusCode: 200, RetryAt: &retryAt}})
		// Undone, retry not started yet: the record still names the old key.
		res, err := deliver(t, e, w, reserve, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_old"))
		if err != nil || res.Applied {
			t.Fatalf("success for the undone key before the retry: %+v, %v; want ignored", res, err)
		}
		op = started(t, e.st, op, time.Now().Add(time.Minute))
		if op.DownstreamKey != op.Key+"~c1" {
			t.Fatalf("retry key %q", op.DownstreamKey)
		}
		res, err = deliver(t, e, w, reserve, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_old"))
		if err != nil || res.Applied || res.Ignored != "superseded_key" {
			t.Fatalf("success for the undone key: %+v, %v; want superseded_key", res, err)
		}
		res, err = deliver(t, e, w, reserve, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key+"~c1", "eff_new"))
		if err != nil || !res.Applied || res.OperationKey != op.Key || res.Status != events.StatusCompleted {
			t.Fatalf("success for the retry's key: %+v, %v", res, err)
		}
	})

	t.Run("a failure report on an unknown irreversible effect escalates", func(t *testing.T) {
		op := unknownOutcome(t, e.st,
			started(t, e.st, e.newIntent(t, "wh-failed", charge, `{"amount":1,"card_number":"4000056655665556"}`), time.Now().Add(time.Minute)),
			events.NextReconcile, "timeout_after_send")
		res, err := deliver(t, e, w, charge, newWebhookID(), callbackBody(reconciler.CallbackFailed, op.Key, ""))
		if err != nil || !res.Applied || res.Status != events.StatusEscalated {
			t.Fatalf("result %+v, %v; want escalated", res, err)
		}
		_, evs := journal(t, e.st, op.Key)
		r := lastOf[events.ReconciliationResolvedData](t, evs, events.ReconciliationResolved)
		esc := lastOf[events.EscalationData](t, evs, events.OperationEscalated)
		if r.Found || r.Source != "webhook:"+charge || esc.Reason != reconciler.ReasonAbsentDownstream {
			t.Fatalf("resolution %+v, escalation %+v", r, esc)
		}
		if strings.Contains(string(esc.Request), "4000056655665556") {
			t.Fatalf("escalation request leaks the card number: %s", esc.Request)
		}
		// A failure report while an attempt runs is not an answer anybody awaits.
		running := started(t, e.st, e.newIntent(t, "wh-failed-running", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		res, err = deliver(t, e, w, charge, newWebhookID(), callbackBody(reconciler.CallbackFailed, running.Key, ""))
		if err != nil || res.Applied {
			t.Fatalf("failure report on a running attempt: %+v, %v; want ignored", res, err)
		}
	})

	// Two deliveries (different ids) for one operation at once: the row
	// lock serializes them; one settles it, the other finds it completed.
	t.Run("concurrent deliveries", func(t *testing.T) {
		op := started(t, e.st, e.newIntent(t, "wh-race", charge, `{"amount":1}`), time.Now().Add(time.Minute))
		var wg sync.WaitGroup
		results := make([]events.WebhookResult, 4)
		errs := make([]error, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = deliver(t, e, w, charge, newWebhookID(), callbackBody(reconciler.CallbackSucceeded, op.Key, "eff_race"))
			}()
		}
		wg.Wait()
		applied := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if r.Applied {
				applied++
			}
		}
		if applied != 1 || countType(journalTypes(t, e, op.Key), events.ReconciliationResolved) != 1 {
			t.Fatalf("%d deliveries applied, want exactly 1", applied)
		}
	})
}
