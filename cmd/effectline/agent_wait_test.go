package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
)

const agentToken = "agent-secret-token"

// runningLine is logged by `run` once its components started.
var runningLine = regexp.MustCompile(`"msg":"effectline running"`)

// agentWorld runs the API, the executor (with the relay) and the projector
// in three processes, as a deployment does.
type agentWorld struct {
	*world
	api, exec, proj *proc
	base            string
	// base2 is a second API replica: a waiter there must be woken too.
	base2 string
}

func newAgentWorld(t *testing.T, replicas ...bool) *agentWorld {
	t.Helper()
	w := newWorld(t)
	env := w.with(map[string]string{envAPITokens: "agent=" + agentToken})
	aw := &agentWorld{world: w}
	aw.exec = start(t, "relay+executor", env, "run", "--components", "relay,executor")
	aw.proj = start(t, "projector", env, "run", "--components", "projector")
	aw.api = start(t, "api", env, "run", "--components", "api")
	aw.base = "http://" + aw.api.waitLine(runAPIListening, 60*time.Second)[1]
	if len(replicas) > 0 && replicas[0] {
		api2 := start(t, "api replica", env, "run", "--components", "api")
		aw.base2 = "http://" + api2.waitLine(runAPIListening, 60*time.Second)[1]
	}
	return aw
}

type agentAnswer struct {
	status  int
	header  http.Header
	outcome struct {
		State     string          `json:"state"`
		Retryable bool            `json:"retryable"`
		Reason    string          `json:"reason"`
		Next      string          `json:"next"`
		Result    json.RawMessage `json:"result"`
	}
	body []byte
}

func (aw *agentWorld) do(t *testing.T, ctx context.Context, method, path, body string, header ...string) agentAnswer {
	t.Helper()
	return aw.doAt(t, ctx, aw.base, method, path, body, header...)
}

func (aw *agentWorld) doAt(t *testing.T, ctx context.Context, base, method, path, body string, header ...string) agentAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+agentToken)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return agentAnswer{}
	}
	defer res.Body.Close()
	a := agentAnswer{status: res.StatusCode, header: res.Header}
	a.body, _ = io.ReadAll(res.Body)
	var rec struct {
		Outcome *json.RawMessage `json:"outcome"`
	}
	if json.Unmarshal(a.body, &rec) == nil && rec.Outcome != nil {
		_ = json.Unmarshal(*rec.Outcome, &a.outcome)
	}
	return a
}

func (aw *agentWorld) submit(t *testing.T, ctx context.Context, key, tool string, wait int) agentAnswer {
	body := fmt.Sprintf(`{"operation_key":%q,"tool":%q,"args":{"amount":1200}}`, key, tool)
	return aw.do(t, ctx, http.MethodPost, "/v1/intents", body, "Prefer", fmt.Sprintf("wait=%d", wait))
}

// stream reads key's SSE stream to its end and returns the event types.
func (aw *agentWorld) stream(t *testing.T, ctx context.Context, base, key string) []string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/operations/"+url.PathEscape(key)+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+agentToken)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("stream of %s: %v", key, err)
		return nil
	}
	defer res.Body.Close()
	var types []string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			types = append(types, v)
		}
	}
	return types
}

// Each of the three states reaches a waiting POST, a GET ?wait and an SSE
// client, with the API in processes of its own (the GET and the stream on
// a second replica); a wait that runs out answers 202.
func TestAgentWaitsForEachStateAcrossProcesses(t *testing.T) {
	t.Parallel()
	aw := newAgentWorld(t, true)
	ctx := untilCtx(t, 4*time.Minute)
	cases := []struct {
		key, tool string
		fault     *testenv.Fault
		state     string
		next      string
		says      string
		last      string
	}{
		{"agent-1/cache", "cache.set", nil, "succeeded", "done", "", "attempt.succeeded"},
		{"agent-2/charge", "payments.charge", ptr(testenv.FaultFailBeforeEffect(422, "")), "failed", "fix_args", "injected_failure", "attempt.failed"},
		{"agent-3/charge", "payments.charge", ptr(testenv.FaultLoseResponse), "unknown", "ask_human", "do not retry", "attempt.unknown"},
	}
	// The executor (and the relay) run only while a case's three clients
	// wait, so every answer is a wake across processes, not a read of a
	// record that had settled before the client asked.
	aw.exec.waitLine(runningLine, 60*time.Second)
	if err := aw.exec.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	env := aw.with(map[string]string{envAPITokens: "agent=" + agentToken})
	for _, c := range cases {
		if c.fault != nil {
			aw.fake.Script(testenv.RouteInvoke, *c.fault)
		}
		posted := make(chan agentAnswer, 1)
		go func() { posted <- aw.submit(t, ctx, c.key, c.tool, 60) }()
		waitFor(t, ctx, "the intent", func() bool {
			return aw.do(t, ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(c.key), "").status == http.StatusOK
		})
		got := make(chan agentAnswer, 1)
		go func() {
			got <- aw.doAt(t, ctx, aw.base2, http.MethodGet, "/v1/operations/"+url.PathEscape(c.key)+"?wait=60s", "")
		}()
		streamed := make(chan []string, 1)
		go func() { streamed <- aw.stream(t, ctx, aw.base2, c.key) }()
		exec := start(t, "relay+executor "+c.key, env, "run", "--components", "relay,executor")

		a := <-posted
		if a.status != http.StatusOK || a.outcome.State != c.state || a.outcome.Next != c.next ||
			!strings.Contains(a.outcome.Reason, c.says) || a.header.Get("Preference-Applied") != "wait=60" {
			t.Errorf("%s: waiting POST answered %d %+v (Preference-Applied %q), want 200 %s/%s saying %q",
				c.key, a.status, a.outcome, a.header.Get("Preference-Applied"), c.state, c.next, c.says)
		}
		if g := <-got; g.status != http.StatusOK || g.outcome.State != c.state {
			t.Errorf("%s: GET ?wait answered %d %+v", c.key, g.status, g.outcome)
		}
		types := <-streamed
		if len(types) < 3 || types[0] != "intent.recorded" || types[len(types)-1] != c.last {
			t.Errorf("%s: stream = %v, want intent.recorded … %s", c.key, types, c.last)
		}
		exec.waitLine(runningLine, 60*time.Second)
		if err := exec.stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	exec := start(t, "relay+executor", env, "run", "--components", "relay,executor")
	defer func() { _ = exec.stop(30 * time.Second) }()
	if n := aw.fake.EffectsForKey("agent-1/cache"); n != 1 {
		t.Errorf("agent-1/cache took effect %d times", n)
	}

	// A resubmission of a settled key answers 200 at once, executes nothing.
	before := aw.fake.Requests(testenv.RouteInvoke)
	if a := aw.submit(t, ctx, "agent-2/charge", "payments.charge", 0); a.status != http.StatusOK || a.outcome.State != "failed" {
		t.Errorf("resubmitting a failed key: %d %+v", a.status, a.outcome)
	}
	if after := aw.fake.Requests(testenv.RouteInvoke); after != before {
		t.Errorf("the resubmission reached the downstream (%d → %d requests)", before, after)
	}

	// A stalled downstream: the wait runs out first, 202 with the record so far.
	aw.fake.Script(testenv.RouteInvoke, testenv.FaultStallForever)
	a := aw.submit(t, ctx, "agent-4/charge", "payments.charge", 1)
	if a.status != http.StatusAccepted || a.outcome.State != "pending" || a.outcome.Next != "wait" ||
		!strings.Contains(string(a.body), `"operation_key":"agent-4/charge"`) {
		t.Errorf("wait that runs out: %d %s", a.status, a.body)
	}
}

// SIGTERM of the API releases every waiter at once with its record.
func TestAgentWaitersReleasedOnAPIShutdown(t *testing.T) {
	t.Parallel()
	aw := newAgentWorld(t)
	ctx := untilCtx(t, 3*time.Minute)
	// Without an executor nothing settles: every waiter would wait its
	// full minute.
	aw.exec.waitLine(runningLine, 60*time.Second)
	if err := aw.exec.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	const n = 25
	answers := make(chan agentAnswer, n)
	for i := range n {
		go func() { answers <- aw.submit(t, ctx, fmt.Sprintf("agent-stop-%d", i), "cache.set", 60) }()
	}
	// Every intent is journaled (the waits registered before) once the
	// head records exist.
	for i := range n {
		waitFor(t, ctx, "the waiting intents", func() bool {
			return aw.do(t, ctx, http.MethodGet, fmt.Sprintf("/v1/operations/agent-stop-%d", i), "").status == http.StatusOK
		})
	}
	// A waiter not released would hold the API's shutdown until its
	// timeout closed the connection: an error here, not a 202.
	if err := aw.api.stop(45 * time.Second); err != nil {
		t.Fatalf("api did not stop: %v", err)
	}
	for range n {
		select {
		case a := <-answers:
			if a.status != http.StatusAccepted || a.outcome.State != "pending" {
				t.Errorf("released waiter answered %d %s", a.status, a.body)
			}
		case <-ctx.Done():
			t.Fatal("a waiter was never answered")
		}
	}
}

func ptr[T any](v T) *T { return &v }
