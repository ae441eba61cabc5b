package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"
	"time"
)

// Routes of a [FakeTool]. Faults are scripted and requests counted per route.
const (
	// RouteInvoke is POST /effects or POST /effects/<anything>: apply an
	// effect (create a charge, a reservation, send an email...).
	RouteInvoke = "invoke"
	// RouteReconcile is GET /effects?idempotency_key=K (any path under
	// /effects): did the effect for K happen?
	RouteReconcile = "reconcile"
	// RouteCompensate is POST /effects/release (or any POST under /effects
	// whose last path segment is "release"): undo an effect.
	RouteCompensate = "compensate"
)

// maxBody bounds how much of a request body the fake tool reads.
const maxBody = 1 << 20

type faultKind int

const (
	faultNone faultKind = iota
	faultLoseResponse
	faultFailBefore
	faultFailAfter
	faultStall
	faultStallForever
	faultApplyThenStall
)

// Fault is one injected misbehaviour of a [FakeTool] request. For each route
// the "effect" is the state change that route makes: applying the effect for
// invoke, releasing it for compensate, nothing for reconcile.
//
// Faults are values; build them with the FaultX variables and functions.
type Fault struct {
	kind       faultKind
	status     int
	retryAfter string
	stall      time.Duration
}

var (
	// FaultNone handles the request normally. Use it in a script to let a
	// request through between faulty ones.
	FaultNone = Fault{}

	// FaultLoseResponse applies the effect, then drops the connection
	// without responding. The client sees EOF: the outcome is unknown to it,
	// which is exactly what reconciliation exists for.
	FaultLoseResponse = Fault{kind: faultLoseResponse}

	// FaultStallForever blocks, without applying the effect, until the
	// client gives up (or the tool shuts down), then drops the connection.
	// It models a hung downstream and exercises client timeouts.
	FaultStallForever = Fault{kind: faultStallForever}

	// FaultApplyThenStall applies the effect, then holds the response until
	// the client goes away. It models a downstream that committed while the
	// caller is about to die: the crash matrix's "after the downstream
	// committed, before the response" point.
	FaultApplyThenStall = Fault{kind: faultApplyThenStall}
)

// FaultFailBeforeEffect responds with status (e.g. 503, 429, 400) without
// applying the effect, setting Retry-After when retryAfter is non-empty
// ("2" or an HTTP date). It models rejections and overload that are safe to
// retry (or, for 4xx, not worth retrying).
func FaultFailBeforeEffect(status int, retryAfter string) Fault {
	return Fault{kind: faultFailBefore, status: status, retryAfter: retryAfter}
}

// FaultFailAfterEffect applies the effect and then responds with status
// (e.g. 500, 502, 504) as a gateway or a crashing handler would: the error
// says "failed" but the effect happened.
func FaultFailAfterEffect(status int) Fault {
	return Fault{kind: faultFailAfter, status: status}
}

// FaultStall waits d, or until the client goes away, before handling the
// request normally. If the client goes away first, no effect is applied and
// nothing is written.
func FaultStall(d time.Duration) Fault {
	return Fault{kind: faultStall, stall: d}
}

// String describes the fault for test output.
func (f Fault) String() string {
	switch f.kind {
	case faultNone:
		return "none"
	case faultLoseResponse:
		return "lose-response"
	case faultFailBefore:
		if f.retryAfter != "" {
			return fmt.Sprintf("fail-before-effect(%d, Retry-After: %s)", f.status, f.retryAfter)
		}
		return fmt.Sprintf("fail-before-effect(%d)", f.status)
	case faultFailAfter:
		return fmt.Sprintf("fail-after-effect(%d)", f.status)
	case faultStall:
		return fmt.Sprintf("stall(%v)", f.stall)
	case faultStallForever:
		return "stall-forever"
	case faultApplyThenStall:
		return "apply-then-stall"
	}
	return "unknown"
}

// Request is one request a [FakeTool] received, recorded before any fault
// ran, so faulted requests appear too.
type Request struct {
	// Route is RouteInvoke, RouteReconcile or RouteCompensate, or "" for
	// requests that matched no route (answered 404 or 405).
	Route  string
	Method string
	// Path is the URL path without the query.
	Path string
	// IdempotencyKey is the key the request is about: the Idempotency-Key
	// header for invoke, the idempotency_key query parameter for reconcile,
	// and the idempotency_key body field for compensate (each falling back
	// to the header).
	IdempotencyKey string
	Header         http.Header
	Body           []byte
	// Time is when the request arrived.
	Time time.Time
	// Fault is the fault that was applied to the request.
	Fault Fault
}

// Effect is one effect a [FakeTool] applied.
type Effect struct {
	// ID is the downstream id, "eff_<n>", n counting from 1.
	ID             string
	IdempotencyKey string
	// Path is the invoke path, which names the tool (/effects/charges).
	Path string
	// Args is the JSON request body, or nil if it was empty.
	Args       json.RawMessage
	AppliedAt  time.Time
	Released   bool
	ReleasedAt time.Time
}

type effectRecord struct {
	Effect
	response []byte // the invoke response, replayed for a repeated key
}

// FakeOption configures [NewFakeTool].
type FakeOption func(*FakeTool)

// WithHonorKeys sets whether the tool deduplicates invokes by Idempotency-Key
// (default true). With false it models a receiver that ignores the header:
// every invoke is a new effect, and reconcile answers with the latest live
// effect for the key.
func WithHonorKeys(honor bool) FakeOption {
	return func(ft *FakeTool) { ft.honorKeys = honor }
}

// WithDefaultFault applies f to every request on the given routes (all routes
// if none are given) whose script is empty. Scripted faults take precedence.
func WithDefaultFault(f Fault, routes ...string) FakeOption {
	return func(ft *FakeTool) {
		if len(routes) == 0 {
			routes = []string{RouteInvoke, RouteReconcile, RouteCompensate}
		}
		for _, r := range routes {
			mustRoute(r)
			ft.defaults[r] = f
		}
	}
}

// FakeTool is a fake downstream HTTP tool: a resource API (charges,
// reservations, emails: all alike) that applies effects, deduplicates them by
// Idempotency-Key, answers reconcile queries, accepts releases, and fails on
// command. It counts everything so tests can assert that effects happened
// exactly once.
//
// API (all JSON):
//
//	POST /effects[/tool]            Idempotency-Key: K, body = args
//	  200 {"id":"eff_1","idempotency_key":"K","status":"done"}
//	GET  /effects[/tool]?idempotency_key=K
//	  200 {"id":"eff_1","idempotency_key":"K","status":"done","args":...,"applied_at":...}
//	  404 {"error":"not_found"}            no live effect for K
//	POST /effects[/tool]/release    body {"idempotency_key":"K","downstream_id":"eff_1"}
//	  200 {"status":"released","id":"eff_1","idempotency_key":"K"}
//
// With keys honoured (the default) a repeated key replays the stored response
// without a new effect, even if the effect was since released: keys are
// never reused, as with real payment APIs. Releasing an effect that never
// happened succeeds (with an empty id), so compensation is idempotent.
//
// Keep-alives are disabled so that every request uses a fresh connection.
// Otherwise Go's http.Transport would transparently resend a request carrying
// an Idempotency-Key when a reused connection dies, and a dropped response
// might never surface to the code under test.
//
// All methods are safe for concurrent use.
type FakeTool struct {
	// URL is the base URL, http://127.0.0.1:<port>. Endpoints live under
	// URL + "/effects".
	URL string

	srv  *httptest.Server
	done chan struct{}

	honorKeys bool
	defaults  map[string]Fault

	mu       sync.Mutex
	scripts  map[string][]Fault
	effects  []*effectRecord
	requests []Request
	releases int
	orders   map[string][]byte // GET /orders/<id>, see SetOrder
}

// NewFakeTool starts a fake tool on 127.0.0.1 and shuts it down when the test
// finishes; requests stalled by a fault are released first so shutdown never
// hangs.
func NewFakeTool(t testing.TB, opts ...FakeOption) *FakeTool {
	t.Helper()
	ft := &FakeTool{
		done:      make(chan struct{}),
		honorKeys: true,
		defaults:  make(map[string]Fault),
		scripts:   make(map[string][]Fault),
	}
	for _, o := range opts {
		o(ft)
	}
	ft.srv = httptest.NewUnstartedServer(http.HandlerFunc(ft.serveHTTP))
	ft.srv.Config.SetKeepAlivesEnabled(false)
	ft.srv.Start()
	ft.URL = ft.srv.URL
	t.Cleanup(func() {
		close(ft.done)
		ft.srv.Close()
	})
	return ft
}

// Script queues faults for route ("invoke", "reconcile" or "compensate").
// Each request on the route consumes the next fault in order; once the queue
// is empty requests get the default fault (normally [FaultNone]). Calls
// append, so a test can extend the script while the system runs. It panics on
// an unknown route, which is a bug in the test.
func (ft *FakeTool) Script(route string, faults ...Fault) {
	mustRoute(route)
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.scripts[route] = append(ft.scripts[route], faults...)
}

// Pending returns how many scripted faults for route have not been consumed,
// so a test can check the system made all the requests it scripted for.
func (ft *FakeTool) Pending(route string) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return len(ft.scripts[route])
}

// Effects returns the number of live effects: applied and not released.
func (ft *FakeTool) Effects() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, e := range ft.effects {
		if !e.Released {
			n++
		}
	}
	return n
}

// Applied returns the number of effects ever applied, released or not.
// Applied() - Effects() is how many were released.
func (ft *FakeTool) Applied() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return len(ft.effects)
}

// EffectsForKey returns the number of live (unreleased) effects applied with
// Idempotency-Key k. Anything above 1 is a duplicated effect.
func (ft *FakeTool) EffectsForKey(k string) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, e := range ft.effects {
		if e.IdempotencyKey == k && !e.Released {
			n++
		}
	}
	return n
}

// EffectLog returns a copy of every effect ever applied, in order.
func (ft *FakeTool) EffectLog() []Effect {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	out := make([]Effect, len(ft.effects))
	for i, e := range ft.effects {
		out[i] = e.Effect
		out[i].Args = bytes.Clone(e.Args)
	}
	return out
}

// Requests returns how many requests arrived on route, including those a
// fault failed, stalled or dropped. Requests("") counts unrouted requests.
func (ft *FakeTool) Requests(route string) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, r := range ft.requests {
		if r.Route == route {
			n++
		}
	}
	return n
}

// RequestLog returns a copy of every request received, in arrival order, so
// tests can assert on retry timing and on the headers retries carried.
func (ft *FakeTool) RequestLog() []Request {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	out := make([]Request, len(ft.requests))
	for i, r := range ft.requests {
		out[i] = r
		out[i].Header = r.Header.Clone()
		out[i].Body = bytes.Clone(r.Body)
	}
	return out
}

// Releases returns how many release requests the tool processed (not failed
// before the effect or stalled away), including releases of effects that
// never happened or were already released.
func (ft *FakeTool) Releases() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.releases
}

func mustRoute(route string) {
	switch route {
	case RouteInvoke, RouteReconcile, RouteCompensate, RouteOrder:
	default:
		panic(fmt.Sprintf("testenv: unknown FakeTool route %q (want %q, %q, %q or %q)",
			route, RouteInvoke, RouteReconcile, RouteCompensate, RouteOrder))
	}
}

// classify maps a request to its route, or "" if it has none.
func classify(r *http.Request) string {
	if _, ok := orderID(r); ok {
		return RouteOrder
	}
	p := path.Clean("/" + r.URL.Path)
	if !underEffects(p) {
		return ""
	}
	switch r.Method {
	case http.MethodGet:
		return RouteReconcile
	case http.MethodPost:
		if path.Base(p) == "release" {
			return RouteCompensate
		}
		return RouteInvoke
	}
	return ""
}

// underEffects reports whether the cleaned path p is /effects or below it.
func underEffects(p string) bool {
	return p == "/effects" || strings.HasPrefix(p, "/effects/")
}

type releaseBody struct {
	IdempotencyKey string `json:"idempotency_key"`
	DownstreamID   string `json:"downstream_id"`
}

func (ft *FakeTool) serveHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	// Read the whole body up front: net/http only notices a client hanging
	// up (cancelling r.Context) once the body has been consumed, and the
	// stall faults rely on that.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unreadable_body"})
		return
	}

	route := classify(r)
	key := r.Header.Get("Idempotency-Key")
	var (
		rel    releaseBody
		relErr error
	)
	switch route {
	case RouteReconcile:
		if q := r.URL.Query().Get("idempotency_key"); q != "" {
			key = q
		}
	case RouteCompensate:
		if relErr = json.Unmarshal(body, &rel); relErr == nil && rel.IdempotencyKey != "" {
			key = rel.IdempotencyKey
		}
	}

	ft.mu.Lock()
	var fault Fault
	if route != "" {
		if q := ft.scripts[route]; len(q) > 0 {
			fault, ft.scripts[route] = q[0], q[1:]
		} else {
			fault = ft.defaults[route]
		}
	}
	ft.requests = append(ft.requests, Request{
		Route:          route,
		Method:         r.Method,
		Path:           r.URL.Path,
		IdempotencyKey: key,
		Header:         r.Header.Clone(),
		Body:           body,
		Time:           now,
		Fault:          fault,
	})
	ft.mu.Unlock()

	if route == "" {
		if underEffects(path.Clean("/" + r.URL.Path)) {
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method_not_allowed"})
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no_such_route"})
		return
	}

	// Faults that act before the effect.
	switch fault.kind {
	case faultFailBefore:
		if fault.retryAfter != "" {
			w.Header().Set("Retry-After", fault.retryAfter)
		}
		writeJSON(w, fault.status, map[string]any{"error": "injected_failure", "status": fault.status})
		return
	case faultStall:
		if !ft.wait(r.Context(), fault.stall) {
			dropConnection(w)
			return
		}
	case faultStallForever:
		ft.wait(r.Context(), -1)
		dropConnection(w)
		return
	}

	var (
		status int
		resp   []byte
	)
	switch route {
	case RouteInvoke:
		status, resp = ft.invoke(r.URL.Path, key, body, now)
	case RouteReconcile:
		status, resp = ft.reconcile(key)
	case RouteCompensate:
		status, resp = ft.release(rel, relErr, key)
	case RouteOrder:
		id, _ := orderID(r)
		status, resp = ft.order(id)
	}

	// Faults that act after the effect.
	switch fault.kind {
	case faultLoseResponse:
		dropConnection(w)
		return
	case faultApplyThenStall:
		ft.wait(r.Context(), -1)
		dropConnection(w)
		return
	case faultFailAfter:
		writeJSON(w, fault.status, map[string]any{"error": "injected_failure_after_effect", "status": fault.status})
		return
	}
	writeRaw(w, status, resp)
}

// wait blocks for d (forever if d < 0) and reports whether it ran to
// completion rather than being cut short by the client leaving or the tool
// shutting down.
func (ft *FakeTool) wait(ctx context.Context, d time.Duration) bool {
	var timeout <-chan time.Time
	if d >= 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		timeout = tm.C
	}
	select {
	case <-timeout:
		return true
	case <-ctx.Done():
		return false
	case <-ft.done:
		return false
	}
}

func (ft *FakeTool) invoke(p, key string, body []byte, now time.Time) (int, []byte) {
	var args json.RawMessage
	if len(bytes.TrimSpace(body)) > 0 {
		if !json.Valid(body) {
			return http.StatusBadRequest, mustJSON(map[string]string{"error": "invalid_json"})
		}
		args = json.RawMessage(body)
	}

	ft.mu.Lock()
	defer ft.mu.Unlock()
	if ft.honorKeys && key != "" {
		for _, e := range ft.effects {
			if e.IdempotencyKey == key {
				return http.StatusOK, e.response
			}
		}
	}
	e := &effectRecord{Effect: Effect{
		ID:             fmt.Sprintf("eff_%d", len(ft.effects)+1),
		IdempotencyKey: key,
		Path:           p,
		Args:           args,
		AppliedAt:      now,
	}}
	e.response = mustJSON(map[string]string{"id": e.ID, "idempotency_key": key, "status": "done"})
	ft.effects = append(ft.effects, e)
	return http.StatusOK, e.response
}

// latestLiveLocked returns the most recent unreleased effect for key.
func (ft *FakeTool) latestLiveLocked(key string) *effectRecord {
	for i := len(ft.effects) - 1; i >= 0; i-- {
		if e := ft.effects[i]; e.IdempotencyKey == key && !e.Released {
			return e
		}
	}
	return nil
}

func (ft *FakeTool) reconcile(key string) (int, []byte) {
	if key == "" {
		return http.StatusBadRequest, mustJSON(map[string]string{"error": "missing_idempotency_key"})
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	e := ft.latestLiveLocked(key)
	if e == nil {
		return http.StatusNotFound, mustJSON(map[string]string{"error": "not_found"})
	}
	return http.StatusOK, mustJSON(struct {
		ID             string          `json:"id"`
		IdempotencyKey string          `json:"idempotency_key"`
		Status         string          `json:"status"`
		Args           json.RawMessage `json:"args,omitempty"`
		AppliedAt      time.Time       `json:"applied_at"`
	}{e.ID, e.IdempotencyKey, "done", e.Args, e.AppliedAt})
}

// release marks the effect named by downstream_id (or else the latest live
// effect for the key) released. Unknown or already released effects are a
// successful no-op so that compensation can be retried blindly.
func (ft *FakeTool) release(rel releaseBody, parseErr error, key string) (int, []byte) {
	if parseErr != nil {
		return http.StatusBadRequest, mustJSON(map[string]string{"error": "invalid_json"})
	}
	if rel.DownstreamID == "" && key == "" {
		return http.StatusBadRequest, mustJSON(map[string]string{"error": "missing_idempotency_key"})
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var target *effectRecord
	if rel.DownstreamID != "" {
		for _, e := range ft.effects {
			if e.ID == rel.DownstreamID {
				target = e
				break
			}
		}
	}
	if target == nil && key != "" {
		target = ft.latestLiveLocked(key)
	}
	id := ""
	if target != nil {
		id = target.ID
		if !target.Released {
			target.Released = true
			target.ReleasedAt = time.Now()
		}
	}
	ft.releases++
	return http.StatusOK, mustJSON(map[string]string{"status": "released", "id": id, "idempotency_key": key})
}

// dropConnection closes the connection without writing a response, so the
// client cannot tell whether the request took effect.
func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		// Not reachable with httptest's HTTP/1.1 server; abort the
		// response the only other way net/http offers.
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeRaw(w, status, mustJSON(v))
}
