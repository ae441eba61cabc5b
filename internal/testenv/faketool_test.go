package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// response is what a test client saw: either an HTTP response or a transport
// error (err != nil means the outcome was unknown to the client).
type response struct {
	status int
	header http.Header
	body   map[string]any
	err    error
}

func do(t *testing.T, ctx context.Context, method, url, key, body string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{err: err}
	}
	out := response{status: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			t.Fatalf("response %q is not JSON: %v", raw, err)
		}
	}
	return out
}

func invoke(t *testing.T, ft *FakeTool, key, args string) response {
	t.Helper()
	return do(t, t.Context(), http.MethodPost, ft.URL+"/effects/charges", key, args)
}

func reconcile(t *testing.T, ft *FakeTool, key string) response {
	t.Helper()
	return do(t, t.Context(), http.MethodGet, ft.URL+"/effects/charges?idempotency_key="+key, "", "")
}

func release(t *testing.T, ft *FakeTool, key, id string) response {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"idempotency_key": key, "downstream_id": id})
	return do(t, t.Context(), http.MethodPost, ft.URL+"/effects/release", "", string(b))
}

func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("request failed: %v (want HTTP %d)", r.err, status)
	}
	if r.status != status {
		t.Fatalf("status = %d, body %v; want %d", r.status, r.body, status)
	}
}

func wantCounts(t *testing.T, ft *FakeTool, effects, applied int) {
	t.Helper()
	if got := ft.Effects(); got != effects {
		t.Errorf("Effects() = %d, want %d", got, effects)
	}
	if got := ft.Applied(); got != applied {
		t.Errorf("Applied() = %d, want %d", got, applied)
	}
}

func TestFakeToolHonorsKeys(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)

	first := invoke(t, ft, "k1", `{"amount":100}`)
	wantStatus(t, first, http.StatusOK)
	if first.body["id"] != "eff_1" || first.body["idempotency_key"] != "k1" || first.body["status"] != "done" {
		t.Fatalf("first response = %v", first.body)
	}
	again := invoke(t, ft, "k1", `{"amount":100}`)
	wantStatus(t, again, http.StatusOK)
	if again.body["id"] != "eff_1" {
		t.Fatalf("repeated key got %v, want the stored eff_1 response", again.body)
	}
	other := invoke(t, ft, "k2", `{"amount":5}`)
	wantStatus(t, other, http.StatusOK)
	if other.body["id"] != "eff_2" {
		t.Fatalf("new key got %v, want eff_2", other.body)
	}

	wantCounts(t, ft, 2, 2)
	if got := ft.EffectsForKey("k1"); got != 1 {
		t.Errorf("EffectsForKey(k1) = %d, want 1", got)
	}
	if got := ft.Requests(RouteInvoke); got != 3 {
		t.Errorf("Requests(invoke) = %d, want 3", got)
	}
	log := ft.EffectLog()
	if len(log) != 2 || string(log[0].Args) != `{"amount":100}` || log[0].Path != "/effects/charges" {
		t.Errorf("EffectLog() = %+v", log)
	}
}

func TestFakeToolConcurrentSameKeyAppliesOnce(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)

	var wg sync.WaitGroup
	ids := make(chan string, 20)
	for range 20 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ft.URL+"/effects", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "same")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var body map[string]string
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Error(err)
				return
			}
			ids <- body["id"]
		})
	}
	wg.Wait()
	close(ids)
	for id := range ids {
		if id != "eff_1" {
			t.Errorf("got id %q, want every caller to see eff_1", id)
		}
	}
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolIgnoringKeys(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t, WithHonorKeys(false))

	wantStatus(t, invoke(t, ft, "k", `{"n":1}`), http.StatusOK)
	second := invoke(t, ft, "k", `{"n":2}`)
	wantStatus(t, second, http.StatusOK)
	if second.body["id"] != "eff_2" {
		t.Fatalf("second invoke got %v, want a new effect eff_2", second.body)
	}
	wantCounts(t, ft, 2, 2)
	if got := ft.EffectsForKey("k"); got != 2 {
		t.Errorf("EffectsForKey(k) = %d, want 2", got)
	}

	rec := reconcile(t, ft, "k")
	wantStatus(t, rec, http.StatusOK)
	if rec.body["id"] != "eff_2" {
		t.Errorf("reconcile returned %v, want the latest effect eff_2", rec.body)
	}
}

func TestFakeToolReconcile(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)

	miss := reconcile(t, ft, "k")
	wantStatus(t, miss, http.StatusNotFound)
	if miss.body["error"] != "not_found" {
		t.Errorf("404 body = %v", miss.body)
	}

	wantStatus(t, invoke(t, ft, "k", `{"sku":"x"}`), http.StatusOK)
	hit := reconcile(t, ft, "k")
	wantStatus(t, hit, http.StatusOK)
	if hit.body["id"] != "eff_1" || hit.body["idempotency_key"] != "k" {
		t.Errorf("reconcile body = %v", hit.body)
	}
	if args, _ := hit.body["args"].(map[string]any); args["sku"] != "x" {
		t.Errorf("reconcile args = %v", hit.body["args"])
	}

	wantStatus(t, do(t, t.Context(), http.MethodGet, ft.URL+"/effects", "", ""), http.StatusBadRequest)
	if got := ft.Requests(RouteReconcile); got != 3 {
		t.Errorf("Requests(reconcile) = %d, want 3", got)
	}
}

func TestFakeToolRelease(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)

	// Releasing what never happened succeeds: compensation must be safe
	// to run blind.
	never := release(t, ft, "ghost", "")
	wantStatus(t, never, http.StatusOK)
	if never.body["id"] != "" {
		t.Errorf("release of unknown key body = %v, want empty id", never.body)
	}

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	rel := release(t, ft, "k", "eff_1")
	wantStatus(t, rel, http.StatusOK)
	if rel.body["id"] != "eff_1" {
		t.Errorf("release body = %v", rel.body)
	}
	wantCounts(t, ft, 0, 1)
	wantStatus(t, reconcile(t, ft, "k"), http.StatusNotFound)

	// Releasing again is a no-op that still succeeds.
	wantStatus(t, release(t, ft, "k", ""), http.StatusOK)
	if got := ft.Releases(); got != 3 {
		t.Errorf("Releases() = %d, want 3", got)
	}
	// The key stays used: a replay returns the original response and
	// does not re-apply.
	replay := invoke(t, ft, "k", `{}`)
	wantStatus(t, replay, http.StatusOK)
	if replay.body["id"] != "eff_1" {
		t.Errorf("replay after release = %v, want eff_1", replay.body)
	}
	wantCounts(t, ft, 0, 1)
	if e := ft.EffectLog()[0]; !e.Released || e.ReleasedAt.IsZero() {
		t.Errorf("EffectLog()[0] = %+v, want released", e)
	}
}

func TestFakeToolFaultLoseResponse(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteInvoke, FaultLoseResponse, FaultNone)

	lost := invoke(t, ft, "k", `{}`)
	if lost.err == nil {
		t.Fatalf("got HTTP %d, want a transport error", lost.status)
	}
	// The effect happened even though the client could not tell.
	wantCounts(t, ft, 1, 1)
	wantStatus(t, reconcile(t, ft, "k"), http.StatusOK)

	retry := invoke(t, ft, "k", `{}`)
	wantStatus(t, retry, http.StatusOK)
	if retry.body["id"] != "eff_1" {
		t.Errorf("retry got %v, want eff_1", retry.body)
	}
	wantCounts(t, ft, 1, 1)
	if got := ft.Requests(RouteInvoke); got != 2 {
		t.Errorf("Requests(invoke) = %d, want 2 (no transparent transport retry)", got)
	}
	if got := ft.Pending(RouteInvoke); got != 0 {
		t.Errorf("Pending(invoke) = %d, want 0", got)
	}
}

func TestFakeToolFaultLoseResponseOnRelease(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteCompensate, FaultLoseResponse)

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	if r := release(t, ft, "k", "eff_1"); r.err == nil {
		t.Fatalf("got HTTP %d, want a transport error", r.status)
	}
	wantCounts(t, ft, 0, 1)
	if got := ft.Releases(); got != 1 {
		t.Errorf("Releases() = %d, want 1", got)
	}
}

func TestFakeToolFaultFailBeforeEffect(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteInvoke,
		FaultFailBeforeEffect(http.StatusServiceUnavailable, "2"),
		FaultFailBeforeEffect(http.StatusTooManyRequests, ""),
		FaultFailBeforeEffect(http.StatusBadRequest, ""),
	)

	r := invoke(t, ft, "k", `{}`)
	wantStatus(t, r, http.StatusServiceUnavailable)
	if got := r.header.Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2", got)
	}
	r = invoke(t, ft, "k", `{}`)
	wantStatus(t, r, http.StatusTooManyRequests)
	if got, ok := r.header["Retry-After"]; ok {
		t.Errorf("Retry-After = %q, want none", got)
	}
	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusBadRequest)
	wantCounts(t, ft, 0, 0)

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolFaultFailBeforeEffectOnRelease(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteCompensate, FaultFailBeforeEffect(http.StatusServiceUnavailable, ""))

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	wantStatus(t, release(t, ft, "k", "eff_1"), http.StatusServiceUnavailable)
	wantCounts(t, ft, 1, 1)
	if got := ft.Releases(); got != 0 {
		t.Errorf("Releases() = %d, want 0", got)
	}
}

func TestFakeToolFaultFailAfterEffect(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteInvoke, FaultFailAfterEffect(http.StatusBadGateway))

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusBadGateway)
	wantCounts(t, ft, 1, 1)

	retry := invoke(t, ft, "k", `{}`)
	wantStatus(t, retry, http.StatusOK)
	if retry.body["id"] != "eff_1" {
		t.Errorf("retry got %v, want eff_1", retry.body)
	}
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolFaultFailAfterEffectIgnoringKeys(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t, WithHonorKeys(false))
	ft.Script(RouteInvoke, FaultFailAfterEffect(http.StatusGatewayTimeout))

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusGatewayTimeout)
	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	// A blind retry against a receiver that ignores keys duplicates.
	if got := ft.EffectsForKey("k"); got != 2 {
		t.Errorf("EffectsForKey(k) = %d, want 2", got)
	}
}

func TestFakeToolFaultStall(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	const stall = 150 * time.Millisecond
	ft.Script(RouteInvoke, FaultStall(stall))

	start := time.Now()
	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	if elapsed := time.Since(start); elapsed < stall {
		t.Errorf("stalled request took %v, want >= %v", elapsed, stall)
	}
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolFaultStallClientGivesUp(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteInvoke, FaultStall(time.Hour), FaultStallForever)

	for i := range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		r := do(t, ctx, http.MethodPost, ft.URL+"/effects", "k", `{}`)
		cancel()
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("request %d: err = %v, status %d; want a client timeout", i, r.err, r.status)
		}
	}
	wantCounts(t, ft, 0, 0)
	// Cleanup must not hang on the abandoned handlers.
}

func TestFakeToolFaultStallForeverShutdown(t *testing.T) {
	t.Parallel()
	// A client that never gives up must not hang the tool's cleanup.
	errc := make(chan error, 1)
	t.Run("tool", func(t *testing.T) {
		ft := NewFakeTool(t, WithDefaultFault(FaultStallForever))
		started := make(chan struct{})
		go func() {
			req, _ := http.NewRequest(http.MethodPost, ft.URL+"/effects", strings.NewReader(`{}`))
			close(started)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		<-started
		// Wait until the handler holds the request, without sleeping.
		for ft.Requests(RouteInvoke) == 0 {
			runtime.Gosched()
		}
	})
	select {
	case err := <-errc:
		if err == nil {
			t.Error("stalled request got a response, want a dropped connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stalled client still blocked after the tool shut down")
	}
}

func TestFakeToolDefaultFault(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t, WithDefaultFault(FaultFailBeforeEffect(http.StatusServiceUnavailable, "1"), RouteInvoke))
	ft.Script(RouteInvoke, FaultNone)

	wantStatus(t, invoke(t, ft, "a", `{}`), http.StatusOK) // script wins
	wantStatus(t, invoke(t, ft, "b", `{}`), http.StatusServiceUnavailable)
	wantStatus(t, invoke(t, ft, "c", `{}`), http.StatusServiceUnavailable)
	wantStatus(t, reconcile(t, ft, "a"), http.StatusOK) // other routes untouched
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolFaultOnReconcile(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteReconcile, FaultLoseResponse, FaultFailAfterEffect(http.StatusInternalServerError))

	wantStatus(t, invoke(t, ft, "k", `{}`), http.StatusOK)
	if r := reconcile(t, ft, "k"); r.err == nil {
		t.Fatalf("got HTTP %d, want a transport error", r.status)
	}
	wantStatus(t, reconcile(t, ft, "k"), http.StatusInternalServerError)
	wantStatus(t, reconcile(t, ft, "k"), http.StatusOK)
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolRequestLog(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	ft.Script(RouteInvoke, FaultFailBeforeEffect(http.StatusServiceUnavailable, "1"))

	wantStatus(t, invoke(t, ft, "attempt-1", `{"a":1}`), http.StatusServiceUnavailable)
	wantStatus(t, invoke(t, ft, "attempt-2", `{"a":1}`), http.StatusOK)
	wantStatus(t, reconcile(t, ft, "attempt-2"), http.StatusOK)
	wantStatus(t, release(t, ft, "attempt-2", "eff_1"), http.StatusOK)
	wantStatus(t, do(t, t.Context(), http.MethodPost, ft.URL+"/elsewhere", "", ""), http.StatusNotFound)
	wantStatus(t, do(t, t.Context(), http.MethodDelete, ft.URL+"/effects", "", ""), http.StatusMethodNotAllowed)

	log := ft.RequestLog()
	if len(log) != 6 {
		t.Fatalf("RequestLog() has %d entries, want 6", len(log))
	}
	want := []struct{ route, method, path, key string }{
		{RouteInvoke, http.MethodPost, "/effects/charges", "attempt-1"},
		{RouteInvoke, http.MethodPost, "/effects/charges", "attempt-2"},
		{RouteReconcile, http.MethodGet, "/effects/charges", "attempt-2"},
		{RouteCompensate, http.MethodPost, "/effects/release", "attempt-2"},
		{"", http.MethodPost, "/elsewhere", ""},
		{"", http.MethodDelete, "/effects", ""},
	}
	for i, w := range want {
		got := log[i]
		if got.Route != w.route || got.Method != w.method || got.Path != w.path || got.IdempotencyKey != w.key {
			t.Errorf("log[%d] = {%q %q %q %q}, want %v", i, got.Route, got.Method, got.Path, got.IdempotencyKey, w)
		}
		if i > 0 && got.Time.Before(log[i-1].Time) {
			t.Errorf("log[%d].Time %v before log[%d].Time %v", i, got.Time, i-1, log[i-1].Time)
		}
	}
	if log[0].Fault.String() != "fail-before-effect(503, Retry-After: 1)" || log[1].Fault != FaultNone {
		t.Errorf("faults = %v, %v", log[0].Fault, log[1].Fault)
	}
	if string(log[0].Body) != `{"a":1}` || log[0].Header.Get("Content-Type") != "application/json" {
		t.Errorf("log[0] body %q header %v", log[0].Body, log[0].Header)
	}
	// The log is a copy.
	log[0].Header.Set("Idempotency-Key", "mutated")
	if ft.RequestLog()[0].Header.Get("Idempotency-Key") != "attempt-1" {
		t.Error("RequestLog() returned shared headers")
	}
	if got := ft.Requests(""); got != 2 {
		t.Errorf(`Requests("") = %d, want 2`, got)
	}
}

func TestFakeToolRejectsInvalidJSON(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	wantStatus(t, invoke(t, ft, "k", `{not json`), http.StatusBadRequest)
	wantCounts(t, ft, 0, 0)
	// An empty body is fine: some tools take no arguments.
	wantStatus(t, do(t, t.Context(), http.MethodPost, ft.URL+"/effects", "k", ""), http.StatusOK)
	wantCounts(t, ft, 1, 1)
}

func TestFakeToolScriptUnknownRoutePanics(t *testing.T) {
	t.Parallel()
	ft := NewFakeTool(t)
	defer func() {
		if recover() == nil {
			t.Error("Script with an unknown route did not panic")
		}
	}()
	ft.Script("invok", FaultNone)
}
