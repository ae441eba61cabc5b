// Package ui is effectline's approval UI: server-rendered pages under /ui/,
// no JavaScript and no front-end build. The queue lists the operations
// waiting for a decision; an operation's page shows its evidence (the
// request with secrets redacted, what the downstream showed, the proposed
// action) and its history; a decision is a plain form post to the same
// decision path as the JSON API, answered with a redirect (303) back to the
// operation and a one-time message. Workflow runs escalated to an approver
// are listed on the queue too; a run's page shows its steps, their
// operations, what it waits on and why, and the run's own decision form.
//
// For an operation of unknown outcome the page also asks the downstream
// (the tool's reconcile, a few seconds at most, nothing journaled) and shows
// the answer with its time; for an irreversible one it proposes checking
// the downstream rather than a retry, which then needs a note and a ticked
// confirmation (guards.go).
//
// The HTTP API (package api) mounts the UI's Routes, public to its
// bearer-token guard: the UI authenticates with its own cookie session
// (session.go) and refuses, or sends to the sign-in page, whoever has none.
// The UI imports nothing of the API: what it needs of the server it is
// mounted in (token lookup, the decision path, the redaction) it takes as
// the Server interface, so pages and JSON answers cannot drift apart.
package ui

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// Server is what the UI needs of the HTTP API it is mounted in, so a page
// authenticates, decides and redacts exactly as the JSON API does.
type Server interface {
	// TokenPrincipal returns the principal an API token authenticates and
	// whether it is an approver. It never falls back to open mode's
	// principal: a wrong token is wrong even on an open server.
	TokenPrincipal(token string) (principal string, approver bool, ok bool)
	// SetSpanPrincipal records who is signed in on the request's span.
	SetSpanPrincipal(ctx context.Context, principal string)
	// CheckOperationKey says why key cannot be an operation key; "" when
	// it can.
	CheckOperationKey(key string) string
	// Decide records an approver's decision as POST
	// /v1/operations/{key}/decisions does (logging included).
	Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error)
	// Refusal is how the JSON API answers a failed Decide: its status code
	// and the detail shown to the approver.
	Refusal(err error, op events.Operation) (status int, detail string)
	// ListScope is the principal a signed-in principal's lists are narrowed
	// to, "" when it reads every operation; ok false: it may list nothing.
	ListScope(principal string, approver bool) (scope string, ok bool)
	// MayRead reports whether the principal may read op (the JSON API's
	// rule: its own, or all for approvers and readers).
	MayRead(principal string, approver bool, op events.Operation) bool
	// RedactOperation returns op as it may be shown (t nil: the tool is
	// gone and the args are withheld whole), as the JSON API shows it.
	RedactOperation(op events.Operation, t tool.Tool) events.Operation
	// RenderEvent returns an event of the operation whose args are args as
	// it may be shown, redacted like the JSON API's history.
	RenderEvent(e events.Envelope, t tool.Tool, args json.RawMessage) (json.RawMessage, error)
}

// Operations pages the read model; *projector.Reader is one.
type Operations interface {
	List(ctx context.Context, f events.ListFilter) (events.ListPage, error)
}

// Store reads the write side; *store.Store is one.
type Store interface {
	Load(ctx context.Context, key string) (events.Operation, error)
	Events(ctx context.Context, key string, afterSeq int64) ([]store.StoredEvent, error)
}

// Workflows reads workflow runs from their heads and records their
// decisions; *workflow.Service is one.
type Workflows interface {
	Get(ctx context.Context, id string) (events.Workflow, error)
	Decide(ctx context.Context, id string, action events.WorkflowAction, note, approver string) (events.Workflow, error)
}

// WorkflowRuns pages the workflow read model; *projector.Reader is one.
type WorkflowRuns interface {
	ListWorkflows(ctx context.Context, f events.WorkflowFilter) (events.WorkflowPage, error)
}

// Tools looks registered tools up; *tool.Registry is one.
type Tools interface {
	Get(name string) (tool.Tool, bool)
}

// Config configures the UI.
type Config struct {
	// Open: the server runs without tokens and everyone is DevPrincipal.
	Open bool
	// DevPrincipal is who everyone is in open mode.
	DevPrincipal string
	Logger       *slog.Logger
}

// Deps are what the UI reads and decides through; all are required but
// Workflows (nil: a process without workflows has no workflow pages) and
// WorkflowRuns (nil: the queue lists no workflows).
type Deps struct {
	Server       Server
	Operations   Operations
	Store        Store
	Tools        Tools
	Workflows    Workflows
	WorkflowRuns WorkflowRuns
}

// UI serves the approval pages. Mount its Routes in a server.
type UI struct {
	cfg        Config
	log        *slog.Logger
	server     Server
	operations Operations
	store      Store
	tools      Tools
	workflows  Workflows
	runs       WorkflowRuns
}

// New returns the UI. It does no I/O.
func New(cfg Config, deps Deps) *UI {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &UI{cfg: cfg, log: log, server: deps.Server, operations: deps.Operations,
		store: deps.Store, tools: deps.Tools, workflows: deps.Workflows, runs: deps.WorkflowRuns}
}
