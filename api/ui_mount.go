package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"

	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// uiRoutes mounts the approval UI (package api/ui) under /ui/. Its routes
// are Public to the bearer-token guard: the UI authenticates with its own
// cookie session, signed in with an API token.
func (s *Server) uiRoutes() {
	deps := ui.Deps{Server: uiServer{s}, Operations: s.operations, Store: s.store, Tools: s.tools}
	if s.workflows != nil {
		deps.Workflows = s.workflows
	}
	if s.workflowRuns != nil {
		deps.WorkflowRuns = s.workflowRuns
	}
	u := ui.New(ui.Config{Open: s.cfg.Open, DevPrincipal: DevPrincipal, Logger: s.log}, deps)
	for _, r := range u.Routes() {
		s.Handle(r.Pattern, r.Handler, Public)
	}
}

// uiServer is what the UI takes of this server: its token lookup, its
// decision path and its redaction, so a page says what the JSON API says.
type uiServer struct{ s *Server }

func (u uiServer) TokenPrincipal(token string) (string, bool, bool) {
	p, ok := u.s.auth.tokenPrincipal(token)
	return p.name, p.approver, ok
}

func (u uiServer) SetSpanPrincipal(ctx context.Context, name string) { setSpanPrincipal(ctx, name) }

func (u uiServer) CheckOperationKey(key string) string { return checkOperationKey(key) }

func (u uiServer) Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error) {
	return u.s.decide(ctx, key, action, note, approver, Seen{})
}

func (u uiServer) Refusal(err error, op events.Operation) (int, string) {
	d := describeDecisionError(err, op)
	return d.status, d.detail
}

func (u uiServer) ListScope(name string, approver bool) (string, bool) {
	return u.s.listScope(reader{name: name, approver: approver})
}

func (u uiServer) MayRead(name string, approver bool, op events.Operation) bool {
	return u.s.mayRead(reader{name: name, approver: approver}, op)
}

func (u uiServer) RedactOperation(op events.Operation, t tool.Tool) events.Operation {
	return redactOperation(op, t)
}

func (u uiServer) RenderEvent(e events.Envelope, t tool.Tool, args json.RawMessage) (json.RawMessage, error) {
	return renderEvent(e, t, args)
}

// tokenPrincipal returns the principal a token authenticates, comparing in
// constant time like authenticate does for the Authorization header. Unlike
// authenticate, it never falls back to open mode's DevPrincipal: a wrong
// token is wrong even on an open server.
func (a *authenticator) tokenPrincipal(token string) (principal, bool) {
	digest := sha256.Sum256([]byte(token))
	var found string
	for _, e := range a.tokens {
		if subtle.ConstantTimeCompare(digest[:], e.digest[:]) == 1 {
			found = e.principal
		}
	}
	if found == "" {
		return principal{}, false
	}
	return principal{name: found, approver: a.approvers[found]}, true
}
