package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/cmd/effectline/ops"
	"github.com/effectline/effectline/internal/testenv"
)

// TestOps runs `effectline ops` the way an operator does: the built binary
// against a running `effectline run` (every component, tokens and an
// approver), with the fake downstream behind it. Each subcommand is run
// with --json and its output parsed, and in table form; every refusal exits
// non-zero with the server's error shown.
func TestOps(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	start(t, "effectline run", w.with(map[string]string{
		envHTTPAddr:  addr,
		envAPITokens: "agent=tok-agent-7f3e91c2,alice=tok-alice-5b8d04aa",
		envApprovers: "alice",
		envLogLevel:  "warn",
	}), "run", "--components", "relay,executor,projector,reconciler,api")
	base := "http://" + addr
	ctx := untilCtx(t, 4*time.Minute)
	waitFor(t, ctx, "the API to be ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	agent := opsEnv{url: base, token: "tok-agent-7f3e91c2", brokers: strings.Join(w.broker.Addrs, ",")}
	alice := agent
	alice.token = "tok-alice-5b8d04aa"

	// Three operations that complete at once.
	keys := []string{"ops/cache-1", "ops/cache-2", "ops/cache-3"}
	for _, k := range keys {
		opsPostIntent(t, ctx, base, "tok-agent-7f3e91c2", k, "cache.set", `{"k":"v"}`)
	}
	for _, k := range keys {
		opsWaitStatus(t, ctx, agent, k, "completed")
	}

	t.Run("list", func(t *testing.T) {
		// The list reads the projector's read model: poll until it caught up.
		var page struct {
			Items []struct {
				OperationKey string `json:"operation_key"`
				Tool         string `json:"tool"`
				Status       string `json:"status"`
			} `json:"items"`
		}
		waitFor(t, ctx, "ops list to show the three operations completed", func() bool {
			out := agent.ok(t, "list", "--status", "completed", "--tool", "cache.set", "--json")
			if err := json.Unmarshal([]byte(out), &page); err != nil {
				t.Fatalf("ops list --json is not JSON: %v\n%s", err, out)
			}
			return len(page.Items) == len(keys)
		})
		for _, it := range page.Items {
			if it.Tool != "cache.set" || it.Status != "completed" || !strings.HasPrefix(it.OperationKey, "ops/cache-") {
				t.Errorf("ops list --status completed --tool cache.set: item %+v", it)
			}
		}
		out := agent.ok(t, "list", "--limit", "2", "--json")
		if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Items) != 2 {
			t.Errorf("ops list --limit 2 --json: %d items (%v), want 2", len(page.Items), err)
		}
		table := agent.ok(t, "list")
		if !strings.HasPrefix(table, "KEY ") || !strings.Contains(table, "ops/cache-2") || !strings.Contains(table, "completed") {
			t.Errorf("ops list table:\n%s", table)
		}
		// A status the API does not know is its 400, shown.
		_, stderr := agent.fail(t, "list", "--status", "exploded")
		if !strings.Contains(stderr, "400") || !strings.Contains(stderr, "status") {
			t.Errorf("ops list --status exploded: stderr %q, want the API's 400 on status", stderr)
		}
	})

	t.Run("show", func(t *testing.T) {
		var rec struct {
			OperationKey string `json:"operation_key"`
			Status       string `json:"status"`
			Events       []struct {
				Seq  int64  `json:"seq"`
				Type string `json:"type"`
			} `json:"events"`
		}
		out := agent.ok(t, "show", keys[0], "--json")
		if err := json.Unmarshal([]byte(out), &rec); err != nil {
			t.Fatalf("ops show --json is not JSON: %v\n%s", err, out)
		}
		if rec.OperationKey != keys[0] || rec.Status != "completed" || len(rec.Events) < 3 ||
			rec.Events[0].Type != "intent.recorded" || rec.Events[len(rec.Events)-1].Type != "attempt.succeeded" {
			t.Errorf("ops show --json: %+v", rec)
		}
		table := agent.ok(t, "show", keys[0])
		for _, want := range []string{"operation_key", keys[0], "status", "completed", "SEQ", "intent.recorded", "attempt.succeeded"} {
			if !strings.Contains(table, want) {
				t.Errorf("ops show table lacks %q:\n%s", want, table)
			}
		}
		_, stderr := agent.fail(t, "show", "ops/no-such-key")
		if !strings.Contains(stderr, "404") || !strings.Contains(stderr, "not_found") {
			t.Errorf("ops show of an unknown key: stderr %q, want the API's 404", stderr)
		}
		agent.fail(t, "show") // no key
	})

	t.Run("watch", func(t *testing.T) {
		// The first call is refused with 503, the retry answers after 1.5s:
		// the watch starts while the operation is still running, sees the
		// failure, the retry, and the success when it comes.
		const key = "ops/watched"
		w.fake.Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(http.StatusServiceUnavailable, ""),
			testenv.FaultStall(1500*time.Millisecond))
		opsPostIntent(t, ctx, base, "tok-agent-7f3e91c2", key, "inventory.reserve", `{"sku":"A-1","qty":1}`)
		out := agent.ok(t, "watch", key, "--json")
		var types []string
		sc := bufio.NewScanner(strings.NewReader(out))
		var seq int64
		for sc.Scan() {
			var ev struct {
				Seq          int64  `json:"seq"`
				Type         string `json:"type"`
				OperationKey string `json:"operation_key"`
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("ops watch --json: line %q is not a JSON object: %v", sc.Text(), err)
			}
			if ev.Seq != seq+1 || ev.OperationKey != key {
				t.Errorf("ops watch --json: event %+v after seq %d: want every event once, in order", ev, seq)
			}
			seq = ev.Seq
			types = append(types, ev.Type)
		}
		want := "intent.recorded attempt.started attempt.failed attempt.started attempt.succeeded"
		if got := strings.Join(types, " "); got != want {
			t.Errorf("ops watch --json events: %s, want %s", got, want)
		}
		table := agent.ok(t, "watch", key)
		if !strings.Contains(table, "attempt.failed") || !strings.Contains(table, "settled: completed") {
			t.Errorf("ops watch table:\n%s", table)
		}
		_, stderr := agent.fail(t, "watch", "ops/no-such-key")
		if !strings.Contains(stderr, "404") {
			t.Errorf("ops watch of an unknown key: stderr %q, want the API's 404", stderr)
		}
	})

	t.Run("decide", func(t *testing.T) {
		// An irreversible charge answered 500 without effect: unknown, the
		// reconciler finds nothing, so it escalates to the approval gate.
		const key = "ops/escalated"
		w.fake.Script(testenv.RouteInvoke, testenv.FaultFailBeforeEffect(http.StatusInternalServerError, ""))
		opsPostIntent(t, ctx, base, "tok-agent-7f3e91c2", key, "payments.charge", `{"amount":100}`)
		opsWaitStatus(t, ctx, agent, key, "escalated")
		table := agent.ok(t, "show", key)
		if !strings.Contains(table, "escalated") || !strings.Contains(table, "proposed_action") {
			t.Errorf("ops show of an escalated operation:\n%s", table)
		}

		_, stderr := alice.fail(t, "decide", key, "explode")
		if !strings.Contains(stderr, "400") || !strings.Contains(stderr, "action") {
			t.Errorf("ops decide with a bad action: stderr %q, want the API's 400 on action", stderr)
		}
		_, stderr = agent.fail(t, "decide", key, "abandon")
		if !strings.Contains(stderr, "403") {
			t.Errorf("ops decide by a principal that is no approver: stderr %q, want 403", stderr)
		}
		_, stderr = alice.fail(t, "decide", "ops/no-such-key", "abandon")
		if !strings.Contains(stderr, "404") {
			t.Errorf("ops decide on an unknown key: stderr %q, want 404", stderr)
		}
		agent.fail(t, "decide", key)

		out := alice.ok(t, "decide", key, "abandon", "--note", "customer cancelled", "--json")
		var rec struct {
			OperationKey string `json:"operation_key"`
			Status       string `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.OperationKey != key || rec.Status == "escalated" {
			t.Errorf("ops decide --json: %+v (%v)\n%s", rec, err, out)
		}
		var hist struct {
			Events []struct {
				Type string `json:"type"`
				Data struct {
					Action   string `json:"action"`
					Note     string `json:"note"`
					Approver string `json:"approver"`
				} `json:"data"`
			} `json:"events"`
		}
		if err := json.Unmarshal([]byte(alice.ok(t, "show", key, "--json")), &hist); err != nil {
			t.Fatal(err)
		}
		last := hist.Events[len(hist.Events)-1]
		if last.Type != "decision.recorded" || last.Data.Action != "abandon" || last.Data.Approver != "alice" ||
			last.Data.Note != "customer cancelled" {
			t.Errorf("the decision's event: %+v", last)
		}
		// Decided already: the API's 409, shown.
		_, stderr = alice.fail(t, "decide", key, "abandon")
		if !strings.Contains(stderr, "409") {
			t.Errorf("ops decide twice: stderr %q, want 409", stderr)
		}
	})

	t.Run("workflows", func(t *testing.T) {
		for _, args := range [][]string{{"workflows"}, {"workflows", "wf-1"}, {"workflows", "--json"}} {
			_, stderr := agent.fail(t, args...)
			if !strings.Contains(stderr, "no workflow API") {
				t.Errorf("ops %s: stderr %q, want it to say the server has no workflow API", strings.Join(args, " "), stderr)
			}
		}
	})

	t.Run("dlq", func(t *testing.T) {
		topic := "effectline.intents.dlq"
		opsCreateTopic(t, w.broker.Addrs, topic)
		bad := []struct{ key, value, reason, offset string }{
			{"ops/poison-1", `{"not":"an envelope"`, "malformed JSON", "7"},
			{"ops/poison-2", "\x00\xffbinary", "not JSON", "8"},
		}
		for _, b := range bad {
			w.broker.Produce(t, topic, []byte(b.key), []byte(b.value), map[string]string{
				"effectline_error": b.reason, "effectline_topic": "effectline.intents",
				"effectline_partition": "2", "effectline_offset": b.offset,
			})
		}
		var got struct {
			Topic string `json:"topic"`
			Items []struct {
				Key             string `json:"key"`
				Value           string `json:"value"`
				ValueBase64     string `json:"value_base64"`
				Reason          string `json:"reason"`
				SourceTopic     string `json:"source_topic"`
				SourcePartition string `json:"source_partition"`
				SourceOffset    string `json:"source_offset"`
			} `json:"items"`
		}
		out := agent.ok(t, "dlq", "--json")
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("ops dlq --json is not JSON: %v\n%s", err, out)
		}
		found := 0
		for _, it := range got.Items {
			for _, b := range bad {
				if it.Key != b.key {
					continue
				}
				found++
				value := it.Value
				if it.ValueBase64 != "" {
					value = "(base64)"
					if b.key == "ops/poison-1" {
						t.Errorf("a UTF-8 value came as base64")
					}
				}
				if b.key == "ops/poison-1" && value != b.value {
					t.Errorf("dead letter %s: value %q, want %q", b.key, value, b.value)
				}
				if it.Reason != b.reason || it.SourceTopic != "effectline.intents" || it.SourcePartition != "2" || it.SourceOffset != b.offset {
					t.Errorf("dead letter %s: %+v", b.key, it)
				}
			}
		}
		if found != len(bad) || got.Topic != topic {
			t.Errorf("ops dlq --json: topic %q, found %d of the %d dead letters:\n%s", got.Topic, found, len(bad), out)
		}
		table := agent.ok(t, "dlq")
		if !strings.Contains(table, "malformed JSON") || !strings.Contains(table, "effectline.intents/2/7") || !strings.Contains(table, `\x00`) {
			t.Errorf("ops dlq table:\n%s", table)
		}
		other := agent
		other.prefix = "elsewhere."
		if _, stderr := other.fail(t, "dlq"); !strings.Contains(stderr, "elsewhere.intents.dlq") {
			t.Errorf("ops dlq with no such topic: stderr %q", stderr)
		}
		noKafka := agent
		noKafka.brokers = ""
		if _, stderr := noKafka.fail(t, "dlq"); !strings.Contains(stderr, ops.EnvKafkaBrokers) {
			t.Errorf("ops dlq without brokers: stderr %q", stderr)
		}
	})

	t.Run("errors", func(t *testing.T) {
		wrong := agent
		wrong.token = "not-a-token"
		_, stderr := wrong.fail(t, "list")
		if !strings.Contains(stderr, "401") || !strings.Contains(stderr, ops.EnvAPIToken) {
			t.Errorf("ops list with a wrong token: stderr %q, want 401 naming %s", stderr, ops.EnvAPIToken)
		}
		down := agent
		down.url = fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
		for _, args := range [][]string{{"list"}, {"show", keys[0]}, {"watch", keys[0]}, {"decide", keys[0], "retry"}, {"workflows"}} {
			_, stderr := down.fail(t, args...)
			if !strings.Contains(stderr, ops.EnvAPIURL) || !strings.Contains(stderr, down.url) {
				t.Errorf("ops %s with the API down: stderr %q, want it to name %s", args[0], stderr, ops.EnvAPIURL)
			}
		}
		agent.fail(t)
		agent.fail(t, "explode")
		agent.fail(t, "list", "--bogus")
	})
}

// opsEnv is the environment an operator's shell gives `effectline ops`.
type opsEnv struct {
	url, token, brokers, prefix string
}

// run runs `effectline ops args…` and returns its stdout, stderr and exit
// status.
func (e opsEnv) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"ops"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), ops.EnvAPIURL + "=" + e.url}
	if e.token != "" {
		cmd.Env = append(cmd.Env, ops.EnvAPIToken+"="+e.token)
	}
	if e.brokers != "" {
		cmd.Env = append(cmd.Env, ops.EnvKafkaBrokers+"="+e.brokers)
	}
	if e.prefix != "" {
		cmd.Env = append(cmd.Env, ops.EnvTopicPrefix+"="+e.prefix)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("ops %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// ok runs ops and fails the test unless it exits 0; it returns stdout.
func (e opsEnv) ok(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, code := e.run(t, args...)
	if code != 0 {
		t.Fatalf("ops %s: exit %d\nstderr: %s", strings.Join(args, " "), code, stderr)
	}
	return stdout
}

// fail runs ops and fails the test unless it exits non-zero.
func (e opsEnv) fail(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, code := e.run(t, args...)
	if code == 0 {
		t.Errorf("ops %s: exit 0, want non-zero\nstdout: %s", strings.Join(args, " "), stdout)
	}
	return stdout, stderr
}

func opsPostIntent(t *testing.T, ctx context.Context, base, token, key, tool, args string) {
	t.Helper()
	body := fmt.Sprintf(`{"operation_key":%q,"tool":%q,"args":%s}`, key, tool, args)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/intents", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST intent %s: %s", key, resp.Status)
	}
}

// opsWaitStatus polls `ops show --json` until the operation has status.
func opsWaitStatus(t *testing.T, ctx context.Context, e opsEnv, key, status string) {
	t.Helper()
	waitFor(t, ctx, fmt.Sprintf("%s to be %s", key, status), func() bool {
		var rec struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal([]byte(e.ok(t, "show", key, "--json")), &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Status == status
	})
}

// opsCreateTopic creates topic unless it exists (the dead-letter writer may
// provision it at start).
func opsCreateTopic(t *testing.T, brokers []string, topic string) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		t.Fatalf("creating %s: %v", topic, err)
	}
}
