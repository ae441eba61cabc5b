// Command gotool is effectline embedded in a program of its own, built from
// the public packages only: it registers a tool written in Go, builds the
// store, the outbox relay, the executor, the projector and the reconciler,
// and runs one operation end to end against PostgreSQL and an embedded
// Kafka-protocol broker (kfake).
//
//	EFFECTLINE_DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch go run .
//
// The database must exist and may be empty: the program migrates it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("EFFECTLINE_DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "gotool:", err)
		os.Exit(1)
	}
}

// greetings counts the effects the Go tool applied, by operation key: the
// proof that one operation made one effect.
type greetings struct {
	mu   sync.Mutex
	sent map[string]int
}

// greet is the tool: an idempotent effect (sending the same greeting twice
// is the same greeting), answered with an id the executor records.
func (g *greetings) greet(_ context.Context, c tool.Call) (json.RawMessage, error) {
	var args struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(c.Args, &args); err != nil {
		return nil, tool.Permanent(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent[c.DownstreamKey]++
	return json.Marshal(map[string]string{"id": "greeting-" + c.DownstreamKey, "text": "hello, " + args.Name})
}

func run(ctx context.Context, dbURL string) error {
	if dbURL == "" {
		return errors.New("set EFFECTLINE_DATABASE_URL to an existing database")
	}
	pool, err := store.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	st := store.New(pool)

	// The tools: one written in Go, registered like the tools file's.
	g := &greetings{sent: map[string]int{}}
	tools := tool.NewRegistry()
	if err := tools.Register(tool.NewGoTool(tool.Spec{
		Name: "example.greet", Effect: events.Idempotent,
		ArgsSchema: json.RawMessage(`{"type":"object","required":["name"],"properties":{"name":{"type":"string"}}}`),
	}, g.greet)); err != nil {
		return err
	}

	// Kafka: every component's Config carries the same Kafka settings; the
	// embedded broker is seeded with the topics they name.
	kc := executor.Config{}.Kafka
	kc.Partitions = 3
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kc.Partitions, kc.Topics()...))
	if err != nil {
		return err
	}
	defer cluster.Close()
	kc.Brokers = cluster.ListenAddrs()

	pub, err := outbox.NewKafkaPublisher(kc)
	if err != nil {
		return err
	}
	defer pub.Close()
	relay := outbox.NewRelay(st, pub, outbox.RelayConfig{})
	exec, err := executor.New(st, tools, executor.Config{Kafka: kc})
	if err != nil {
		return err
	}
	proj, err := projector.New(projector.Config{Kafka: kc, Store: st})
	if err != nil {
		return err
	}
	rec, err := reconciler.New(st, tools, reconciler.Config{Kafka: kc})
	if err != nil {
		return err
	}

	runCtx, stopComponents := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var failed atomic.Value
	for name, run := range map[string]func(context.Context) error{
		"relay": relay.Run, "executor": exec.Run, "projector": proj.Run, "reconciler": rec.Run,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				failed.Store(fmt.Errorf("%s: %w", name, err))
				stopComponents()
			}
		}()
	}
	defer func() { stopComponents(); wg.Wait() }()

	// The agent's side: the intent commits in the agent's own transaction.
	key, err := outbox.OperationKey("example-workflow-1", "greet")
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Append(ctx, tx, outbox.Intent{
			OperationKey: key, Tool: "example.greet", EffectClass: events.Idempotent,
			Args: json.RawMessage(`{"name":"world"}`), Principal: "example-agent",
		})
		return err
	})
	if err != nil {
		return err
	}

	// The read side: wait for the projector's row to say completed.
	reader := projector.NewReader(pool)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err, _ := failed.Load().(error); err != nil {
			return err
		}
		s, err := reader.Get(ctx, key)
		if err == nil && s.Status == events.StatusCompleted {
			g.mu.Lock()
			n := g.sent[key]
			g.mu.Unlock()
			fmt.Printf("operation %s %s: downstream id %s, effects %d\n", key, s.Status, s.DownstreamID, n)
			if n != 1 {
				return fmt.Errorf("%d effects for one operation", n)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("operation %s not completed in time (last read: %+v, %v)", key, s, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
