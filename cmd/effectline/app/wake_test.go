package app

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/watch"
)

// The composition root connects the store's commits to the waiters when
// the API runs beside the executor: with the Kafka feed gone and the sweep
// a minute apart, a POST that waits still gets its settled record (200)
// long before its wait runs out (202 after 5s without the hook).
func TestAPIBesideTheExecutorWakesWaitersFromCommits(t *testing.T) {
	t.Parallel()
	a := runWaker(t, storedb.New(t), testenv.NewFakeTool(t), Options{
		waits: func(c *watch.Config) { c.Feed, c.SweepInterval = nil, time.Minute },
	})

	req, _ := http.NewRequest(http.MethodPost, "http://"+a.APIAddr()+"/v1/intents",
		strings.NewReader(`{"operation_key":"wake-app-1","tool":"cache.set","args":{"k":"v"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Prefer", "wait=5")
	began := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST waiting 5s answered %d after %v, want 200: the commits did not wake the waiter", resp.StatusCode, time.Since(began))
	}
	if reloads, sweeps := a.Waits.Queries(); reloads != 0 || sweeps != 0 {
		t.Errorf("%d reloads, %d sweeps: the commits left a gap", reloads, sweeps)
	}
}

// runWaker runs a relay, an executor and the API on db, with the tool
// cache.set calling fake and o's SoleWriter and waits, until the test
// ends.
func runWaker(t *testing.T, db string, fake *testenv.FakeTool, o Options) *App {
	t.Helper()
	tools, err := httptool.Parse([]byte(`
tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "`+fake.URL+`/effects/cache", timeout: 5s}
`), os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o.Config = Config{DatabaseURL: db, KafkaBrokers: testenv.NewBroker(t).Addrs, HTTPAddr: "127.0.0.1:0",
		Partitions: 3, Replication: 1, LogLevel: "error"}
	o.Stdout, o.Getenv = discard{}, func(string) string { return "" }
	o.Components, o.Tools, o.Open = []string{Relay, Executor, API}, tools, true
	a, err := Open(ctx, o)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// A sole writer (dev, bench) does not tail the outcomes topic for its
// waiters, and a waiter on an intent an agent appended in a process of its
// own is still woken when the operation settles: the executor's commits
// here carry every event after the intent. The sweep is a minute apart
// and the tool holds its answer for a second, so the GET waits and only a
// commit can end its wait.
func TestASoleWriterWakesWaitersWithoutTheOutcomesTopic(t *testing.T) {
	t.Parallel()
	if (&App{soleWriter: true}).waitFeed() != nil {
		t.Fatal("a sole writer's waiters tail the outcomes topic")
	}
	if (&App{}).waitFeed() == nil {
		t.Fatal("a process that is not the sole writer does not tail the outcomes topic")
	}
	fake := testenv.NewFakeTool(t)
	fake.Script(testenv.RouteInvoke, testenv.FaultStall(time.Second))
	db := storedb.New(t)
	a := runWaker(t, db, fake, Options{SoleWriter: true, waits: func(c *watch.Config) { c.SweepInterval = time.Minute }})

	// The agent's own process: its own pool, its own transaction.
	agent := testenv.NewPool(t, db)
	tx, err := agent.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Append(t.Context(), tx, outbox.Intent{OperationKey: "sole-writer-1", Tool: "cache.set",
		EffectClass: events.Idempotent, Args: json.RawMessage(`{"k":"v"}`), Principal: "agent"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	resp, err := http.Get("http://" + a.APIAddr() + "/v1/operations/sole-writer-1?wait=20s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || got.Status != string(events.StatusCompleted) {
		t.Fatalf("GET waiting 20s answered %d %q after %v, want 200 completed", resp.StatusCode, got.Status, time.Since(began))
	}
	if _, sweeps := a.Waits.Queries(); sweeps != 0 {
		t.Errorf("%d sweeps: the wait ended by the sweep, not by a commit", sweeps)
	}
	if n := fake.Effects(); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}
