package telemetry_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/internal/telemetry"
)

// syncWriter lets a test read what background goroutines (the otel error
// handler) may still be writing.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// logLines runs fn with a fresh logger and returns the lines it wrote,
// decoded.
func logLines(t *testing.T, level string, fn func(*slog.Logger)) (raw string, lines []map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{LogWriter: &buf, LogLevel: level})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(t.Context())
	buf.Reset() // Setup's own lines
	fn(tel.Logger())
	raw = buf.String()
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		lines = append(lines, m)
	}
	return raw, lines
}

func TestLoggerAddsTraceIDs(t *testing.T) {
	t.Parallel()
	parent := remoteParent(t)
	ctx := trace.ContextWithRemoteSpanContext(t.Context(), parent)

	_, lines := logLines(t, "", func(l *slog.Logger) {
		l.InfoContext(ctx, "with span")
		l.WithGroup("executor").With("worker", 1).InfoContext(ctx, "grouped", "operation_key", "op-1")
		l.InfoContext(t.Context(), "without span")
	})
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 3", len(lines))
	}
	for _, m := range lines[:2] {
		if m["trace_id"] != parent.TraceID().String() || m["span_id"] != parent.SpanID().String() {
			t.Errorf("line %v: want top-level trace_id %s span_id %s", m, parent.TraceID(), parent.SpanID())
		}
	}
	grouped, _ := lines[1]["executor"].(map[string]any)
	if grouped["worker"] != float64(1) || grouped["operation_key"] != "op-1" {
		t.Errorf("group executor = %v, want worker and operation_key inside it", lines[1]["executor"])
	}
	if _, ok := lines[2]["trace_id"]; ok {
		t.Errorf("line without a span has trace_id: %v", lines[2])
	}
}

// With an exporting provider the ids are those of the local span.
func TestLoggerCorrelatesWithExportedSpan(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	var buf syncWriter
	buf.w = &bytes.Buffer{}
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{
		LogWriter: &buf,
		Getenv:    mapEnv(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint()}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "op")
	tel.Logger().InfoContext(ctx, "inside")
	span.End()
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := recv.Spans()
	if len(spans) != 1 {
		t.Fatalf("got %d spans", len(spans))
	}
	var m map[string]any
	if err := json.Unmarshal(buf.w.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["trace_id"] != spans[0].TraceID || m["span_id"] != spans[0].SpanID {
		t.Fatalf("log %v does not point at span %s/%s", m, spans[0].TraceID, spans[0].SpanID)
	}
}

func TestLoggerRedacts(t *testing.T) {
	t.Parallel()
	raw, lines := logLines(t, "debug", func(l *slog.Logger) {
		l.Info("tool call",
			"password", "x",
			slog.Group("args", "amount", 100, "card_number", "4242424242424242"),
			"tool", "pay",
			slog.Group("http", "Authorization", "Bearer abc.def", "status", 200,
				slog.Group("body", "client_secret", "cs_live")),
			slog.Any("params", map[string]any{"apiKey": "k-123", "nested": map[string]any{"cvc": "cvc-val"}, "n": 1}),
			slog.Any("headers", map[string]string{"X-Api-Key": "hk-1", "Accept": "json"}),
			slog.Any("body", json.RawMessage(`{"refresh_token":"rt-1","items":[{"Password":"p-1"}],"amount":12.50}`)),
			"result", map[string]any{"charge_id": "ch_1"},
			slog.Any("lazy", lazy{}),
		)
		l.With("token", "sekrit-with").WithGroup("result").Info("grouped", "charge_id", "ch_2")
		l.WithGroup("args").With("amount", 5).Debug("debug line", "to", "x@example.com")
	})
	for _, secret := range []string{
		`"x"`, "4242424242424242", "Bearer abc.def", "cs_live", "k-123", "cvc-val", "hk-1", "rt-1", "p-1",
		"ch_1", "sekrit-with", "ch_2", "x@example.com", "lazy-secret",
	} {
		if strings.Contains(raw, secret) {
			t.Errorf("log contains %s:\n%s", secret, raw)
		}
	}
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 3:\n%s", len(lines), raw)
	}
	m := lines[0]
	for key, want := range map[string]any{
		"password": telemetry.Redacted,
		"args":     telemetry.Redacted,
		"result":   telemetry.Redacted,
		"tool":     "pay",
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}
	httpGroup := m["http"].(map[string]any)
	if httpGroup["Authorization"] != telemetry.Redacted || httpGroup["status"] != float64(200) {
		t.Errorf("http group = %v", httpGroup)
	}
	if body := m["body"].(map[string]any); body["refresh_token"] != telemetry.Redacted || body["amount"] != 12.5 {
		t.Errorf("raw JSON body = %v", body)
	}
	if params := m["params"].(map[string]any); params["n"] != float64(1) {
		t.Errorf("params = %v", params)
	}
	if lines[1]["token"] != telemetry.Redacted {
		t.Errorf("line 2 = %v", lines[1])
	}
	if args, _ := lines[2]["args"].(map[string]any); args["amount"] != telemetry.Redacted || args["to"] != telemetry.Redacted {
		t.Errorf("logger.WithGroup(args) line = %v, want everything inside redacted", lines[2])
	}
}

// lazy is a LogValuer that must not even be resolved under a sensitive key,
// and is redacted inside when resolved under a harmless one.
type lazy struct{}

func (lazy) LogValue() slog.Value {
	return slog.GroupValue(slog.String("token", "lazy-secret"), slog.Int("n", 1))
}

func TestLoggerNeverPrintsToken(t *testing.T) {
	t.Parallel()
	const secret = "tok_9f8e7d6c5b4a"
	raw, _ := logLines(t, "debug", func(l *slog.Logger) {
		l.Info("a", "token", secret)
		l.Info("b", slog.String("Token", secret))
		l.Info("c", slog.Group("auth", slog.String("access_token", secret)))
		l.With(slog.String("token", secret)).Error("d")
		l.LogAttrs(t.Context(), slog.LevelWarn, "e", slog.Any("token", secret))
	})
	if strings.Contains(raw, secret) {
		t.Fatalf("log contains the token:\n%s", raw)
	}
	if got := strings.Count(raw, "\n"); got != 5 {
		t.Fatalf("got %d lines, want 5:\n%s", got, raw)
	}
}

func TestLoggerLevel(t *testing.T) {
	t.Parallel()
	raw, _ := logLines(t, "warn", func(l *slog.Logger) {
		l.Info("quiet")
		l.Warn("loud")
	})
	if strings.Contains(raw, "quiet") || !strings.Contains(raw, "loud") {
		t.Fatalf("level warn wrote:\n%s", raw)
	}
	raw, _ = logLines(t, "", func(l *slog.Logger) {
		l.Debug("quiet")
		l.Info("loud")
	})
	if strings.Contains(raw, "quiet") || !strings.Contains(raw, "loud") {
		t.Fatalf("default level wrote:\n%s", raw)
	}
}
