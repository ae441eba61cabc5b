package telemetry_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// TestJaeger sends a trace to a real Jaeger and reads it back through the
// query API. It runs only when one is up:
//
//	scripts/jaeger.sh start
//	eval "$(scripts/jaeger.sh env)"
//	go test ./internal/telemetry/ -run TestJaeger -v
func TestJaeger(t *testing.T) {
	ui, endpoint := os.Getenv("JAEGER_UI_URL"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if ui == "" || endpoint == "" {
		t.Skip("set JAEGER_UI_URL and OTEL_EXPORTER_OTLP_ENDPOINT (scripts/jaeger.sh env) to run against Jaeger")
	}
	t.Parallel()
	service := fmt.Sprintf("effectline-telemetry-test-%d", time.Now().UnixNano())
	tel := setup(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": service})

	tracer := tel.TracerProvider().Tracer("test")
	ctx, op := tracer.Start(t.Context(), "operation")
	_, attempt := tracer.Start(ctx, "attempt", trace.WithSpanKind(trace.SpanKindClient))
	attempt.End()
	op.End()
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := op.SpanContext().TraceID().String()

	// Jaeger's collector pipeline batches before storing: poll.
	q := ui + "/api/traces?service=" + url.QueryEscape(service)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var body struct {
			Data []struct {
				TraceID string `json:"traceID"`
				Spans   []struct {
					OperationName string `json:"operationName"`
				} `json:"spans"`
			} `json:"data"`
		}
		resp, err := http.Get(q)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
		}
		if err == nil && len(body.Data) == 1 && body.Data[0].TraceID == want && len(body.Data[0].Spans) == 2 {
			t.Logf("Jaeger has trace %s with %d spans: %s/trace/%s", want, len(body.Data[0].Spans), ui, want)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s of service %s not in Jaeger after 30s (last error %v, body %+v)", want, service, err, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
