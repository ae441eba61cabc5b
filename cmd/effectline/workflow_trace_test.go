package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/internal/telemetry"
)

// TestTraceOfAWorkflow: a run is one trace. The agent starts the order
// workflow inside its own span; every step's operation (its executor
// attempt, its relay publishes) is in that trace, under the agent's span,
// though the later steps' intents were recorded by the workflow driver
// long after the agent's request ended.
func TestTraceOfAWorkflow(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	w := newFaultWorld(t, faultWorldOptions{tools: workflowTools})
	p := start(t, "effectline (workflows, traced)", w.with(obsTraceEnv(recv.Endpoint())),
		"run", "--components", obsComponents+",workflow")
	api := &obsClient{t: t, base: "http://" + p.waitLine(obsAPIListening, 60*time.Second)[1]}
	ctx := untilCtx(t, 90*time.Second)

	ctx, agent := obsAgentTracer(t, recv.Endpoint()).Start(ctx, "agent: place the order",
		trace.WithSpanKind(trace.SpanKindClient))
	code, body, err := api.do(ctx, http.MethodPost, "/v1/workflows", map[string]any{"workflow_id": "o-trace",
		"workflow": "order.checkout", "input": map[string]any{"order_id": "t", "sku": "sku-1", "amount": 100}}, obsTraceparent(ctx))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("start: %d %s %v", code, body, err)
	}
	agent.End()
	waitFor(t, ctx, "the workflow to complete", func() bool {
		_, body, err := api.do(ctx, http.MethodGet, "/v1/workflows/o-trace?wait=10s", nil, nil)
		var rec struct{ Status string }
		return err == nil && json.Unmarshal(body, &rec) == nil && rec.Status == "completed"
	})

	traceID := agent.SpanContext().TraceID().String()
	keys := []string{"wf:o-trace/reserve", "wf:o-trace/charge", "wf:o-trace/confirm"}
	var spans []telemetry.Span
	whole := func() bool {
		spans = obsSpansOfTrace(recv.Spans(), traceID)
		for _, k := range keys {
			if len(obsFindSpans(spans, "attempt", map[string]string{"effectline.operation_key": k})) == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !whole() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("trace %s:\n%s", traceID, obsRenderTree(spans))
	byID := map[string]telemetry.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	for _, k := range keys {
		attempts := obsFindSpans(spans, "attempt", map[string]string{"effectline.operation_key": k})
		if len(attempts) != 1 {
			t.Errorf("%s: %d attempt spans in the workflow's trace, want 1", k, len(attempts))
			continue
		}
		// The attempt descends from the agent's span.
		under := false
		for s, ok := byID[attempts[0].ParentSpanID]; ok; s, ok = byID[s.ParentSpanID] {
			if s.SpanID == agent.SpanContext().SpanID().String() {
				under = true
				break
			}
		}
		if !under {
			t.Errorf("%s: the attempt span is not under the agent's span", k)
		}
	}
	// Nothing of the run went to another trace.
	for _, s := range recv.Spans() {
		if s.TraceID != traceID && s.Attributes["effectline.operation_key"] != "" {
			t.Errorf("span %q of %s is in another trace", s.Name, s.Attributes["effectline.operation_key"])
		}
	}
}
