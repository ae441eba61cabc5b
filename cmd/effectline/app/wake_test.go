package app

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/watch"
)

// The composition root connects the store's commits to the waiters when
// the API runs beside the executor: with the Kafka feed gone and the sweep
// a minute apart, a POST that waits still gets its settled record (200)
// long before its wait runs out (202 after 5s without the hook).
func TestAPIBesideTheExecutorWakesWaitersFromCommits(t *testing.T) {
	t.Parallel()
	broker := testenv.NewBroker(t)
	fake := testenv.NewFakeTool(t)
	tools, err := httptool.Parse([]byte(`
tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "`+fake.URL+`/effects/cache", timeout: 2s}
`), os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := Open(ctx, Options{
		Config: Config{DatabaseURL: storedb.New(t), KafkaBrokers: broker.Addrs, HTTPAddr: "127.0.0.1:0",
			Partitions: 3, Replication: 1, LogLevel: "error"},
		Stdout: discard{}, Getenv: func(string) string { return "" },
		Components: []string{Relay, Executor, API}, Tools: tools, Open: true,
		waits: func(c *watch.Config) { c.Feed, c.SweepInterval = nil, time.Minute },
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

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

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
