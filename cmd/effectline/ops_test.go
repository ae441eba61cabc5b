package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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
	// The world's tools, and a one-step workflow over them for `ops workflows`.
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(strings.ReplaceAll(e2eTools+opsWorkflow, "URL", w.fake.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	start(t, "effectline run", w.with(map[string]string{
		envHTTPAddr:  addr,
		envTools:     tools,
		envAPITokens: "agent=tok-agent-7f3e91c2,alice=tok-alice-5b8d04aa",
		envApprovers: "alice",
		envLogLevel:  "warn",
	}), "run", "--components", "relay,executor,projector,reconciler,workflow,api")
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
		const id = "ops-wf-1"
		body := `{"workflow_id":"` + id + `","workflow":"ops.warm","input":{"k":"v"}}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/workflows", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok-agent-7f3e91c2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /v1/workflows: %s", resp.Status)
		}
		var wf struct {
			WorkflowID string `json:"workflow_id"`
			Workflow   string `json:"workflow"`
			Status     string `json:"status"`
			Steps      []struct {
				Name         string `json:"name"`
				Status       string `json:"status"`
				OperationKey string `json:"operation_key"`
			} `json:"steps"`
		}
		waitFor(t, ctx, "ops workflows "+id+" --json to show the run completed", func() bool {
			out := agent.ok(t, "workflows", id, "--json")
			if err := json.Unmarshal([]byte(out), &wf); err != nil {
				t.Fatalf("ops workflows ID --json is not JSON: %v\n%s", err, out)
			}
			return wf.Status == "completed"
		})
		if wf.WorkflowID != id || wf.Workflow != "ops.warm" || len(wf.Steps) != 1 || wf.Steps[0].Status != "completed" || wf.Steps[0].OperationKey == "" {
			t.Errorf("ops workflows %s --json: %+v", id, wf)
		}
		table := agent.ok(t, "workflows", id)
		for _, want := range []string{"workflow_id", id, "ops.warm", "STEP", "warm", wf.Steps[0].OperationKey} {
			if !strings.Contains(table, want) {
				t.Errorf("ops workflows %s table lacks %q:\n%s", id, want, table)
			}
		}
		var page struct {
			Workflows []struct {
				WorkflowID string `json:"workflow_id"`
				Status     string `json:"status"`
			} `json:"workflows"`
		}
		out := agent.ok(t, "workflows", "--status", "completed", "--json")
		if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Workflows) != 1 || page.Workflows[0].WorkflowID != id {
			t.Errorf("ops workflows --status completed --json: %+v (%v)\n%s", page, err, out)
		}
		table = agent.ok(t, "workflows")
		if !strings.HasPrefix(table, "ID ") || !strings.Contains(table, id) || !strings.Contains(table, "completed") {
			t.Errorf("ops workflows table:\n%s", table)
		}
		// An unknown id is the server's 404, not a missing workflow API.
		_, stderr := agent.fail(t, "workflows", "ops-wf-nope")
		if !strings.Contains(stderr, "404") || strings.Contains(stderr, "no workflow API") {
			t.Errorf("ops workflows of an unknown id: stderr %q, want the API's 404", stderr)
		}
		_, stderr = agent.fail(t, "workflows", "--status", "exploded")
		if !strings.Contains(stderr, "400") || !strings.Contains(stderr, "status") {
			t.Errorf("ops workflows --status exploded: stderr %q, want the API's 400 on status", stderr)
		}
	})

	t.Run("dlq", func(t *testing.T) {
		// Real dead letters: messages on the intents topic that the
		// executor can never turn into an operation, copied by it to the
		// dead-letter topic with the reason and where they were.
		topic := "effectline.intents.dlq"
		bad := []struct{ key, value, reason string }{
			{"ops/poison-1", `{"event_id":"x","type":"intent.recorded"}`, "invalid_envelope"},
			{"ops/poison-2", "\x00\xffbinary", "not_json"},
		}
		for _, b := range bad {
			w.broker.Produce(t, "effectline.intents", []byte(b.key), []byte(b.value), nil)
		}
		type deadLetter struct {
			Key             string `json:"key"`
			Value           string `json:"value"`
			ValueBase64     string `json:"value_base64"`
			Reason          string `json:"reason"`
			Detail          string `json:"detail"`
			SourceTopic     string `json:"source_topic"`
			SourcePartition string `json:"source_partition"`
			SourceOffset    string `json:"source_offset"`
		}
		var got struct {
			Topic string       `json:"topic"`
			Items []deadLetter `json:"items"`
		}
		var out string
		found := map[string]deadLetter{}
		waitFor(t, ctx, "ops dlq --json to show the executor's dead letters", func() bool {
			out = agent.ok(t, "dlq", "--json")
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("ops dlq --json is not JSON: %v\n%s", err, out)
			}
			for _, it := range got.Items {
				found[it.Key] = it
			}
			return len(found) >= len(bad)
		})
		if got.Topic != topic {
			t.Errorf("ops dlq --json: topic %q, want %s", got.Topic, topic)
		}
		for _, b := range bad {
			it, ok := found[b.key]
			if !ok {
				t.Errorf("dead letter %s missing:\n%s", b.key, out)
				continue
			}
			value := it.Value
			if it.ValueBase64 != "" {
				v, err := base64.StdEncoding.DecodeString(it.ValueBase64)
				if err != nil {
					t.Errorf("dead letter %s: value_base64 %q: %v", b.key, it.ValueBase64, err)
				}
				value = string(v)
				if utf8.ValidString(b.value) {
					t.Errorf("dead letter %s: a UTF-8 value came as base64", b.key)
				}
			}
			_, perr := strconv.Atoi(it.SourcePartition)
			_, oerr := strconv.ParseInt(it.SourceOffset, 10, 64)
			if value != b.value || it.Reason != b.reason || it.Detail == "" || it.SourceTopic != "effectline.intents" || perr != nil || oerr != nil {
				t.Errorf("dead letter %s: %+v, want value %q, reason %s and where it was", b.key, it, b.value, b.reason)
			}
		}
		table := agent.ok(t, "dlq")
		if !strings.Contains(table, "invalid_envelope") || !strings.Contains(table, "effectline.intents/") || !strings.Contains(table, `\x00`) {
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

// opsWorkflow is a workflow over e2eTools, appended to them.
const opsWorkflow = `workflows:
  - name: ops.warm
    steps:
      - name: warm
        tool: cache.set
        args: {k: "{{.Input.k}}"}
`

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
