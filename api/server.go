package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectline/effectline/api/mcp"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/watch"
)

// Committer journals one step of an operation; the store's group committer
// (store.Committer) in production, so concurrent intents share a commit.
type Committer interface {
	Append(ctx context.Context, a store.Append) (events.Operation, error)
}

// Deps are the parts the API talks to.
type Deps struct {
	// Store is the event store: the head record and history of operations.
	// Required.
	Store *store.Store
	// Committer journals intents. Default: Store, one transaction per
	// intent; pass a running store.Committer to group commits.
	Committer Committer
	// Tools are the registered tools (*tool.Registry). Required.
	Tools Tools
	// Operations pages the read model for GET /v1/operations
	// (*projector.Reader). Required.
	Operations Operations
	// Metrics serves GET /metrics (the Prometheus exporter's handler); nil
	// answers 404.
	Metrics http.Handler
	// Ready reports whether the process can serve (its dependencies answer).
	// Default: the store's database answers a ping.
	Ready func(ctx context.Context) error
	// Decider records approvers' decisions, for POST
	// /v1/operations/{key}/decisions and the approval UI
	// (*reconciler.Decider). Nil: those answer 503.
	Decider Decider
	// Webhooks applies inbound tool callbacks, for POST /v1/webhooks/{source}
	// (*reconciler.Webhooks). Nil: that route answers 503.
	Webhooks WebhookHandler
	// Workflows starts and reads workflow runs and records their decisions
	// (*workflow.Service). Nil: the workflow routes answer 503.
	Workflows Workflows
	// WorkflowRuns pages the workflow read model for GET /v1/workflows
	// (*projector.Reader). Nil: that route answers 503.
	WorkflowRuns WorkflowRuns
	// Waits wakes requests that wait for their operation (Prefer: wait,
	// ?wait=, the event stream); it must be running (watch.Hub.Run). Nil:
	// requests answer at once and streams poll the journal.
	Waits *watch.Hub
	// Catalogue lists the tools the MCP server on POST /mcp offers
	// (RegistryCatalogue); nil: no MCP endpoint.
	Catalogue []mcp.Tool
}

// Route is one registered route.
type Route struct {
	// Method is the HTTP method, "" for a pattern that matches any.
	Method string
	// Path is the path pattern, in the syntax of net/http.ServeMux (which is
	// also OpenAPI's path templating for single-segment wildcards).
	Path   string
	Access Access
}

// Server is the HTTP API. Create it with New, add routes with Handle before
// serving, then Run it (or mount Handler in another server).
type Server struct {
	cfg        Config
	log        *slog.Logger
	store      *store.Store
	committer  Committer
	tools      Tools
	operations Operations
	metrics    http.Handler
	ready      func(context.Context) error
	decider    Decider
	workflows  Workflows
	// workflowRuns is nil without Deps.WorkflowRuns.
	workflowRuns WorkflowRuns
	webhooks     WebhookHandler
	waits        *watch.Hub
	catalogue    []mcp.Tool
	auth         *authenticator
	tel          *telemetry

	mux  *http.ServeMux
	root http.Handler

	mu      sync.Mutex
	routes  []Route
	ln      net.Listener
	running bool

	unready atomic.Bool
}

// New returns a server with the routes of contract §7 registered. It does no
// I/O: Run listens.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	switch {
	case deps.Store == nil:
		return nil, errors.New("api: Deps.Store is required")
	case deps.Tools == nil:
		return nil, errors.New("api: Deps.Tools is required")
	case deps.Operations == nil:
		return nil, errors.New("api: Deps.Operations is required")
	}
	tel, err := newTelemetry(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("api: telemetry: %w", err)
	}
	s := &Server{
		cfg:          cfg,
		log:          cfg.Logger,
		store:        deps.Store,
		committer:    deps.Committer,
		tools:        deps.Tools,
		operations:   deps.Operations,
		metrics:      deps.Metrics,
		ready:        deps.Ready,
		decider:      deps.Decider,
		workflows:    deps.Workflows,
		workflowRuns: deps.WorkflowRuns,
		webhooks:     deps.Webhooks,
		waits:        deps.Waits,
		catalogue:    deps.Catalogue,
		auth:         newAuthenticator(cfg),
		tel:          tel,
		mux:          http.NewServeMux(),
	}
	if s.committer == nil {
		s.committer = deps.Store
	}
	if s.ready == nil {
		s.ready = func(ctx context.Context) error { return deps.Store.Pool().Ping(ctx) }
	}
	s.root = http.HandlerFunc(s.serveHTTP)
	s.registerRoutes()
	return s, nil
}

// Handle registers a route. pattern is a net/http.ServeMux pattern, with a
// method ("POST /v1/operations/{key}/decisions"); access says who may call
// it. The handler runs with tracing, metrics, the request timeout, panic
// recovery and, unless Public, the caller's principal in its context
// (PrincipalFrom, IsApprover). Handle panics on a pattern the mux refuses
// (a wiring mistake). Register every route before serving.
func (s *Server) Handle(pattern string, h http.Handler, access Access) {
	method, path := splitPattern(pattern)
	s.mux.Handle(pattern, s.instrument(method, path, s.guard(access, h)))
	s.mu.Lock()
	s.routes = append(s.routes, Route{Method: method, Path: path, Access: access})
	s.mu.Unlock()
}

// HandleFunc is Handle for a function.
func (s *Server) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request), access Access) {
	s.Handle(pattern, http.HandlerFunc(h), access)
}

// Routes returns the registered routes, in registration order.
func (s *Server) Routes() []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Route(nil), s.routes...)
}

// splitPattern splits "GET /path" into its method and path. Host patterns
// are not used by this server.
func splitPattern(pattern string) (method, path string) {
	if m, p, ok := strings.Cut(strings.TrimSpace(pattern), " "); ok {
		return m, strings.TrimSpace(p)
	}
	return "", pattern
}

// Handler returns the server's handler, for mounting in another server or a
// test server.
func (s *Server) Handler() http.Handler { return s.root }

// serveHTTP answers requests no route matches with the JSON error shape of
// every other response, rather than the mux's text/plain.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern == "" {
		start := time.Now()
		jw := &jsonMuxError{ResponseWriter: w}
		s.mux.ServeHTTP(jw, r)
		s.tel.record(r.Context(), r.Method, "", jw.status, time.Since(start))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// jsonMuxError rewrites the mux's own 404 and 405 answers as JSON errors,
// keeping the headers it set (Allow on a 405).
type jsonMuxError struct {
	http.ResponseWriter
	status   int
	replaced bool
}

func (w *jsonMuxError) WriteHeader(code int) {
	w.status = code
	switch code {
	case http.StatusNotFound:
		w.replaced = true
		writeError(w.ResponseWriter, code, codeNotFound, "no such endpoint")
	case http.StatusMethodNotAllowed:
		w.replaced = true
		writeError(w.ResponseWriter, code, codeMethodNotAllowed, "the endpoint does not accept this method")
	default:
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *jsonMuxError) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// SetUnready makes /readyz answer 503 from now on. Run calls it when its
// context ends, before it stops accepting connections, so load balancers
// drain the instance first.
func (s *Server) SetUnready() { s.unready.Store(true) }

// Listen binds Config.Addr. Run calls it if it was not called; calling it
// first lets the caller learn the address (Addr) before serving, e.g. to
// print it when the configured port is 0.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("api: listening on %s: %w", s.cfg.Addr, err)
	}
	s.ln = ln
	return nil
}

// Addr returns the address the server is bound to ("127.0.0.1:43117"), or
// "" before Listen or Run bound it.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run serves until ctx ends, then shuts down gracefully: /readyz turns 503,
// the server keeps serving for ShutdownDelay, stops accepting connections
// and waits up to ShutdownTimeout for in-flight requests, then closes what
// is left. It returns nil after a clean shutdown. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("api: Run called twice")
	}
	s.running = true
	ln := s.ln
	s.mu.Unlock()

	hs := &http.Server{
		Handler:           s.root,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// Requests must not be cancelled the moment shutdown begins: an
		// intent in the middle of its commit would answer 5xx although it
		// may have been journaled. Shutdown waits for them instead, so their
		// contexts keep ctx's values but not its cancellation.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	s.log.InfoContext(ctx, "http api listening", slog.String("addr", ln.Addr().String()),
		slog.Bool("open", s.cfg.Open))

	select {
	case err := <-served:
		return fmt.Errorf("api: serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}

	s.SetUnready()
	stopCtx := context.WithoutCancel(ctx)
	if s.cfg.ShutdownDelay > 0 {
		s.log.InfoContext(stopCtx, "http api draining", slog.Duration("delay", s.cfg.ShutdownDelay))
		t := time.NewTimer(s.cfg.ShutdownDelay)
		select {
		case <-t.C:
		case err := <-served:
			t.Stop()
			return fmt.Errorf("api: serving on %s: %w", ln.Addr(), err)
		}
	}
	shutdownCtx, cancel := context.WithTimeout(stopCtx, s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		_ = hs.Close()
		<-served
		return fmt.Errorf("api: shutting down: in-flight requests did not finish in %s: %w", s.cfg.ShutdownTimeout, err)
	}
	<-served // http.ErrServerClosed
	s.log.InfoContext(stopCtx, "http api stopped")
	return nil
}
