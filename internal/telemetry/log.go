package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Redacted replaces the value of a sensitive attribute.
const Redacted = "[redacted]"

// sensitiveKeys are matched, after lower-casing and dropping '_', '-', '.'
// and ' ', as substrings of attribute keys, so "api_key", "X-Api-Key",
// "apiKey", "client_secret" and "access_token" all match. Tool arguments and
// results are never logged by design (contract §8); this list is the
// safety net for the day someone does it by mistake, so it errs on the side
// of hiding too much.
var sensitiveKeys = []string{
	"password", "passwd", "secret", "token", "authorization", "apikey",
	"cardnumber", "cvc", "cookie", "credential", "privatekey",
	"args", "arguments", "result",
}

// sensitive reports whether an attribute key names something never logged.
func sensitive(key string) bool {
	k := strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.', ' ':
			return -1
		}
		return r
	}, strings.ToLower(key))
	for _, s := range sensitiveKeys {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// parseLevel maps Config.LogLevel.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	default:
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
}

// logHandler wraps the JSON handler: it adds the trace_id and span_id of
// the span in the context and redacts sensitive attributes, including
// inside groups.
//
// It keeps the groups opened by WithGroup itself instead of passing them to
// the inner handler, so trace_id and span_id stay at the top level of every
// line (where log pipelines look for them to link to Jaeger) even when a
// component logs through logger.WithGroup("executor").
type logHandler struct {
	// inner has the attributes added before the first WithGroup.
	inner slog.Handler
	// groups are the open groups, outermost first, each with the
	// (already redacted) attributes added while it was the innermost.
	groups []logGroup
}

type logGroup struct {
	name  string
	attrs []slog.Attr
	// redactAll is set for a group with a sensitive name: a logger made
	// with WithGroup("args") must not print what is logged through it.
	redactAll bool
}

func newLogHandler(inner slog.Handler) *logHandler { return &logHandler{inner: inner} }

func (h *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *logHandler) redactingAll() bool {
	for _, g := range h.groups {
		if g.redactAll {
			return true
		}
	}
	return false
}

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	all := h.redactingAll()
	attrs := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, redact(a, all))
		return true
	})
	// Nest the record's attributes in the open groups, innermost first.
	for i := len(h.groups) - 1; i >= 0; i-- {
		g := h.groups[i]
		attrs = []slog.Attr{{Key: g.name, Value: slog.GroupValue(append(g.attrs[:len(g.attrs):len(g.attrs)], attrs...)...)}}
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	// SpanContextFromContext also finds a remote span context (the agent's
	// traceparent with a no-op TracerProvider), so lines correlate even when
	// this process exports no spans.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		out.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	out.AddAttrs(attrs...)
	return h.inner.Handle(ctx, out)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	all := h.redactingAll()
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = redact(a, all)
	}
	if len(h.groups) == 0 {
		return &logHandler{inner: h.inner.WithAttrs(red)}
	}
	groups := append([]logGroup(nil), h.groups...)
	last := &groups[len(groups)-1]
	last.attrs = append(last.attrs[:len(last.attrs):len(last.attrs)], red...)
	return &logHandler{inner: h.inner, groups: groups}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	groups := append(h.groups[:len(h.groups):len(h.groups)], logGroup{name: name, redactAll: sensitive(name)})
	return &logHandler{inner: h.inner, groups: groups}
}

// redact returns a with its value replaced when its key is sensitive (or
// all is set), recursing into groups and into the map and JSON values the
// JSON handler would print field by field. A sensitive value is never
// resolved: a LogValuer's LogValue is not even called.
func redact(a slog.Attr, all bool) slog.Attr {
	if a.Key != "" && (all || sensitive(a.Key)) {
		return slog.String(a.Key, Redacted)
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		in := v.Group()
		out := make([]slog.Attr, len(in))
		for i, x := range in {
			out[i] = redact(x, all)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		return slog.Attr{Key: a.Key, Value: redactAny(v)}
	default:
		return slog.Attr{Key: a.Key, Value: v}
	}
}

// redactAny covers the common shapes the JSON handler would print with
// their keys: maps and raw JSON (a tool's request or response body). Other
// types (structs) are printed as they are; do not log them if they can hold
// credentials.
func redactAny(v slog.Value) slog.Value {
	switch x := v.Any().(type) {
	case map[string]any:
		return slog.AnyValue(redactJSON(x))
	case map[string]string:
		m := make(map[string]string, len(x))
		for k, s := range x {
			if sensitive(k) {
				s = Redacted
			}
			m[k] = s
		}
		return slog.AnyValue(m)
	case json.RawMessage:
		dec := json.NewDecoder(bytes.NewReader(x))
		dec.UseNumber() // keep numbers exactly as they were
		var doc any
		if err := dec.Decode(&doc); err != nil {
			return v // not JSON: the JSON handler prints it as a string
		}
		b, err := json.Marshal(redactJSON(doc))
		if err != nil {
			return slog.StringValue(Redacted)
		}
		return slog.AnyValue(json.RawMessage(b))
	default:
		return v
	}
}

// redactJSON copies a decoded JSON document with sensitive keys redacted.
func redactJSON(doc any) any {
	switch x := doc.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, v := range x {
			if sensitive(k) {
				m[k] = Redacted
				continue
			}
			m[k] = redactJSON(v)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, v := range x {
			s[i] = redactJSON(v)
		}
		return s
	default:
		return doc
	}
}
