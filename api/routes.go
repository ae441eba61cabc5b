package api

import (
	"context"
	"log/slog"
	"net/http"
)

// registerRoutes registers the built-in routes. Files that add routes
// (decisions, webhooks, the UI) add one line here calling their own
// registration method, which uses s.Handle; and they describe the routes in
// api/openapi.json (TestOpenAPIDocumentsEveryRoute checks).
func (s *Server) registerRoutes() {
	s.HandleFunc("POST /v1/intents", s.postIntent, Authenticated)
	s.HandleFunc("GET /v1/operations", s.listOperations, Authenticated)
	s.HandleFunc("GET /v1/operations/{key}", s.getOperation, Authenticated)
	s.HandleFunc("GET /v1/operations/{key}/events", s.streamEvents, Authenticated)
	s.decisionRoutes()
	s.webhookRoutes()
	s.workflowRoutes()
	s.uiRoutes()
	s.mcpRoutes()

	s.HandleFunc("GET /healthz", s.healthz, Public)
	s.HandleFunc("GET /readyz", s.readyz, Public)
	// Metrics are public like health: scrapers rarely carry tokens, and the
	// series hold counts by route, tool and status, never keys or args.
	s.HandleFunc("GET /metrics", s.serveMetrics, Public)
	s.HandleFunc("GET /v1/openapi.json", s.openAPI, Public)
}

type statusBody struct {
	Status string `json:"status"`
}

// healthz answers 200 while the process serves: liveness, with no
// dependency checked, so a database outage does not get the pod restarted.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statusBody{Status: "ok"})
}

// readyz answers 200 while the process should get traffic: not shutting
// down, and its dependencies answer.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.unready.Load() {
		writeUnavailable(w, "shutting down")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		// The cause goes to the log, not to an unauthenticated caller: it
		// names hosts and ports.
		s.log.WarnContext(ctx, "not ready", slog.Any("error", err))
		writeUnavailable(w, "a dependency is not available")
		return
	}
	writeJSON(w, http.StatusOK, statusBody{Status: "ready"})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metrics == nil {
		writeError(w, http.StatusNotFound, codeNotFound, "this process exports no Prometheus metrics")
		return
	}
	s.metrics.ServeHTTP(w, r)
}

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(OpenAPI)
}
