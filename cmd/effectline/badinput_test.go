package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// badInputTools is the tools file of the bad-input tests: an idempotent
// tool without a schema, and an irreversible one with an args schema, a
// short timeout and a signing secret (so it accepts webhooks).
const badInputTools = `tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "URL/effects/cache", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 1s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    signing_secret_env: EFFECTLINE_TEST_CHARGE_SECRET
    args_schema:
      type: object
      required: [amount, currency]
      properties:
        amount: {type: integer, minimum: 1}
        currency: {type: string, enum: [EUR, USD]}
`

// badCase is one line of the bad-input table.
type badCase struct {
	input, want, got string
	journaled        int
	ok               bool
}

type badTable struct {
	mu    sync.Mutex
	title string
	rows  []badCase
}

func (b *badTable) add(t *testing.T, c badCase) {
	t.Helper()
	b.mu.Lock()
	b.rows = append(b.rows, c)
	b.mu.Unlock()
	if !c.ok {
		t.Errorf("%s: want %s, got %s (journaled %d)", c.input, c.want, c.got, c.journaled)
	}
}

func (b *badTable) log(t *testing.T) {
	t.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s\n%-48s %-9s  %-44s  %s\n", b.title, "input", "journaled", "got", "want")
	for _, r := range b.rows {
		fmt.Fprintf(&sb, "%-48s %9d  %-44s  %s\n", r.input, r.journaled, r.got, r.want)
	}
	t.Log(sb.String())
}

// TestBadInputStartup starts the binary with configurations it must refuse
// and checks that it exits non-zero at once, with an error that says what
// to fix.
func TestBadInputStartup(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	table := &badTable{title: "bad configuration: the binary refuses to start"}
	t.Cleanup(func() { table.log(t) })
	toolsFile := func(t *testing.T, body string) string {
		p := filepath.Join(t.TempDir(), "tools.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const inlineSecret = "whsec_c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGVhaw=="
	cases := []struct {
		name  string
		env   map[string]string
		args  []string
		wants []string
		never string // must not appear in the output
	}{
		{
			name: "tools file: unknown key",
			env: map[string]string{envTools: `tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "http://127.0.0.1:9/effects"}
    retries: 3
`},
			wants: []string{`tool "cache.set": retries: unknown key`},
		},
		{
			name: "tools file: inline secret",
			env: map[string]string{envTools: `tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "http://127.0.0.1:9/charges"}
    signing_secret: ` + inlineSecret + `
`},
			wants: []string{`tool "payments.charge": signing_secret: secrets must not be written in the tools file`},
			never: inlineSecret,
		},
		{
			name: "tools file: compensable without compensate",
			env: map[string]string{envTools: `tools:
  - name: inventory.reserve
    effect: compensable
    invoke: {method: POST, url: "http://127.0.0.1:9/reservations"}
`},
			wants: []string{`tool "inventory.reserve": compensate: required for a compensable tool`},
		},
		{
			name:  "database URL on a closed port",
			env:   map[string]string{envDatabaseURL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", testenv.FreePort(t))},
			wants: []string{"PostgreSQL must be running and reachable through EFFECTLINE_DATABASE_URL"},
		},
		{
			name:  "run without EFFECTLINE_KAFKA_BROKERS",
			env:   map[string]string{envKafkaBrokers: ""},
			wants: []string{"EFFECTLINE_KAFKA_BROKERS is required"},
		},
		{
			name:  "run --components api without tokens",
			args:  []string{"run", "--components", "api"},
			wants: []string{"refusing to start an API without EFFECTLINE_API_TOKENS", "--insecure-open"},
		},
		{
			name:  "run --components api with a one-character token",
			args:  []string{"run", "--components", "api"},
			env:   map[string]string{envAPITokens: "ops=Z", envApprovers: "ops"},
			wants: []string{"the token of ops is 1 characters; at least 16 are required"},
		},
		{
			name:  "run --components api with an approver without a token",
			args:  []string{"run", "--components", "api"},
			env:   map[string]string{envAPITokens: "billing-agent=tok-billing-0123456789", envApprovers: "alice"},
			wants: []string{"EFFECTLINE_APPROVERS names alice, who has no token in EFFECTLINE_API_TOKENS"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{
				envDatabaseURL:  db,
				envKafkaBrokers: "127.0.0.1:9", // never reached: the refusal comes first
				envTools:        toolsFile(t, "tools: []\n"),
				envHTTPAddr:     "127.0.0.1:0",
			}
			for k, v := range c.env {
				switch {
				case k == envTools:
					env[k] = toolsFile(t, v)
				case v == "":
					delete(env, k)
				default:
					env[k] = v
				}
			}
			args := c.args
			if args == nil {
				args = []string{"run", "--components", "executor"}
			}
			started := time.Now()
			p := start(t, "effectline (bad config)", env, args...)
			err := p.wait(30 * time.Second)
			out := p.output()
			row := badCase{input: c.name, want: "exit 1, says " + strconv.Quote(c.wants[0])}
			code := -1
			if p.cmd.ProcessState != nil {
				code = p.cmd.ProcessState.ExitCode()
			}
			row.got = fmt.Sprintf("exit %d after %s", code, time.Since(started).Round(10*time.Millisecond))
			row.ok = err != nil && code == 1
			for _, want := range c.wants {
				if !strings.Contains(out, want) {
					row.ok = false
					t.Errorf("the output does not say %q:\n%s", want, out)
				}
			}
			if row.ok {
				row.got += ", says it"
			}
			if c.never != "" && strings.Contains(out, c.never) {
				row.ok = false
				t.Errorf("the output repeats the secret:\n%s", out)
			}
			table.add(t, row)
		})
	}
}

// badAPI talks to the binary's HTTP API.
type badAPI struct {
	base string
	hc   *http.Client
}

type badAnswer struct {
	status int
	body   map[string]any
	raw    string
}

func (a badAnswer) String() string {
	s := strconv.Itoa(a.status)
	if code, ok := a.body["error"].(string); ok {
		s += " " + code
	}
	if field, ok := a.body["field"].(string); ok {
		s += " field " + field
	}
	if st, ok := a.body["status"].(string); ok {
		s += " " + st
	}
	return s
}

func (c badAPI) do(t *testing.T, method, path string, header http.Header, body []byte) badAnswer {
	t.Helper()
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := badAnswer{status: resp.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (c badAPI) intent(t *testing.T, key, tool, args string) badAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"operation_key":%q,"tool":%q,"args":%s}`, key, tool, args)
	return c.do(t, http.MethodPost, "/v1/intents", nil, []byte(body))
}

// badJournaled counts the events stored for key.
func badJournaled(ctx context.Context, t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE operation_key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func badTotalEvents(ctx context.Context, t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func badWaitStatus(ctx context.Context, t *testing.T, st *store.Store, key string, want events.Status) events.Operation {
	t.Helper()
	var op events.Operation
	if !waitForSoft(ctx, func() bool {
		var err error
		op, err = st.Load(ctx, key)
		return err == nil && op.Status == want
	}) {
		t.Fatalf("%s: status %q, want %s", key, op.Status, want)
	}
	return op
}

// TestBadInputEndToEnd sends bad input to a running binary (API, Kafka,
// webhooks) and checks that each gets a clear refusal and loses nothing:
// nothing is journaled for the bad request, and the good work around it
// goes through.
func TestBadInputEndToEnd(t *testing.T) {
	t.Parallel()
	// An envelope over events.MaxEnvelopeBytes (1 MiB) does not fit under
	// Kafka's default message.max.bytes (1048588 bytes for the whole batch),
	// so a broker with defaults refuses it at produce time. The broker here
	// allows 4 MiB, as a deployment that raised the limit would, so that the
	// oversized envelope reaches the executor and its own check is tested.
	w := newFaultWorld(t, faultWorldOptions{
		tools:      badInputTools,
		brokerOpts: []testenv.BrokerOption{testenv.WithKfakeOptions(kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(4 << 20)}))},
	})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := untilCtx(t, 3*time.Minute)
	secret := badSigningSecret(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := start(t, "effectline (api)", w.with(map[string]string{
		envInsecureOpenAPI:              "true",
		envHTTPAddr:                     addr,
		"EFFECTLINE_TEST_CHARGE_SECRET": secret,
	}), "run", "--components", faultComponents+",api")
	api := badAPI{base: "http://" + addr, hc: &http.Client{Timeout: 30 * time.Second}}
	waitFor(t, ctx, "the API to be ready", func() bool {
		resp, err := api.hc.Get(api.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	table := &badTable{title: "bad input, end to end: a clear refusal, nothing lost"}
	t.Cleanup(func() { table.log(t) })

	t.Run("api", func(t *testing.T) {
		before := badTotalEvents(ctx, t, pool)
		big := `{"pad":"` + strings.Repeat("x", 1<<20) + `"}`
		cases := []struct {
			input, key, tool, args string
			raw                    string // the whole body, when not an intent
			status                 int
			code, field            string
		}{
			{input: "oversized body (1 MiB of args)", key: "bad/oversized", tool: "cache.set", args: big,
				status: 413, code: "payload_too_large"},
			{input: "malformed JSON (truncated)", key: "bad/truncated", raw: `{"operation_key":"bad/truncated","tool":"cache.set","args":{`,
				status: 400, code: "invalid_json"},
			{input: "malformed intent (operation_key a number)", key: "bad/number", raw: `{"operation_key":7,"tool":"cache.set","args":{}}`,
				status: 400, code: "invalid_request", field: "operation_key"},
			{input: "malformed intent (no args)", key: "bad/noargs", raw: `{"operation_key":"bad/noargs","tool":"cache.set"}`,
				status: 400, code: "invalid_request", field: "args"},
			{input: "schema violation (amount 0)", key: "bad/amount", tool: "payments.charge", args: `{"amount":0,"currency":"EUR"}`,
				status: 400, code: "invalid_args", field: "/amount"},
			{input: "schema violation (currency missing)", key: "bad/currency", tool: "payments.charge", args: `{"amount":5}`,
				status: 400, code: "invalid_args", field: "/currency"},
			{input: "unknown tool", key: "bad/unknown-tool", tool: "payments.refund", args: `{"amount":5}`,
				status: 404, code: "unknown_tool", field: "tool"},
		}
		for _, c := range cases {
			var a badAnswer
			if c.raw != "" {
				a = api.do(t, http.MethodPost, "/v1/intents", nil, []byte(c.raw))
			} else {
				a = api.intent(t, c.key, c.tool, c.args)
			}
			want := badAnswer{status: c.status, body: map[string]any{"error": c.code}}
			if c.field != "" {
				want.body["field"] = c.field
			}
			n := badJournaled(ctx, t, pool, c.key)
			table.add(t, badCase{input: c.input, want: want.String(), got: a.String(), journaled: n,
				ok: a.String() == want.String() && n == 0})
		}
		if after := badTotalEvents(ctx, t, pool); after != before {
			t.Errorf("bad requests journaled %d events", after-before)
		}
	})

	t.Run("reused key", func(t *testing.T) {
		const key = "bad/reused"
		if a := api.intent(t, key, "cache.set", `{"v":1}`); a.status != http.StatusAccepted {
			t.Fatalf("first intent: %s %s", a, a.raw)
		}
		first := badWaitStatus(ctx, t, st, key, events.StatusCompleted)
		a := api.intent(t, key, "cache.set", `{"v":2}`)
		time.Sleep(300 * time.Millisecond) // a wrong execution would start at once
		now, err := st.Load(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		unchanged := now.Seq == first.Seq && now.Status == first.Status && now.PayloadHash == first.PayloadHash &&
			w.fake.EffectsForKey(key) == 1
		table.add(t, badCase{input: "same key, other args", want: "409 payload_conflict, first unchanged",
			got: fmt.Sprintf("%s, seq %d->%d %s", a, first.Seq, now.Seq, now.Status), journaled: int(now.Seq - first.Seq),
			ok: a.status == http.StatusConflict && a.body["error"] == "payload_conflict" && unchanged})
		again := api.intent(t, key, "cache.set", `{"v":1}`)
		table.add(t, badCase{input: "same key, same args, after completion", want: "200 with the stored result",
			got: fmt.Sprintf("%d %v", again.status, again.body["status"]), journaled: 0,
			ok: again.status == http.StatusOK && again.body["status"] == string(events.StatusCompleted)})
	})

	t.Run("kafka", func(t *testing.T) {
		const key = "bad/kafka-valid"
		cfg := kafka.Config{Brokers: w.broker.Addrs, Partitions: 3}.WithDefaults()
		sc := cfg.Sarama()
		sc.Producer.MaxMessageBytes = 4 << 20
		pr, err := sarama.NewSyncProducer(cfg.Brokers, sc)
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		topic := cfg.Topic(events.TopicIntents)
		send := func(value []byte) int32 {
			part, _, err := pr.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(value)})
			if err != nil {
				t.Fatalf("producing: %v", err)
			}
			return part
		}
		good := faultOp{key: key, tool: "cache.set", class: events.Idempotent}
		_, raw := faultDirectIntent(t, good, 1)
		unknownType := bytes.Replace(raw, []byte(`"type":"intent.recorded"`), []byte(`"type":"intent.exploded"`), 1)
		// Valid JSON in the envelope's shape, only too large: built by hand,
		// since events.Encode refuses it.
		huge, err := json.Marshal(events.Envelope{EventID: events.NewID(), Type: events.IntentRecorded, OperationKey: key, Seq: 1,
			OccurredAt: time.Now().UTC(), Tool: "cache.set", EffectClass: events.Idempotent,
			Data: json.RawMessage(`{"args":{"pad":"` + strings.Repeat("y", events.MaxEnvelopeBytes) + `"},"principal":"intruder"}`)})
		if err != nil {
			t.Fatal(err)
		}
		malformed := []struct {
			input string
			value []byte
			why   string // what the executor's warning says
		}{
			{"kafka: garbage bytes", []byte("\x00\xff not an envelope {{{"), "not a JSON object"},
			{"kafka: envelope with an unknown type", unknownType, "intent.exploded"},
			{fmt.Sprintf("kafka: oversized envelope (%d bytes)", len(huge)), huge, "byte limit"},
		}
		parts := map[int32]bool{}
		for _, m := range malformed {
			parts[send(m.value)] = true
		}
		parts[send(raw)] = true
		if len(parts) != 1 {
			t.Fatalf("the messages went to partitions %v, want one", parts)
		}
		op := badWaitStatus(ctx, t, st, key, events.StatusCompleted)
		hash, err := events.PayloadHash(json.RawMessage(`{"amount":101}`))
		if err != nil {
			t.Fatal(err)
		}
		var warnings []string
		for _, line := range strings.Split(p.output(), "\n") {
			if strings.Contains(line, "rejected a message that can never be handled") {
				warnings = append(warnings, line)
			}
		}
		for _, m := range malformed {
			logged := ""
			for _, line := range warnings {
				if strings.Contains(line, m.why) {
					logged = m.why
				}
			}
			table.add(t, badCase{input: m.input, want: "skipped, warning says " + strconv.Quote(m.why),
				got: "skipped, warning says " + strconv.Quote(logged), journaled: 0, ok: logged != ""})
		}
		if len(warnings) != len(malformed) {
			t.Errorf("%d malformed-message warnings, want %d:\n%s", len(warnings), len(malformed), strings.Join(warnings, "\n"))
		}
		table.add(t, badCase{input: "kafka: valid intent after them, same partition", want: "completed with its own args",
			got: fmt.Sprintf("%s, evidence %d", op.Status, op.Evidence), journaled: int(op.Seq),
			ok: op.PayloadHash == hash && op.Evidence == 0 && w.fake.EffectsForKey(key) == 1})
	})

	t.Run("webhooks", func(t *testing.T) {
		const key = "bad/webhook"
		// The charge's request hangs; after the 1s timeout its outcome is
		// unknown, the reconciler finds no effect, and the operation waits
		// for a human: a state a verified callback may settle.
		w.fake.Script(testenv.RouteInvoke, testenv.FaultStallForever)
		if a := api.intent(t, key, "payments.charge", `{"amount":5,"currency":"EUR"}`); a.status != http.StatusAccepted {
			t.Fatalf("intent: %s %s", a, a.raw)
		}
		escalated := badWaitStatus(ctx, t, st, key, events.StatusEscalated)
		body := []byte(fmt.Sprintf(`{"type":"effect.succeeded","idempotency_key":%q,"downstream_id":"ch_1","result":{"id":"ch_1"}}`, key))
		signed := func(secret, id string, at time.Time) http.Header {
			wh, err := standardwebhooks.NewWebhook(secret)
			if err != nil {
				t.Fatal(err)
			}
			sig, err := wh.Sign(id, at, body)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			h.Set(standardwebhooks.HeaderWebhookID, id)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
			h.Set(standardwebhooks.HeaderWebhookSignature, sig)
			return h
		}
		post := func(h http.Header) badAnswer {
			return api.do(t, http.MethodPost, "/v1/webhooks/payments.charge", h, body)
		}
		seq := func() int64 {
			op, err := st.Load(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return op.Seq
		}
		forged := post(signed(badSigningSecret(t), "msg_forged", time.Now()))
		table.add(t, badCase{input: "webhook: forged signature", want: "401 invalid_signature, no change",
			got: fmt.Sprintf("%s, seq +%d", forged, seq()-escalated.Seq), journaled: int(seq() - escalated.Seq),
			ok: forged.status == http.StatusUnauthorized && seq() == escalated.Seq})
		good := signed(secret, "msg_1", time.Now())
		applied := post(good)
		table.add(t, badCase{input: "webhook: genuine", want: "200 applied, one state change",
			got: fmt.Sprintf("%s, seq +%d", applied, seq()-escalated.Seq), journaled: int(seq() - escalated.Seq),
			ok: applied.status == http.StatusOK && applied.body["status"] == "applied" && seq() == escalated.Seq+1})
		again := post(good)
		table.add(t, badCase{input: "webhook: the same delivery again", want: "200 duplicate, no change",
			got: fmt.Sprintf("%s, seq +%d", again, seq()-escalated.Seq), journaled: int(seq() - escalated.Seq - 1),
			ok: again.status == http.StatusOK && again.body["status"] == "duplicate" && seq() == escalated.Seq+1})
		stale := post(signed(secret, "msg_2", time.Now().Add(-10*time.Minute)))
		table.add(t, badCase{input: "webhook: replayed 10 min later (new id)", want: "401, no change",
			got: fmt.Sprintf("%s, seq +%d", stale, seq()-escalated.Seq), journaled: int(seq() - escalated.Seq - 1),
			ok: stale.status == http.StatusUnauthorized && seq() == escalated.Seq+1})
		op, err := st.Load(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if op.Status != events.StatusCompleted || w.fake.Requests(testenv.RouteInvoke) == 0 {
			t.Errorf("after the callbacks: %s", op.Status)
		}
		invokes := 0
		for _, r := range w.fake.RequestLog() {
			if r.Route == testenv.RouteInvoke && r.IdempotencyKey == key {
				invokes++
			}
		}
		if invokes != 1 {
			t.Errorf("the irreversible charge was sent %d times", invokes)
		}
	})

	if err := p.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

func badSigningSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}
