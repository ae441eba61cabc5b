package api

import (
	"net/http"
	"time"

	"github.com/effectline/effectline/api/mcp"
	"github.com/effectline/effectline/tool"
)

// CatalogueRegistry is what RegistryCatalogue needs of the tool registry
// (*tool.Registry).
type CatalogueRegistry interface {
	Names() []string
	Get(name string) (tool.Tool, bool)
}

// RegistryCatalogue lists the registered tools for the MCP server: every
// tool but the internal ones (tool.Spec.Internal, the workflow undos),
// which only effectline itself submits.
func RegistryCatalogue(r CatalogueRegistry) []mcp.Tool {
	var out []mcp.Tool
	for _, name := range r.Names() {
		t, ok := r.Get(name)
		if !ok || t == nil || t.Spec() == nil || t.Spec().Internal {
			continue
		}
		sp := t.Spec()
		out = append(out, mcp.Tool{Name: sp.Name, Description: sp.Description, Effect: sp.Effect, ArgsSchema: sp.ArgsSchema})
	}
	return out
}

// mcpRoutes mounts the MCP server on POST /mcp when the server has a
// catalogue. Its calls are served by this server's own POST /v1/intents.
func (s *Server) mcpRoutes() {
	if s.catalogue == nil {
		return
	}
	h, err := mcp.Handler(mcp.Config{
		Catalogue: s.catalogueFor,
		Principal: func(r *http.Request) string { p, _ := PrincipalFrom(r.Context()); return p },
		API:       s.root,
		Logger:    s.log,
	})
	if err != nil {
		panic(err) // every field is set above
	}
	s.Handle("POST /mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A call waits for its outcome, longer than the write timeout.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(mcp.MaxWait + s.cfg.WriteTimeout))
		h.ServeHTTP(w, r)
	}), Authenticated)
}

// catalogueFor is the catalogue as principal may use it. An internal tool
// is left out even from a catalogue given by hand: tools/list does not
// show it, and tools/call does not know it.
func (s *Server) catalogueFor(principal string) []mcp.Tool {
	var out []mcp.Tool
	for _, t := range s.catalogue {
		if at, ok := s.tools.Get(t.Name); ok && at.Spec() != nil && !at.Spec().Internal && at.Spec().Authorize(principal) == nil {
			out = append(out, t)
		}
	}
	return out
}
