// Package app is the composition root that effectline's commands share:
// it reads no flags, but given a [Config] it opens the database pool, the
// group committer, the tools and telemetry, builds the named components
// and runs them until the context ends, shutting down in order. The `dev`,
// `run` and `bench` commands differ only in what they put around it.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/executor"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/telemetry"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/watch"
	"github.com/effectline/effectline/workflow"
)

// App is one effectline process: the shared plumbing (database pool, group
// committer, tools, telemetry) and whichever components it runs.
type App struct {
	Config    Config
	Log       *slog.Logger
	Tel       *telemetry.Telemetry
	Pool      *pgxpool.Pool
	Store     *store.Store
	Committer *store.Committer
	Tools     *tool.Registry
	Workflows *workflow.Service
	Kafka     kafka.Config
	// open is dev mode without tokens: every request is the principal dev.
	open bool
	// apiDrain is the API's api.Config.ShutdownDelay (see
	// APIShutdownDelay).
	apiDrain time.Duration
	// soleWriter: Options.SoleWriter.
	soleWriter bool

	// crashPoint is the executor's and the workflow driver's crash hook;
	// nil unless built with the crashpoints tag (crashpoint.go).
	crashPoint func(string)

	comps  []Component
	relays []*outbox.Relay
	apiSrv *api.Server
	// Waits wakes the API's waiting requests; it runs beside the API.
	Waits *watch.Hub
	// waitsConfig, when set (by tests), adjusts the hub's configuration.
	waitsConfig func(*watch.Config)
	health      *http.Server
	ln          net.Listener
}

// ConnectDatabase opens the pool, turning an unreachable server into an
// error that says how to start one.
func ConnectDatabase(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return connectDatabase(ctx, url, nil)
}

// connectDatabase is ConnectDatabase with tracer (nil for none) on the
// pool's connections, and so on every connection a component opens on the
// pool's settings: the relay's LISTEN, the projector's write pool and its
// durability watch.
func connectDatabase(ctx context.Context, url string, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var pool *pgxpool.Pool
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		err = fmt.Errorf("parsing the database URL: %w", err)
	} else {
		cfg.ConnConfig.Tracer = tracer
		pool, err = store.ConnectConfig(cctx, cfg)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped (a signal) while connecting: nothing is wrong with the
		// server, so no advice about starting it.
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", ctx.Err())
	}
	if errors.Is(err, store.ErrNoDatabase) {
		return nil, fmt.Errorf("%w\n\nThe server is running; the database %s names is missing. Create it:\n  %s\n"+
			"or point %s at an existing database.", err, EnvDatabaseURL, createdbCommand(url), EnvDatabaseURL)
	}
	if err != nil {
		return nil, fmt.Errorf("%w\n\nPostgreSQL must be running and reachable through %s (now %q).\n"+
			"On Debian: pg_ctlcluster $(ls /etc/postgresql) main start\n"+
			"Elsewhere: docker compose -f docker-compose.kafka.yml up -d postgres", err, EnvDatabaseURL, RedactURL(url))
	}
	return pool, nil
}

// createdbCommand is the createdb command line that creates the database
// url names, on the server it names.
func createdbCommand(url string) string {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return "createdb DBNAME"
	}
	cc := pc.ConnConfig
	return fmt.Sprintf("createdb -h %s -p %d -U %s %s", cc.Host, cc.Port, cc.User, cc.Database)
}

// RedactURL hides a password in a database URL.
func RedactURL(u string) string {
	if pu, err := pgxpool.ParseConfig(u); err == nil && pu.ConnConfig.Password != "" {
		return fmt.Sprintf("postgres://%s:***@%s:%d/%s", pu.ConnConfig.User, pu.ConnConfig.Host, pu.ConnConfig.Port, pu.ConnConfig.Database)
	}
	return u
}

// Options says which process New assembles.
type Options struct {
	Config     Config
	Stdout     io.Writer // where the logs go
	Getenv     func(string) string
	Components []string // the components that will be built, to check for tools
	Migrate    bool
	Tools      *tool.Registry // overrides Config.ToolsFile (dev --demo)
	// Workflows declares the workflows of Tools, a registry given in code
	// (dev --demo); nil declares none.
	Workflows *workflow.Set
	Open      bool
	Service   string // the OpenTelemetry service name
	Version   string
	// APIDrain: see APIShutdownDelay. Zero under dev, which nothing
	// balances traffic to, so Ctrl-C exits at once.
	APIDrain time.Duration
	// SoleWriter says this process journals every event of every
	// operation but the intents agents append themselves: dev and bench,
	// one process with every component, no replicas. Its waiters are then
	// woken from its own commits and the sweep alone, and do not tail the
	// outcomes topic (see waitFeed).
	SoleWriter bool
	// waits, when set (by this package's tests), adjusts the waiters' hub.
	waits func(*watch.Config)
	// tracer, when set (by this package's tests), sees every statement the
	// process runs (connectDatabase).
	tracer pgx.QueryTracer
}

// APIShutdownDelay is how long `run` keeps the API serving after SIGTERM
// with /readyz already answering 503, so that Kubernetes endpoints and load
// balancers stop routing to the instance before its listener closes;
// without it, requests in that window meet a refused connection. It runs
// alongside the executor's drain and is capped by EFFECTLINE_SHUTDOWN_GRACE,
// the operator's bound on how long a shutdown may take.
const APIShutdownDelay = 2 * time.Second

// Open assembles the process: New, the topics provisioned, and
// o.Components built (the API listening, not yet serving). Run runs them.
// On error nothing stays open.
func Open(ctx context.Context, o Options) (*App, error) {
	a, err := New(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := a.EnsureTopics(ctx); err != nil {
		a.Close(ctx)
		return nil, err
	}
	if a.comps, err = a.build(o.Components); err != nil {
		a.Close(ctx)
		return nil, err
	}
	return a, nil
}

// Run runs the components Open built until ctx ends or one fails, then
// shuts down in order and closes the App.
func (a *App) Run(ctx context.Context) error { return a.run(ctx, a.comps) }

// New opens what every component shares, without building any. On error
// nothing stays open.
func New(ctx context.Context, o Options) (*App, error) {
	tel, err := telemetry.Setup(ctx, telemetry.Config{
		ServiceName: o.Service, ServiceVersion: o.Version, Getenv: o.Getenv,
		LogWriter: o.Stdout, LogLevel: o.Config.LogLevel,
	})
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	a := &App{Config: o.Config, Tel: tel, Log: tel.Logger(), open: o.Open, apiDrain: o.APIDrain,
		soleWriter: o.SoleWriter, crashPoint: crashPoint(o.Getenv), waitsConfig: o.waits}
	a.Pool, err = connectDatabase(ctx, o.Config.DatabaseURL, o.tracer)
	if err != nil {
		_ = tel.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	if o.Migrate {
		if _, err := store.Migrate(ctx, a.Pool); err != nil {
			a.Close(ctx)
			return nil, err
		}
	}
	store.SetRowFormat(o.Config.RowFormat)
	a.Store = store.New(a.Pool)
	// One flusher, and up to three more only while a backlog lasts: at a
	// moderate rate a second transaction in flight mostly splits what would
	// have been one batch (`effectline bench -rate 500`: 1.09 synchronous
	// commits per operation with one flusher, 1.24 with two, 1.94 with four
	// always on, at the same latency), while flat out one backend executing
	// every append in turn held the executor back (docs/benchmarks.md).
	a.Committer = a.Store.NewCommitter(store.CommitterConfig{Flushers: 4, Window: o.Config.CommitWindow,
		MeterProvider: a.Tel.MeterProvider()})
	a.Tools = o.Tools
	if a.Tools == nil {
		switch {
		case o.Config.ToolsFile != "":
			if a.Tools, err = httptool.Load(o.Config.ToolsFile, o.Getenv); err != nil {
				a.Close(ctx)
				return nil, err
			}
		case needsTools(o.Components):
			a.Close(ctx)
			return nil, fmt.Errorf("%s is required for the executor, reconciler, workflow and api: the path of the tools file", EnvTools)
		default:
			a.Tools = tool.NewRegistry()
		}
	}
	if err := a.loadWorkflows(o); err != nil {
		a.Close(ctx)
		return nil, err
	}
	a.Kafka = kafka.Config{
		Brokers: o.Config.KafkaBrokers, TopicPrefix: o.Config.TopicPrefix,
		Partitions: o.Config.Partitions, ReplicationFactor: o.Config.Replication,
		InstanceID: o.Config.KafkaInstanceID,
	}.WithDefaults()
	return a, nil
}

// redactArgs redacts an intent's args for the outcomes topic with the
// tool's own marks; a tool this process does not know (a relay run without
// EFFECTLINE_TOOLS) is redacted by field names only.
func (a *App) redactArgs(name string, args json.RawMessage) json.RawMessage {
	var spec *tool.Spec
	if t, ok := a.Tools.Get(name); ok && t != nil {
		spec = t.Spec()
	}
	return tool.Scrub(spec, args, args)
}

func needsTools(components []string) bool {
	for _, c := range components {
		if c == Executor || c == Reconciler || c == API || c == Workflow {
			return true
		}
	}
	return false
}

// Close closes the pool and flushes telemetry; Run calls it on the way out.
func (a *App) Close(ctx context.Context) {
	if a.Pool != nil {
		a.Pool.Close()
	}
	if a.Tel != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = a.Tel.Shutdown(sctx)
	}
}

// RelayStats sums the counters of the outbox relays this process runs:
// the soak prints them per window, so a stall of the pipeline can be told
// from a relay that failed to publish.
func (a *App) RelayStats() outbox.RelayStats {
	var sum outbox.RelayStats
	for _, r := range a.relays {
		st := r.Stats()
		sum.Published += st.Published
		sum.Skipped += st.Skipped
		sum.Batches += st.Batches
		sum.Errors += st.Errors
		sum.BatchTime += st.BatchTime
		sum.SendTime += st.SendTime
		sum.Rotations += st.Rotations
		sum.Truncates += st.Truncates
		sum.TruncateBusy += st.TruncateBusy
	}
	return sum
}

// Component is one long-running part with the Run(ctx) shape.
type Component struct {
	name string
	run  func(ctx context.Context) error
}

// build constructs the named components. The HTTP server is built here too
// (not started) so dev can print its address before anything runs.
func (a *App) build(names []string) ([]Component, error) {
	var out []Component
	mp := a.Tel.MeterProvider()
	// One service base for every component: they log, trace and count
	// into the process's telemetry.
	base := service.Base{Logger: a.Log, TracerProvider: a.Tel.TracerProvider(), MeterProvider: mp}
	for _, name := range names {
		switch name {
		case Relay:
			producer, err := kafka.NewProducer(a.Kafka)
			if err != nil {
				return nil, err
			}
			// Listen: writers in other processes wake it with a NOTIFY
			// (their outbox.Notifier, below), not only its poll.
			relay := outbox.NewRelay(a.Store, producer, outbox.RelayConfig{Base: base, Listen: true, Window: a.Config.RelayWindow,
				IntentsTopic: a.Kafka.Topic(events.TopicIntents), RedactArgs: a.redactArgs})
			a.relays = append(a.relays, relay)
			out = append(out, Component{name, func(ctx context.Context) error {
				defer producer.Close()
				return relay.Run(ctx)
			}})
		case Executor:
			x, err := executor.New(a.Store, a.Tools, executor.Config{
				Kafka: a.Kafka, Committer: a.Committer, ShutdownGrace: a.Config.ShutdownGrace, Lease: a.Config.Lease,
				CrashPoint: a.crashPoint, KafkaPrincipals: a.Config.KafkaPrincipals,
				Base: base,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, Component{name, x.Run})
		case Projector:
			// The workflow projection runs wherever the projector does, so
			// GET /v1/workflows lists what the journal holds whichever
			// processes run the workflow driver.
			p, err := projector.New(projector.Config{
				Kafka: a.Kafka, Store: a.Store, Base: base, Workflows: workflow.NewJournal(a.Pool),
			})
			if err != nil {
				return nil, err
			}
			out = append(out, Component{name, p.Run})
		case Reconciler:
			r, err := reconciler.New(a.Store, a.Tools, reconciler.Config{
				Kafka: a.Kafka, Committer: a.Committer, SweepInterval: a.Config.SweepInterval,
				Base: base,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, Component{name, r.Run})
			// The pruner runs wherever the reconciler does (see prune.go).
			pr, err := a.newPruner()
			if err != nil {
				return nil, err
			}
			out = append(out, Component{"pruner", pr.Run})
		case Workflow:
			c, err := a.workflowComponent()
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		case API:
			srv, err := a.buildAPI()
			if err != nil {
				return nil, err
			}
			a.apiSrv = srv
			out = append(out, Component{name, srv.Run}, Component{"waiters", a.Waits.Run})
		}
	}
	if groups := consumerGroups(a.Kafka, names); len(groups) > 0 {
		lag, err := kafka.NewLagMonitor(a.Kafka, groups, kafka.LagConfig{MeterProvider: mp, Logger: a.Log})
		if err != nil {
			return nil, err
		}
		out = append(out, Component{"consumer_lag", lag.Run})
	}
	// A process that journals events and runs no relay wakes the relays of
	// the others after its commits; one with a relay wakes its own in
	// process (store.OnAppend), and those of other processes find the
	// rows its relay left at their poll.
	if needsNotifier(names) {
		n := outbox.NewNotifier(a.Pool, base)
		a.Store.OnAppend(n.Signal)
		out = append(out, Component{"outbox_notifier", n.Run})
	}
	return out, nil
}

// needsNotifier says whether a process of these components journals events
// (every component but the relay and the projector does) with no relay of
// its own to wake.
func needsNotifier(names []string) bool {
	writes := func(name string) bool {
		return name == Executor || name == Reconciler || name == Workflow || name == API
	}
	return !slices.Contains(names, Relay) && slices.ContainsFunc(names, writes)
}

// consumerGroups are the Kafka consumer groups of the named components,
// whose lag the process reports (contract §8). Each process reports the
// groups it runs; replicas of a group report the same figure, which the
// broker holds.
func consumerGroups(k kafka.Config, names []string) []kafka.GroupTopic {
	var out []kafka.GroupTopic
	for _, name := range names {
		switch name {
		case Executor:
			out = append(out, kafka.GroupTopic{Group: executor.Config{}.WithDefaults().Group, Topic: k.Topic(events.TopicIntents)})
		case Projector:
			out = append(out, kafka.GroupTopic{Group: projector.DefaultGroup, Topic: k.Topic(events.TopicOutcomes)},
				kafka.GroupTopic{Group: projector.DefaultWorkflowGroup, Topic: k.Topic(events.TopicWorkflows)})
		case Reconciler:
			out = append(out, kafka.GroupTopic{Group: reconciler.Config{}.WithDefaults().Group, Topic: k.Topic(events.TopicOutcomes)})
		}
	}
	return out
}

// APIAddr is the address the API listens on, once Open has built it; empty
// without the API.
func (a *App) APIAddr() string {
	if a.apiSrv == nil {
		return ""
	}
	return a.apiSrv.Addr()
}

// waitFeed is the feed that wakes the API's waiters besides this
// process's commits: the outcomes topic, which carries the events other
// processes journal (executors, reconcilers and API replicas elsewhere),
// or nothing in a sole writer. There it would only repeat what the commits
// delivered, at the cost of reading and decoding every event once more:
// ~0.1 ms of the process's CPU per operation at 500/s with waits
// (docs/benchmarks.md, session 16). What a sole writer does not journal, an agent's own
// intent, needs no feed: a waiter on it is woken by the executor's next
// event (a gap it fills with one read of the head) or, if none comes, by
// the sweep.
func (a *App) waitFeed() watch.Feed {
	if a.soleWriter {
		return nil
	}
	return watch.NewKafkaFeed(a.Kafka, a.Log)
}

func (a *App) buildAPI() (*api.Server, error) {
	tokens, err := api.ParseTokens(a.Config.APITokens)
	if err != nil {
		return nil, err
	}
	approvers := a.Config.Approvers
	webhooks, err := reconciler.NewWebhooks(a.Store, a.Tools, reconciler.WebhookConfig{
		TopicPrefix: a.Kafka.TopicPrefix, Logger: a.Log,
		TracerProvider: a.Tel.TracerProvider(), MeterProvider: a.Tel.MeterProvider(),
	})
	if err != nil {
		return nil, err
	}
	wc := watch.Config{Loader: a.Store, Feed: a.waitFeed(), Logger: a.Log}
	if a.waitsConfig != nil {
		a.waitsConfig(&wc)
	}
	a.Waits, err = watch.New(wc)
	if err != nil {
		return nil, err
	}
	// Two feeds wake the waiters. The store's commits carry every event
	// appended in this process (by the executor, reconciler and workflow
	// driver beside the API, and by the API itself: intents, decisions,
	// webhooks) the moment it commits, skipping the relay → Kafka →
	// consumer hop of several milliseconds. The Kafka feed carries the
	// events of other processes (an API on its own, replicas). Both may
	// deliver one event: a waiter folds only the next seq, so a repeat is
	// skipped and an event ahead of its predecessor reloads the record.
	a.Store.OnCommit(a.Waits.Deliver)
	srv, err := api.New(api.Config{
		Addr: a.Config.HTTPAddr, Tokens: tokens, Approvers: approvers, Readers: a.Config.Readers,
		Open: a.open || (a.Config.InsecureOpen && len(tokens) == 0), TopicPrefix: a.Kafka.TopicPrefix,
		Logger: a.Log, TracerProvider: a.Tel.TracerProvider(), MeterProvider: a.Tel.MeterProvider(),
		// /readyz answers 503 during the delay, so traffic drains first.
		ShutdownDelay: a.apiDrain,
	}, api.Deps{
		Store:      a.Store,
		Committer:  a.Committer,
		Tools:      a.Tools,
		Operations: projector.NewReader(a.Pool),
		// Runs are listed from the read model and read one by one from
		// their heads (Workflows), as operations are.
		WorkflowRuns: projector.NewReader(a.Pool),
		Metrics:      a.Tel.MetricsHandler(),
		// With the tools, decisions apply the tools' approval rules and ask
		// the downstream again before a retry or an abandon.
		Decider: reconciler.NewDecider(a.Store, reconciler.WithTopicPrefix(a.Kafka.TopicPrefix),
			reconciler.WithTelemetry(a.Tel.TracerProvider(), a.Tel.MeterProvider()), reconciler.WithTools(a.Tools)),
		Webhooks:  webhooks,
		Workflows: a.Workflows,
		Waits:     a.Waits,
		Catalogue: api.RegistryCatalogue(a.Tools),
	})
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		return nil, addrError(err, a.Config.HTTPAddr)
	}
	return srv, nil
}

// run runs the committer and the components until ctx ends or one of
// them fails, then shuts down in order: readiness off first, components
// drained, the committer (which journals the last outcomes) last.
func (a *App) run(ctx context.Context, comps []Component) error {
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	committerDone := make(chan error, 1)
	go func() { committerDone <- a.Committer.Run(commitCtx) }()

	if a.apiSrv == nil && a.Config.HTTPAddrSet && a.healthServer() != nil {
		comps = append(comps, Component{"health", a.serveHealth})
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
		a.Log.Info("shutting down", "reason", context.Cause(ctx))
	case first = <-errs:
		a.Log.Error("a component failed, shutting down", "error", first)
	}
	if a.apiSrv != nil {
		a.apiSrv.SetUnready()
	}
	stopComps()
	wg.Wait()
	stopCommitter()
	<-committerDone
	a.Close(ctx)
	return first
}

// healthServer serves /healthz, /readyz and /metrics in processes without
// the API, so every deployment has probes and a scrape target.
func (a *App) healthServer() *http.Server {
	if a.health != nil {
		return a.health
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.Pool.Ping(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", a.Tel.MetricsHandler())
	a.health = &http.Server{Addr: a.Config.HTTPAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	return a.health
}

func (a *App) serveHealth(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.Config.HTTPAddr)
	if err != nil {
		return fmt.Errorf("health endpoint: %w", addrError(err, a.Config.HTTPAddr))
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

// addrError says what to do when the HTTP address is taken: the default
// port is the first thing two effectline processes on one machine share.
func addrError(err error, addr string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w\n\n%s is already in use (another effectline, or another server). "+
		"Set %s to a free address, e.g. %s=127.0.0.1:8081", err, addr, EnvHTTPAddr, EnvHTTPAddr)
}

// EnsureTopics provisions the topics on the configured brokers.
// While the brokers do not answer it says so every KafkaProgressEvery, so
// a wrong EFFECTLINE_KAFKA_BROKERS is not half a minute of silence.
func (a *App) EnsureTopics(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- kafka.EnsureTopics(ctx, a.Kafka) }()
	start := time.Now()
	tick := time.NewTicker(KafkaProgressEvery)
	defer tick.Stop()
	brokers := strings.Join(a.Kafka.Brokers, ",")
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("%w\n\nCheck %s (now %q), or leave it unset under `effectline dev` to use the embedded broker",
					err, EnvKafkaBrokers, brokers)
			}
			return nil
		case <-tick.C:
			waited := time.Since(start).Round(time.Second)
			a.Log.Warn(fmt.Sprintf("still waiting for Kafka at %s (%d s); giving up after %s", brokers, int(waited.Seconds()), a.Kafka.ConnectTimeout),
				"brokers", brokers, "env", EnvKafkaBrokers)
		}
	}
}

// KafkaProgressEvery is how often EnsureTopics reports that it is still
// waiting for the brokers.
const KafkaProgressEvery = 5 * time.Second
