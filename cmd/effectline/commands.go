package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/cmd/effectline/loadgen"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/workflow"
)

// runComponents is `effectline run`.
func runComponents(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stdout, stderr)
	list := fs.String("components", "", "comma-separated: relay,executor,projector,reconciler,workflow,api")
	insecure := fs.Bool("insecure-open", false, "serve the API without tokens (every caller is the approver 'dev'); for closed networks only")
	if err := fs.parse(args); err != nil {
		return err
	}
	names, err := app.ParseComponents(*list)
	if err != nil {
		return err
	}
	cfg, err := app.FromEnv(getenv)
	if err != nil {
		return err
	}
	cfg.InsecureOpen = cfg.InsecureOpen || *insecure
	if len(cfg.KafkaBrokers) == 0 {
		return fmt.Errorf("%s is required: the Kafka bootstrap brokers, e.g. kafka-1:9092,kafka-2:9092", app.EnvKafkaBrokers)
	}
	if slices.Contains(names, app.API) && cfg.APITokens == "" && !cfg.InsecureOpen {
		return api.ErrNoTokens
	}
	if slices.Contains(names, app.API) {
		// Weak credentials are refused before anything connects, with a
		// message naming the principal (never the token).
		tokens, err := api.ParseTokens(cfg.APITokens)
		if err != nil {
			return err
		}
		if err := (api.Config{Tokens: tokens, Approvers: cfg.Approvers, Open: cfg.InsecureOpen && len(tokens) == 0}).CheckCredentials(); err != nil {
			return err
		}
	}
	a, err := app.Open(ctx, app.Options{Config: cfg, Stdout: stdout, Getenv: getenv, Components: names,
		Service: "effectline", Version: version, APIDrain: min(app.APIShutdownDelay, cfg.ShutdownGrace)})
	if err != nil {
		return err
	}
	a.Log.Info("effectline running", "components", names, "version", version)
	return a.Run(ctx)
}

// runBench is `effectline bench` (package loadgen).
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", stdout, stderr)
	var bc loadgen.Config
	fs.IntVar(&bc.N, "n", 5000, "operations to run")
	fs.IntVar(&bc.Warmup, "warmup", 200, "operations run to completion first, not measured (consumer groups joined, connections open)")
	fs.IntVar(&bc.Rate, "rate", 0, "operations per second (0: flat out)")
	fs.IntVar(&bc.Batch, "batch", 20, "intents per agent transaction (flat out)")
	fs.IntVar(&bc.Concurrency, "concurrency", 8, "agent transactions in flight (flat out)")
	fs.DurationVar(&bc.Timeout, "timeout", 5*time.Minute, "give up waiting after this long")
	fs.BoolVar(&bc.Keep, "keep", false, "keep the benchmark database")
	fs.StringVar(&bc.Via, "via", "outbox", "how intents come in: outbox (the agent's transactions) or http (POST /v1/intents)")
	fs.BoolVar(&bc.Split, "split", false, "with -via http: run the relay, executor, projector, reconciler and API each in a process of its own (effectline run --components), as deploy/kubernetes does")
	fs.IntVar(&bc.Replicas, "replicas", 1, "with -split: processes of each component (the API replicas take the POSTs in turn)")
	fs.BoolVar(&bc.Wait, "wait", false, "with -via http: each POST asks Prefer: wait=20 and the agent-perceived latency to its 200 is reported")
	fs.StringVar(&bc.CPUProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	workflows := fs.Bool("workflows", false, "run -n three-step workflows instead of single operations (-rate in workflows per second)")
	fs.StringVar(&bc.MemProfile, "memprofile", "", "soak: write a heap profile at the end of the run to this file")
	fs.DurationVar(&bc.Duration, "duration", 0, "soak: run at -rate for this long (-n unused), printing throughput, latency, memory and table sizes every -window")
	fs.DurationVar(&bc.Window, "window", time.Minute, "soak: the interval of its lines")
	fs.DurationVar(&bc.Retention, "retention", 0, "the bench tool's dedup_window: settled operations are pruned to tombstones after it (0: the default 720h)")
	fs.IntVar(&bc.History, "history", 0, "seed this many settled operations of history (copies of the warm-up's, keys and downstream ids of their own, dated back at -rate) before the measured run, then vacuum, analyze and checkpoint as a production server would; the run is then against a database with that history")
	fs.StringVar(&bc.In, "in", "", "run (or soak, with -duration) in this existing database (one that -keep left, with its history) instead of a fresh one, under keys of the run's own; it is kept")
	fs.DurationVar(&bc.TombstoneRetention, "tombstone-retention", 0, "with -retention: delete tombstones after this long (0: keep them)")
	if err := fs.parse(args); err != nil {
		return err
	}
	cfg, err := app.FromEnv(getenv)
	if err != nil {
		return err
	}
	run := loadgen.Run
	if *workflows {
		run = loadgen.RunWorkflows
	}
	err = run(ctx, bc, cfg, getenv, stdout, stderr)
	if errors.Is(err, loadgen.ErrConfig) {
		// main prints nothing for a usage error (the flag package has
		// printed it already); this one no flag parser has seen.
		fmt.Fprintln(stderr, "effectline bench:", err)
		err = fmt.Errorf("%w: %w", errUsage, err)
	}
	return err
}

// openDatabase parses the flags of a command that works on the database
// alone and connects to the database the environment names. The caller
// closes the pool.
func openDatabase(ctx context.Context, fs *cmdFlags, args []string, getenv func(string) string) (*pgxpool.Pool, error) {
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	cfg, err := app.FromEnv(getenv)
	if err != nil {
		return nil, err
	}
	return app.ConnectDatabase(ctx, cfg.DatabaseURL)
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	pool, err := openDatabase(ctx, newFlags("migrate", stdout, stderr), args, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "schema is up to date")
		return nil
	}
	fmt.Fprintf(stdout, "applied migrations %v\n", applied)
	return nil
}

func runProjectorCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		newFlags("projector rebuild", stdout, stderr).printHelp(stdout)
		return errHelp
	}
	if len(args) == 0 || args[0] != "rebuild" {
		fmt.Fprintln(stderr, "usage: effectline projector rebuild")
		return errUsage
	}
	pool, err := openDatabase(ctx, newFlags("projector rebuild", stdout, stderr), args[1:], getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	start := time.Now()
	n, err := projector.Rebuild(ctx, store.New(pool), workflow.NewJournal(pool))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuilt operation_state: %d operations, workflow_state: %d workflow runs in %s\n",
		n.Operations, n.Workflows, time.Since(start).Round(time.Millisecond))
	return nil
}

// runHealthcheck is the container healthcheck: distroless images have no
// shell or curl, so the binary checks itself.
func runHealthcheck(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	url := ""
	if len(args) > 0 {
		url = args[0]
	}
	if url == "" {
		addr := getenv(app.EnvHTTPAddr)
		if addr == "" {
			addr = app.DefaultHTTPAddr
		}
		url = "http://" + addr + "/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
