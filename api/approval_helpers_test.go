package api

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
)

// The approval tests run the real reconciler behind the API, as cmd wires
// it: *reconciler.Decider and *reconciler.Webhooks are the API's Decider and
// WebhookHandler as they are (api never imports the reconciler).

// approvalToolsFile is a tools file whose charge and reserve tools sign
// (and so accept callbacks). card_number is secret by its name, cvv by its
// schema (writeOnly).
const approvalToolsFile = `
tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "http://127.0.0.1:9/charges", timeout: 2s}
    reconcile: {method: GET, url: "http://127.0.0.1:9/charges?idempotency_key={{.Key}}"}
    signing_secret_env: CHARGE_SECRET
    args_schema:
      type: object
      required: [amount, currency]
      properties:
        amount: {type: integer, minimum: 1}
        currency: {type: string, enum: [EUR, USD]}
        card_number: {type: string}
        cvv: {type: string, writeOnly: true}
        memo: {type: string}
  - name: inventory.reserve
    effect: compensable
    invoke:     {method: POST, url: "http://127.0.0.1:9/reservations", timeout: 2s}
    compensate: {method: POST, url: "http://127.0.0.1:9/reservations/release"}
    signing_secret_env: RESERVE_SECRET
  - name: tickets.set
    effect: idempotent
    invoke: {method: POST, url: "http://127.0.0.1:9/tickets", timeout: 2s}
`

// Secrets of the test args: none may reach a response or a page.
const (
	secretCard = "4111111111111111"
	secretCVV  = "7373"
)

var secretArgs = fmt.Sprintf(`{"amount": 500, "currency": "EUR", "card_number": %q, "cvv": %q, "memo": "gift"}`, secretCard, secretCVV)

// approval is the real reconciler's side of a fixture.
type approval struct {
	reg    *tool.Registry
	secret string // payments.charge's signing secret
}

func newApproval(t testing.TB) *approval {
	t.Helper()
	secrets := map[string]string{"CHARGE_SECRET": newWebhookSecret(t), "RESERVE_SECRET": newWebhookSecret(t)}
	reg, err := httptool.Parse([]byte(approvalToolsFile), func(k string) string { return secrets[k] })
	if err != nil {
		t.Fatal(err)
	}
	return &approval{reg: reg, secret: secrets["CHARGE_SECRET"]}
}

// option wires the reconciler's decisions and webhooks, the signing tools,
// and a queue read from the event store's head table (the read model's
// projector is not running in these tests).
func (a *approval) option(t testing.TB) option {
	return func(_ *Config, d *Deps) {
		hooks, err := reconciler.NewWebhooks(d.Store, a.reg, reconciler.WebhookConfig{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		d.Tools = a.reg
		d.Operations = headOperations(d.Store)
		d.Decider = reconciler.NewDecider(d.Store)
		d.Webhooks = hooks
	}
}

// setupApproval is setup with the approval wiring.
func setupApproval(t *testing.T, opts ...option) (*fixture, *approval) {
	t.Helper()
	a := newApproval(t)
	return setup(t, append([]option{a.option(t)}, opts...)...), a
}

func openMode(c *Config, _ *Deps) { c.Open = true }

func newWebhookSecret(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// headOperations lists operations by status from the event store's head
// table, newest first: the read model as it is once the projector caught
// up.
func headOperations(st *store.Store) Operations {
	return OperationsFunc(func(ctx context.Context, f events.ListFilter) (events.ListPage, error) {
		rows, err := st.Pool().Query(ctx, `SELECT `+store.HeadColumns+` FROM operations
			WHERE $1 = '' OR status = $1 ORDER BY updated_at DESC LIMIT $2`, string(f.Status), f.Limit)
		if err != nil {
			return events.ListPage{}, err
		}
		ops, err := store.CollectHeads(rows)
		return events.ListPage{Items: ops}, err
	})
}

// journal appends events to key as the executor and reconciler would,
// numbering them after base (zero for a new operation).
func journal(t testing.TB, st *store.Store, base events.Operation, key, toolName string, class events.EffectClass, evs ...ev) events.Operation {
	t.Helper()
	now := time.Now()
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		env, err := events.New(e.typ, key, base.Seq+int64(i)+1, toolName, class, e.attempt, e.data, now)
		if err != nil {
			t.Fatal(err)
		}
		envs[i] = env
	}
	op, err := st.Append(context.Background(), store.Append{Base: base, Events: envs, TopicPrefix: "effectline."})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

type ev struct {
	typ     events.Type
	attempt int
	data    any
}

// inProgress journals an intent and its first attempt, still running.
func inProgress(t testing.TB, st *store.Store, key, toolName string, class events.EffectClass, args string) events.Operation {
	t.Helper()
	return journal(t, st, events.Operation{}, key, toolName, class,
		ev{events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(args), Principal: "billing-agent"}},
		ev{events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "test-worker",
			LeaseUntil: time.Now().Add(time.Minute)}})
}

// escalated journals what the reconciler leaves after an attempt whose
// outcome was unknown and whose effect the downstream showed absent:
// intent → attempt.started → attempt.unknown{next: reconcile} →
// reconciliation.resolved{found: false} + operation.escalated. The
// escalation's request holds the raw args on purpose: the UI must redact
// whatever it is given.
func escalated(t testing.TB, st *store.Store, key, toolName string, class events.EffectClass, args string) events.Operation {
	t.Helper()
	op := inProgress(t, st, key, toolName, class, args)
	return journal(t, st, op, key, toolName, class,
		ev{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile}},
		ev{events.ReconciliationResolved, 0, events.ReconciliationResolvedData{Found: false, Source: "reconcile"}},
		ev{events.OperationEscalated, 0, events.EscalationData{
			Reason: "absent_downstream", Request: json.RawMessage(args),
			Downstream:     json.RawMessage(`{"status_code": 404, "body": {"error": "no charge for this key"}}`),
			ProposedAction: events.ActionRetry, Detail: "the PSP has no charge under the idempotency key",
		}})
}

// lastDecision returns the data of key's last decision.recorded.
func lastDecision(t testing.TB, st *store.Store, key string) events.DecisionData {
	t.Helper()
	stored, err := st.Events(context.Background(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(stored) - 1; i >= 0; i-- {
		if stored[i].Type != events.DecisionRecorded {
			continue
		}
		d, err := stored[i].DecodeData()
		if err != nil {
			t.Fatal(err)
		}
		return *d.(*events.DecisionData)
	}
	t.Fatalf("%s has no decision", key)
	return events.DecisionData{}
}

func load(t testing.TB, st *store.Store, key string) events.Operation {
	t.Helper()
	op, err := st.Load(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return op
}
