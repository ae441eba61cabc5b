package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/telemetry"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// app is one effectline process: the shared plumbing (database pool, group
// committer, tools, telemetry) and whichever components it runs.
type app struct {
	cfg       config
	log       *slog.Logger
	tel       *telemetry.Telemetry
	pool      *pgxpool.Pool
	store     *store.Store
	committer *store.Committer
	tools     *tool.Registry
	kafka     kafka.Config
	// open is dev mode without tokens: every request is the principal dev.
	open bool
	// apiDrain is the API's api.Config.ShutdownDelay (see
	// apiShutdownDelay).
	apiDrain time.Duration

	apiSrv *api.Server
	health *http.Server
	ln     net.Listener
}

// connectDatabase opens the pool, turning an unreachable server into an
// error that says how to start one.
func connectDatabase(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := store.Connect(cctx, url)
	if err != nil {
		return nil, fmt.Errorf("%w\n\nPostgreSQL must be running and reachable through %s (now %q).\n"+
			"On Debian: pg_ctlcluster $(ls /etc/postgresql) main start\n"+
			"Elsewhere: docker compose -f docker-compose.kafka.yml up -d postgres", err, envDatabaseURL, redactURL(url))
	}
	return pool, nil
}

// redactURL hides a password in a database URL.
func redactURL(u string) string {
	if pu, err := pgxpool.ParseConfig(u); err == nil && pu.ConnConfig.Password != "" {
		return fmt.Sprintf("postgres://%s:***@%s:%d/%s", pu.ConnConfig.User, pu.ConnConfig.Host, pu.ConnConfig.Port, pu.ConnConfig.Database)
	}
	return u
}

type appOptions struct {
	cfg        config
	stdout     io.Writer
	getenv     func(string) string
	components []string
	migrate    bool
	tools      *tool.Registry // overrides cfg.ToolsFile (dev --demo)
	open       bool
	service    string
	// apiDrain: see apiShutdownDelay. Zero under dev, which nothing
	// balances traffic to, so Ctrl-C exits at once.
	apiDrain time.Duration
}

// apiShutdownDelay is how long `run` keeps the API serving after SIGTERM
// with /readyz already answering 503, so that Kubernetes endpoints and load
// balancers stop routing to the instance before its listener closes;
// without it, requests in that window meet a refused connection. It runs
// alongside the executor's drain and is capped by EFFECTLINE_SHUTDOWN_GRACE,
// the operator's bound on how long a shutdown may take.
const apiShutdownDelay = 2 * time.Second

func newApp(ctx context.Context, o appOptions) (*app, error) {
	tel, err := telemetry.Setup(ctx, telemetry.Config{
		ServiceName: o.service, ServiceVersion: version, Getenv: o.getenv,
		LogWriter: o.stdout, LogLevel: o.cfg.LogLevel,
	})
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	a := &app{cfg: o.cfg, tel: tel, log: tel.Logger(), open: o.open, apiDrain: o.apiDrain}
	a.pool, err = connectDatabase(ctx, o.cfg.DatabaseURL)
	if err != nil {
		_ = tel.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	if o.migrate {
		if _, err := store.Migrate(ctx, a.pool); err != nil {
			a.close(ctx)
			return nil, err
		}
	}
	a.store = store.New(a.pool)
	// One flusher, and up to three more only while a backlog lasts: at a
	// moderate rate a second transaction in flight mostly splits what would
	// have been one batch (`effectline bench -rate 500`: 1.09 synchronous
	// commits per operation with one flusher, 1.24 with two, 1.94 with four
	// always on, at the same latency), while flat out one backend executing
	// every append in turn held the executor back (docs/benchmarks.md).
	a.committer = a.store.NewCommitter(store.CommitterConfig{Flushers: 4, Window: o.cfg.CommitWindow,
		MeterProvider: a.tel.MeterProvider()})
	a.tools = o.tools
	if a.tools == nil {
		switch {
		case o.cfg.ToolsFile != "":
			if a.tools, err = tool.Load(o.cfg.ToolsFile, o.getenv); err != nil {
				a.close(ctx)
				return nil, err
			}
		case needsTools(o.components):
			a.close(ctx)
			return nil, fmt.Errorf("%s is required for the executor, reconciler and api: the path of the tools file", envTools)
		default:
			a.tools = tool.NewRegistry()
		}
	}
	a.kafka = kafka.Config{
		Brokers: o.cfg.KafkaBrokers, TopicPrefix: o.cfg.TopicPrefix,
		Partitions: o.cfg.Partitions, ReplicationFactor: o.cfg.Replication,
	}.WithDefaults()
	return a, nil
}

// redactArgs redacts an intent's args for the outcomes topic with the
// tool's own marks; a tool this process does not know (a relay run without
// EFFECTLINE_TOOLS) is redacted by field names only.
func (a *app) redactArgs(name string, args json.RawMessage) json.RawMessage {
	var spec *tool.Spec
	if t, ok := a.tools.Get(name); ok && t != nil {
		spec = t.Spec()
	}
	return tool.Scrub(spec, args, args)
}

func needsTools(components []string) bool {
	for _, c := range components {
		if c == componentExecutor || c == componentReconciler || c == componentAPI {
			return true
		}
	}
	return false
}

func (a *app) close(ctx context.Context) {
	if a.pool != nil {
		a.pool.Close()
	}
	if a.tel != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = a.tel.Shutdown(sctx)
	}
}

// component is one long-running part with the Run(ctx) shape.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// build constructs the named components. The HTTP server is built here too
// (not started) so dev can print its address before anything runs.
func (a *app) build(names []string) ([]component, error) {
	var out []component
	tp, mp := a.tel.TracerProvider(), a.tel.MeterProvider()
	for _, name := range names {
		switch name {
		case componentRelay:
			producer, err := kafka.NewProducer(a.kafka)
			if err != nil {
				return nil, err
			}
			relay := outbox.NewRelay(a.store, producer, outbox.RelayConfig{Logger: a.log, TracerProvider: tp, MeterProvider: mp,
				IntentsTopic: a.kafka.Topic(events.TopicIntents), RedactArgs: a.redactArgs})
			out = append(out, component{name, func(ctx context.Context) error {
				defer producer.Close()
				return relay.Run(ctx)
			}})
		case componentExecutor:
			x, err := executor.New(a.store, a.tools, executor.Config{
				Kafka: a.kafka, Committer: a.committer, ShutdownGrace: a.cfg.ShutdownGrace, Lease: a.cfg.Lease,
				CrashPoint: crashAt(a.cfg.CrashPoint),
				Logger:     a.log, TracerProvider: tp, MeterProvider: mp,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, component{name, x.Run})
		case componentProjector:
			p, err := projector.New(projector.Config{
				Kafka: a.kafka, Store: a.store, Logger: a.log, TracerProvider: tp, MeterProvider: mp,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, component{name, p.Run})
		case componentReconciler:
			r, err := reconciler.New(a.store, a.tools, reconciler.Config{
				Kafka: a.kafka, Committer: a.committer, SweepInterval: a.cfg.SweepInterval,
				Logger: a.log, TracerProvider: tp, MeterProvider: mp,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, component{name, r.Run})
		case componentAPI:
			srv, err := a.buildAPI()
			if err != nil {
				return nil, err
			}
			a.apiSrv = srv
			out = append(out, component{name, srv.Run})
		}
	}
	if groups := consumerGroups(a.kafka, names); len(groups) > 0 {
		lag, err := kafka.NewLagMonitor(a.kafka, groups, kafka.LagConfig{MeterProvider: mp, Logger: a.log})
		if err != nil {
			return nil, err
		}
		out = append(out, component{"consumer_lag", lag.Run})
	}
	return out, nil
}

// consumerGroups are the Kafka consumer groups of the named components,
// whose lag the process reports (DESIGN §8). Each process reports the
// groups it runs; replicas of a group report the same figure, which the
// broker holds.
func consumerGroups(k kafka.Config, names []string) []kafka.GroupTopic {
	var out []kafka.GroupTopic
	for _, name := range names {
		switch name {
		case componentExecutor:
			out = append(out, kafka.GroupTopic{Group: executor.Config{}.WithDefaults().Group, Topic: k.Topic(events.TopicIntents)})
		case componentProjector:
			out = append(out, kafka.GroupTopic{Group: projector.DefaultGroup, Topic: k.Topic(events.TopicOutcomes)})
		case componentReconciler:
			out = append(out, kafka.GroupTopic{Group: reconciler.Config{}.WithDefaults().Group, Topic: k.Topic(events.TopicOutcomes)})
		}
	}
	return out
}

func (a *app) buildAPI() (*api.Server, error) {
	tokens, err := api.ParseTokens(a.cfg.APITokens)
	if err != nil {
		return nil, err
	}
	approvers := a.cfg.Approvers
	webhooks, err := reconciler.NewWebhooks(a.store, a.tools, reconciler.WebhookConfig{
		TopicPrefix: a.kafka.TopicPrefix, Logger: a.log,
		TracerProvider: a.tel.TracerProvider(), MeterProvider: a.tel.MeterProvider(),
	})
	if err != nil {
		return nil, err
	}
	srv, err := api.New(api.Config{
		Addr: a.cfg.HTTPAddr, Tokens: tokens, Approvers: approvers, Readers: a.cfg.Readers,
		Open: a.open || (a.cfg.InsecureOpen && len(tokens) == 0), TopicPrefix: a.kafka.TopicPrefix,
		Logger: a.log, TracerProvider: a.tel.TracerProvider(), MeterProvider: a.tel.MeterProvider(),
		// /readyz answers 503 during the delay, so traffic drains first.
		ShutdownDelay: a.apiDrain,
	}, api.Deps{
		Store:      a.store,
		Committer:  a.committer,
		Tools:      a.tools,
		Operations: projector.NewReader(a.pool),
		Metrics:    a.tel.MetricsHandler(),
		// With the tools, decisions apply the tools' approval rules and ask
		// the downstream again before a retry or an abandon.
		Decider: reconciler.NewDecider(a.store, reconciler.WithTopicPrefix(a.kafka.TopicPrefix),
			reconciler.WithTelemetry(a.tel.TracerProvider(), a.tel.MeterProvider()), reconciler.WithTools(a.tools)),
		Webhooks: webhooks,
	})
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		return nil, err
	}
	return srv, nil
}

// runAll runs the committer and the components until ctx ends or one of
// them fails, then shuts down in order: readiness off first, components
// drained, the committer (which journals the last outcomes) last.
func (a *app) runAll(ctx context.Context, comps []component) error {
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	committerDone := make(chan error, 1)
	go func() { committerDone <- a.committer.Run(commitCtx) }()

	if a.apiSrv == nil && a.cfg.HTTPAddrSet && a.healthServer() != nil {
		comps = append(comps, component{"health", a.serveHealth})
	}

	compCtx, stopComps := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	errs := make(chan error, len(comps))
	for _, c := range comps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.run(compCtx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("%s: %w", c.name, err)
			}
		}()
	}
	var first error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down", "reason", context.Cause(ctx))
	case first = <-errs:
		a.log.Error("a component failed, shutting down", "error", first)
	}
	if a.apiSrv != nil {
		a.apiSrv.SetUnready()
	}
	stopComps()
	wg.Wait()
	stopCommitter()
	<-committerDone
	a.close(ctx)
	return first
}

// healthServer serves /healthz, /readyz and /metrics in processes without
// the API, so every deployment has probes and a scrape target.
func (a *app) healthServer() *http.Server {
	if a.health != nil {
		return a.health
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.pool.Ping(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", a.tel.MetricsHandler())
	a.health = &http.Server{Addr: a.cfg.HTTPAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	return a.health
}

func (a *app) serveHealth(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("health endpoint: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- a.health.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return a.health.Shutdown(sctx)
	case err := <-errc:
		return err
	}
}

// runComponents is `effectline run`.
func runComponents(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	list := fs.String("components", "", "comma-separated: relay,executor,projector,reconciler,api")
	insecure := fs.Bool("insecure-open", false, "serve the API without tokens (every caller is the approver 'dev'); for closed networks only")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names, err := parseComponents(*list)
	if err != nil {
		return err
	}
	cfg, err := configFromEnv(getenv)
	if err != nil {
		return err
	}
	cfg.InsecureOpen = cfg.InsecureOpen || *insecure
	if len(cfg.KafkaBrokers) == 0 {
		return fmt.Errorf("%s is required: the Kafka bootstrap brokers, e.g. kafka-1:9092,kafka-2:9092", envKafkaBrokers)
	}
	if contains(names, componentAPI) && cfg.APITokens == "" && !cfg.InsecureOpen {
		return api.ErrNoTokens
	}
	if contains(names, componentAPI) {
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
	a, err := newApp(ctx, appOptions{cfg: cfg, stdout: stdout, getenv: getenv, components: names, service: "effectline",
		apiDrain: min(apiShutdownDelay, cfg.ShutdownGrace)})
	if err != nil {
		return err
	}
	if err := ensureTopics(ctx, a); err != nil {
		a.close(ctx)
		return err
	}
	comps, err := a.build(names)
	if err != nil {
		a.close(ctx)
		return err
	}
	a.log.Info("effectline running", "components", names, "version", version)
	return a.runAll(ctx, comps)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func ensureTopics(ctx context.Context, a *app) error {
	if err := kafka.EnsureTopics(ctx, a.kafka); err != nil {
		return fmt.Errorf("%w\n\nCheck %s, or leave it unset under `effectline dev` to use the embedded broker", err, envKafkaBrokers)
	}
	return nil
}

// crashAt returns the executor's crash hook for EFFECTLINE_CRASHPOINT: it
// SIGKILLs this process the first time the named point is reached, as a
// power cut would, with no deferred cleanup and no offset commit.
func crashAt(point string) func(string) {
	if point == "" {
		return nil
	}
	return func(p string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is asynchronous; never run past the point
		}
	}
}
