package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
)

// The UI's tests run it mounted in the real HTTP API, with the real
// reconciler's decisions behind it, as cmd wires them.

// TestMain checks, after every test ran, that each (method, route, status)
// a test observed is documented in api/openapi.json, as the API's own tests
// do for its JSON routes.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if problems := undocumentedObservations(); len(problems) > 0 {
			fmt.Fprintln(os.Stderr, "FAIL: responses observed in tests but missing from api/openapi.json:")
			for _, p := range problems {
				fmt.Fprintln(os.Stderr, "  "+p)
			}
			code = 1
		}
	}
	os.Exit(code)
}

// observed holds "METHOD /route status" for every response a test saw.
var observed sync.Map

func observe(method, route string, status int) {
	observed.Store(method+" "+route+" "+strconv.Itoa(status), struct{}{})
}

func undocumentedObservations() []string {
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		return []string{"api/openapi.json is not valid JSON: " + err.Error()}
	}
	var problems []string
	observed.Range(func(k, _ any) bool {
		parts := strings.Fields(k.(string))
		method, route, status := strings.ToLower(parts[0]), parts[1], parts[2]
		if _, ok := doc.Paths[route][method].Responses[status]; !ok {
			problems = append(problems, k.(string))
		}
		return true
	})
	sort.Strings(problems)
	return problems
}

// routes matches a request to the UI route pattern that serves it, for the
// OpenAPI check.
var routes = func() *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range ui.New(ui.Config{}, ui.Deps{}).Routes() {
		mux.Handle(r.Pattern, http.NotFoundHandler())
	}
	return mux
}()

// Tokens of the test principals.
const (
	billingToken = "tok-billing-3f9a"
	supportToken = "tok-support-77c1"
	opsToken     = "tok-ops-0b2e-5d71"
)

// uiToolsFile is a tools file for the tests. card_number is secret by its
// name, cvv by its schema (writeOnly).
const uiToolsFile = `
tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "http://127.0.0.1:9/charges", timeout: 2s}
    reconcile: {method: GET, url: "http://127.0.0.1:9/charges?idempotency_key={{.Key}}"}
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
`

// Secrets of the test args: none may reach a page.
const (
	secretCard = "4111111111111111"
	secretCVV  = "7373"
)

var secretArgs = fmt.Sprintf(`{"amount": 500, "currency": "EUR", "card_number": %q, "cvv": %q, "memo": "gift"}`, secretCard, secretCVV)

type fixture struct {
	srv   *api.Server
	store *store.Store
	url   string
}

type option func(*api.Config, *api.Deps)

func openMode(c *api.Config, _ *api.Deps) { c.Open = true }

// setupApproval returns the API with the UI mounted on a fresh, migrated
// database, the reconciler's decisions behind it and a queue read from the
// event store's head table (no projector runs in these tests), served by
// an httptest server.
func setupApproval(t *testing.T, opts ...option) (*fixture, *tool.Registry) {
	t.Helper()
	pool := testenv.NewPool(t, testenv.NewDatabase(t))
	if _, err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	reg, err := httptool.Parse([]byte(uiToolsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{
		Tokens:    map[string]string{billingToken: "billing-agent", supportToken: "support-agent", opsToken: "ops"},
		Approvers: []string{"ops"},
		Logger:    slog.New(slog.DiscardHandler),
	}
	deps := api.Deps{Store: st, Tools: reg, Operations: headOperations(st), Decider: reconciler.NewDecider(st)}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	srv, err := api.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &fixture{srv: srv, store: st, url: ts.URL}, reg
}

// headOperations lists operations by status from the event store's head
// table, newest first: the read model as it is once the projector caught
// up.
func headOperations(st *store.Store) api.Operations {
	return api.OperationsFunc(func(ctx context.Context, f events.ListFilter) (events.ListPage, error) {
		rows, err := st.Pool().Query(ctx, `SELECT `+store.HeadColumns+` FROM operations
			WHERE $1 = '' OR status = $1 ORDER BY updated_at DESC LIMIT $2`, string(f.Status), f.Limit)
		if err != nil {
			return events.ListPage{}, err
		}
		ops, err := store.CollectHeads(rows)
		return events.ListPage{Items: ops}, err
	})
}

// countEvents returns how many events key has in the journal.
func (f *fixture) countEvents(t testing.TB, key string) int {
	t.Helper()
	evs, err := f.store.Events(context.Background(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func wantStatus(t testing.TB, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body: %s", r.status, want, bytes.TrimSpace(r.body))
	}
}

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
