package telemetry

import (
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"go.opentelemetry.io/otel/trace"
)

// This file is for tests, but not a _test file, so that the end-to-end
// tests of other packages can point the real binary at it. It imports
// neither testing nor net/http/httptest, so that linking this package into
// the product binary does not drag them in: TB is the part of testing.TB
// it needs, and the server is a plain http.Server on a loopback listener.

// TB is the subset of testing.TB the receiver uses; *testing.T satisfies it.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// Span is one span the Receiver got, flattened for assertions.
type Span struct {
	TraceID      string // 32 hex digits
	SpanID       string // 16 hex digits
	ParentSpanID string // "" for a root span
	Name         string
	Kind         string // internal, server, client, producer, consumer (trace.SpanKind.String)
	// Attributes are rendered as strings: ints and floats in decimal,
	// bools as true/false, arrays and maps as JSON, bytes as base64.
	Attributes    map[string]string
	StatusCode    string // Unset, Ok or Error (codes.Code.String)
	StatusMessage string
	Service       string // the resource's service.name
	Scope         string // the instrumentation scope (tracer) name
	Start, End    time.Time
}

// Receiver is an OTLP/HTTP trace receiver (protobuf encoding, the
// exporter's default, optionally gzip-compressed) on 127.0.0.1 that keeps
// every span it is sent.
type Receiver struct {
	endpoint string

	mu    sync.Mutex
	spans []Span
	// changed is closed and replaced whenever spans arrive, to wake
	// WaitFor without polling on a timer.
	changed chan struct{}
}

// maxExportBody bounds a request body; the exporter's batches are far
// smaller.
const maxExportBody = 64 << 20

// NewTestReceiver starts a Receiver, stopped when the test ends. Point an
// exporter at it with OTEL_EXPORTER_OTLP_ENDPOINT=r.Endpoint().
func NewTestReceiver(t TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("telemetry receiver: listen: %v", err)
		return nil
	}
	r := &Receiver{endpoint: "http://" + ln.Addr().String(), changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+tracesPath, r.serveTraces)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // returns http.ErrServerClosed on Close
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return r
}

// Endpoint is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT, such as
// "http://127.0.0.1:40123"; spans are posted to Endpoint()+"/v1/traces".
func (r *Receiver) Endpoint() string { return r.endpoint }

// Spans returns a copy of the spans received so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor waits until cond holds for the spans received so far and returns
// them; after timeout it fails the test, listing what did arrive. cond is
// called again each time spans arrive, so it should be cheap and must not
// block.
func (r *Receiver) WaitFor(t TB, cond func([]Span) bool, timeout time.Duration) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans := append([]Span(nil), r.spans...)
		changed := r.changed
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("telemetry receiver: condition not met after %v; %d spans received:\n%s",
				timeout, len(spans), describeSpans(spans))
			return nil
		}
	}
}

func (r *Receiver) serveTraces(w http.ResponseWriter, req *http.Request) {
	if ct, _, _ := strings.Cut(req.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) != "application/x-protobuf" {
		// OTLP/JSON would need its own decoding (hex ids, not base64).
		http.Error(w, "only application/x-protobuf is supported", http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxExportBody)
	if strings.EqualFold(req.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, "bad gzip body", http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxExportBody)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var msg collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, "decoding ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	spans := flatten(&msg)

	resp, err := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	r.mu.Lock()
	r.spans = append(r.spans, spans...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()

	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

func flatten(msg *collectortrace.ExportTraceServiceRequest) []Span {
	var out []Span
	for _, rs := range msg.GetResourceSpans() {
		service := attrMap(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			scope := ss.GetScope().GetName()
			for _, s := range ss.GetSpans() {
				out = append(out, Span{
					TraceID:       hex.EncodeToString(s.GetTraceId()),
					SpanID:        hex.EncodeToString(s.GetSpanId()),
					ParentSpanID:  hex.EncodeToString(s.GetParentSpanId()),
					Name:          s.GetName(),
					Kind:          spanKind(s.GetKind()),
					Attributes:    attrMap(s.GetAttributes()),
					StatusCode:    statusCode(s.GetStatus().GetCode()),
					StatusMessage: s.GetStatus().GetMessage(),
					Service:       service,
					Scope:         scope,
					Start:         unixNano(s.GetStartTimeUnixNano()),
					End:           unixNano(s.GetEndTimeUnixNano()),
				})
			}
		}
	}
	return out
}

// spanKind uses the API's names; the OTLP enum has the same numbering.
func spanKind(k tracepb.Span_SpanKind) string { return trace.SpanKind(k).String() }

// statusCode maps the OTLP status (UNSET=0, OK=1, ERROR=2) to the names of
// codes.Code, whose numbering differs (Error=1, Ok=2).
func statusCode(c tracepb.Status_StatusCode) string {
	switch c {
	case tracepb.Status_STATUS_CODE_OK:
		return "Ok"
	case tracepb.Status_STATUS_CODE_ERROR:
		return "Error"
	default:
		return "Unset"
	}
}

func unixNano(ns uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(ns)).UTC()
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = anyString(kv.GetValue())
	}
	return m
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BytesValue:
		return base64.StdEncoding.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue, *commonpb.AnyValue_KvlistValue:
		b, err := json.Marshal(anyJSON(v))
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	default:
		return ""
	}
}

func anyJSON(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_ArrayValue:
		s := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			s = append(s, anyJSON(e))
		}
		return s
	case *commonpb.AnyValue_KvlistValue:
		m := make(map[string]any, len(x.KvlistValue.GetValues()))
		for _, kv := range x.KvlistValue.GetValues() {
			m[kv.GetKey()] = anyJSON(kv.GetValue())
		}
		return m
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case nil:
		return nil
	default:
		return anyString(v)
	}
}

// describeSpans renders spans for a failure message, grouped by trace.
func describeSpans(spans []Span) string {
	if len(spans) == 0 {
		return "  (none)"
	}
	sorted := append([]Span(nil), spans...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].TraceID != sorted[j].TraceID {
			return sorted[i].TraceID < sorted[j].TraceID
		}
		return sorted[i].Start.Before(sorted[j].Start)
	})
	var b strings.Builder
	for _, s := range sorted {
		keys := make([]string, 0, len(s.Attributes))
		for k := range s.Attributes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		attrs := make([]string, len(keys))
		for i, k := range keys {
			attrs[i] = k + "=" + s.Attributes[k]
		}
		fmt.Fprintf(&b, "  trace=%s span=%s parent=%s service=%s %s %q status=%s {%s}\n",
			s.TraceID, s.SpanID, s.ParentSpanID, s.Service, s.Kind, s.Name, s.StatusCode, strings.Join(attrs, " "))
	}
	return b.String()
}
