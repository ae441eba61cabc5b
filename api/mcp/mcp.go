// Package mcp serves effectline as a Model Context Protocol server
// (streamable HTTP transport), for agent runtimes that reach their tools
// over MCP. tools/list is the registry as the caller's principal may use
// it; tools/call submits an intent through the HTTP API itself, in
// process, so a call over MCP is checked, journaled, deduplicated, waited
// for and redacted exactly as POST /v1/intents is.
//
// The operation key comes from the runtime, never from the model and never
// from the JSON-RPC or tool-call id: a call must carry
// _meta["effectline/operation_key"], or _meta["effectline/workflow_id"] and
// _meta["effectline/step"] (key "wf:<workflow_id>/<step>"). A call without
// one is refused and nothing executes.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effectline/effectline/events"
)

// Meta keys a runtime sets on tools/call.
const (
	MetaOperationKey = "effectline/operation_key"
	MetaWorkflowID   = "effectline/workflow_id"
	MetaStep         = "effectline/step"
	MetaWaitSeconds  = "effectline/wait_seconds"
)

// DefaultWait is how long a call waits for its outcome unless the runtime
// says otherwise (MetaWaitSeconds); MaxWait caps it.
const (
	DefaultWait = 10 * time.Second
	MaxWait     = 60 * time.Second
)

// Tool is one registered tool as a model sees it.
type Tool struct {
	Name        string
	Description string
	Effect      events.EffectClass
	// ArgsSchema is the tool's args JSON Schema; empty accepts any object.
	ArgsSchema json.RawMessage
}

// Config configures the server.
type Config struct {
	// Catalogue returns the tools principal may use. Required.
	Catalogue func(principal string) []Tool
	// Principal returns the authenticated principal of an HTTP request to
	// the MCP endpoint. Required.
	Principal func(r *http.Request) string
	// API is the HTTP API's handler: calls are POST /v1/intents served by
	// it in process, with the MCP request's own Authorization header, so
	// the principal is authenticated and authorized again there. Required.
	API    http.Handler
	Logger *slog.Logger
}

// Handler returns the MCP endpoint's handler.
func Handler(cfg Config) (http.Handler, error) {
	if cfg.Catalogue == nil || cfg.Principal == nil || cfg.API == nil {
		return nil, fmt.Errorf("mcp: Config.Catalogue, Principal and API are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &server{cfg: cfg}
	// Stateless: every request names its principal by its own token, and
	// a new server per principal lists only that principal's tools; no
	// session outlives the request that made it.
	return sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		return s.forPrincipal(cfg.Principal(r))
	}, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true, Logger: cfg.Logger}), nil
}

type server struct {
	cfg     Config
	mu      sync.Mutex
	servers map[string]*sdk.Server
}

// forPrincipal returns the MCP server of one principal, built once: the
// registry does not change while the process runs.
func (s *server) forPrincipal(principal string) *sdk.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if srv, ok := s.servers[principal]; ok {
		return srv
	}
	srv := sdk.NewServer(&sdk.Implementation{Name: "effectline", Version: "1"}, &sdk.ServerOptions{Logger: s.cfg.Logger})
	for _, t := range s.cfg.Catalogue(principal) {
		srv.AddTool(describe(t), s.call(t))
	}
	if s.servers == nil {
		s.servers = map[string]*sdk.Server{}
	}
	s.servers[principal] = srv
	return srv
}

// describe is a tool's MCP definition: its args schema as the input
// schema, and hints from its effect class.
func describe(t Tool) *sdk.Tool {
	destructive := t.Effect != events.Idempotent
	desc := t.Description
	if desc == "" {
		desc = t.Name
	}
	desc += " (effect: " + string(t.Effect) + "; runs at most once per operation key)"
	return &sdk.Tool{
		Name:        t.Name,
		Description: desc,
		InputSchema: objectSchema(t.ArgsSchema),
		Annotations: &sdk.ToolAnnotations{
			IdempotentHint:  t.Effect == events.Idempotent,
			DestructiveHint: &destructive,
			ReadOnlyHint:    false,
		},
	}
}

// objectSchema returns the args schema as an MCP input schema, which must
// say type "object": args always are one (the API refuses anything else).
func objectSchema(schema json.RawMessage) map[string]any {
	m := map[string]any{}
	if len(bytes.TrimSpace(schema)) > 0 {
		_ = json.Unmarshal(schema, &m)
	}
	m["type"] = "object"
	return m
}

// structured is a call's structuredContent: the record's outcome and the
// operation key it belongs to.
type structured struct {
	OperationKey string           `json:"operation_key"`
	State        events.State     `json:"state"`
	Retryable    bool             `json:"retryable"`
	Reason       string           `json:"reason"`
	Next         events.AgentStep `json:"next"`
	Result       json.RawMessage  `json:"result"`
}

// call returns the tools/call handler of t.
func (s *server) call(t Tool) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var meta map[string]any
		var header http.Header
		var args json.RawMessage
		if req.Params != nil {
			meta, args = req.Params.Meta, req.Params.Arguments
		}
		if req.Extra != nil {
			header = req.Extra.Header
		}
		key, ok := operationKey(meta)
		if !ok {
			return refusal("refused: no operation key. The runtime must set _meta[\"" + MetaOperationKey +
				"\"] (or \"" + MetaWorkflowID + "\" and \"" + MetaStep + "\") on tools/call; nothing was executed"), nil
		}
		if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
			args = json.RawMessage("{}")
		}
		return s.submit(ctx, t, key, args, waitFrom(meta), header), nil
	}
}

// operationKey reads the runtime's key from _meta.
func operationKey(meta map[string]any) (string, bool) {
	if k, ok := meta[MetaOperationKey].(string); ok && k != "" {
		return k, true
	}
	wf, _ := meta[MetaWorkflowID].(string)
	var step string
	switch v := meta[MetaStep].(type) {
	case string:
		step = v
	case float64:
		if v == math.Trunc(v) {
			step = strconv.FormatInt(int64(v), 10)
		}
	}
	if wf != "" && step != "" {
		return "wf:" + wf + "/" + step, true
	}
	return "", false
}

func waitFrom(meta map[string]any) time.Duration {
	d := DefaultWait
	switch v := meta[MetaWaitSeconds].(type) {
	case float64:
		d = time.Duration(v * float64(time.Second))
	case string:
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			d = time.Duration(n * float64(time.Second))
		}
	}
	return min(max(d, 0), MaxWait)
}

// submit posts the intent to the API in process and turns its answer into
// a tool result.
func (s *server) submit(ctx context.Context, t Tool, key string, args json.RawMessage, wait time.Duration, header http.Header) *sdk.CallToolResult {
	body, err := json.Marshal(map[string]any{"operation_key": key, "tool": t.Name, "args": args})
	if err != nil {
		return refusal("refused: the arguments are not a JSON object; nothing was executed")
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "/v1/intents", bytes.NewReader(body))
	if err != nil {
		return refusal("refused: " + err.Error())
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Prefer", "wait="+strconv.Itoa(int(wait/time.Second)))
	for _, h := range []string{"Authorization", "Traceparent", "Tracestate"} {
		if v := header.Get(h); v != "" {
			r.Header.Set(h, v)
		}
	}
	w := &recorder{header: http.Header{}}
	s.cfg.API.ServeHTTP(w, r)
	switch w.status {
	case http.StatusOK, http.StatusAccepted:
	default:
		return apiRefusal(w, t, key)
	}
	var rec struct {
		OperationKey string                  `json:"operation_key"`
		Outcome      events.OperationOutcome `json:"outcome"`
	}
	if err := json.Unmarshal(w.body.Bytes(), &rec); err != nil || rec.Outcome.State == "" {
		return refusal("effectline answered without an outcome; call again with the same operation key to read it")
	}
	o := rec.Outcome
	out := structured{OperationKey: key, State: o.State, Retryable: o.Retryable, Reason: o.Reason, Next: o.Next, Result: o.Result}
	return &sdk.CallToolResult{
		Content:           []sdk.Content{&sdk.TextContent{Text: Line(t.Name, o)}},
		StructuredContent: out,
		IsError:           o.State != events.StateSucceeded && o.State != events.StatePending,
	}
}

// Line is the one line a model reads about an outcome: what is known,
// and what it may and may not do next.
func Line(toolName string, o events.OperationOutcome) string {
	switch o.State {
	case events.StateSucceeded:
		res := string(o.Result)
		if len(res) > 300 {
			res = res[:300] + "…"
		}
		return fmt.Sprintf("succeeded: %s took effect once; result: %s", toolName, res)
	case events.StateFailed:
		advice := "do not retry it as it is"
		switch {
		case o.Next == events.StepFixArgs:
			advice = "correct the arguments and call again as a new step"
		case o.Next == events.StepAskHuman:
			advice = "do not retry; ask a human"
		case o.Retryable:
			advice = "it may go through later as a new step"
		}
		return fmt.Sprintf("failed: %s had no effect (%s); %s", toolName, o.Reason, advice)
	case events.StateUnknown:
		return fmt.Sprintf("unknown: the %s may have happened; do not retry; a human was asked (%s)", toolName, o.Reason)
	}
	return fmt.Sprintf("pending: %s has not finished; call again with the same operation key to get its outcome (it will not run twice)", toolName)
}

// apiRefusal turns an error answer of the API into an error result.
func apiRefusal(w *recorder, t Tool, key string) *sdk.CallToolResult {
	var e struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
		Field  string `json:"field"`
	}
	_ = json.Unmarshal(w.body.Bytes(), &e)
	var text string
	switch {
	case w.status == http.StatusConflict:
		text = fmt.Sprintf("refused: operation key %q was already used with other arguments; nothing was executed", key)
	case w.status == http.StatusBadRequest || w.status == http.StatusRequestEntityTooLarge:
		text = strings.TrimSpace(fmt.Sprintf("refused: invalid arguments for %s %s: %s; nothing was executed; correct them", t.Name, e.Field, e.Detail))
	case w.status == http.StatusForbidden || w.status == http.StatusNotFound || w.status == http.StatusUnauthorized:
		text = fmt.Sprintf("refused: %s is not available to this caller (%s); nothing was executed", t.Name, e.Error)
	default:
		text = fmt.Sprintf("effectline could not take the call now (%d %s); calling again with the same operation key is safe", w.status, e.Error)
	}
	return refusal(text)
}

func refusal(text string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, IsError: true}
}

// recorder is the in-process response of the API to one call.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
