package telemetry

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTEL_* variables are read through Config.Getenv rather than left to
// the SDK and exporter (which would read os.Getenv themselves): only cmd
// reads the environment (only cmd does), and tests can then pass a map. Each
// value honoured here is turned into an explicit option, which takes
// precedence over what the SDK would read from the process environment.
// Settings not translated here (the TLS certificate files of
// OTEL_EXPORTER_OTLP_*CERTIFICATE / *CLIENT_KEY) are still read by the
// exporter from the process environment, which in production is the same
// environment.
//
// A value that is set but cannot be honoured is an error rather than a
// warning: an SRE who sets OTEL_TRACES_EXPORTER=zipkin or
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc and gets no traces would otherwise have
// to find out why from a missing trace.

// Spec: https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/
const (
	envSDKDisabled        = "OTEL_SDK_DISABLED"
	envServiceName        = "OTEL_SERVICE_NAME"
	envResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	envTracesExporter     = "OTEL_TRACES_EXPORTER"
	envMetricsExporter    = "OTEL_METRICS_EXPORTER"
	envTracesSampler      = "OTEL_TRACES_SAMPLER"
	envTracesSamplerArg   = "OTEL_TRACES_SAMPLER_ARG"
	envBSPScheduleDelay   = "OTEL_BSP_SCHEDULE_DELAY"
	envBSPExportTimeout   = "OTEL_BSP_EXPORT_TIMEOUT"
	envBSPMaxQueueSize    = "OTEL_BSP_MAX_QUEUE_SIZE"
	envBSPMaxExportBatch  = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"

	envOTLPEndpoint          = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envOTLPTracesEndpoint    = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envOTLPProtocol          = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envOTLPTracesProtocol    = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envOTLPHeaders           = "OTEL_EXPORTER_OTLP_HEADERS"
	envOTLPTracesHeaders     = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
	envOTLPCompression       = "OTEL_EXPORTER_OTLP_COMPRESSION"
	envOTLPTracesCompression = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
	envOTLPTimeout           = "OTEL_EXPORTER_OTLP_TIMEOUT"
	envOTLPTracesTimeout     = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
)

// tracesPath is appended to OTEL_EXPORTER_OTLP_ENDPOINT (a base URL); the
// per-signal OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is.
const tracesPath = "/v1/traces"

// env wraps Getenv with trimming and the "signal-specific wins" lookup.
type env func(string) string

func (e env) get(key string) string { return strings.TrimSpace(e(key)) }

// first returns the value of the first key that is set, and that key.
func (e env) first(keys ...string) (string, string) {
	for _, k := range keys {
		if v := e.get(k); v != "" {
			return v, k
		}
	}
	return "", ""
}

// sdkDisabled reports OTEL_SDK_DISABLED: only "true" (any case) disables,
// as the specification says; anything else leaves the SDK on.
func (e env) sdkDisabled() bool { return strings.EqualFold(e.get(envSDKDisabled), "true") }

// traceExport is what the environment asks for traces.
type traceExport struct {
	enabled   bool
	exporter  []otlptracehttp.Option
	provider  []sdktrace.TracerProviderOption
	processor []sdktrace.BatchSpanProcessorOption
}

// traceExportFromEnv decides whether spans are exported at all and, if so,
// how. Exporting is on when an OTLP endpoint is configured, or when
// OTEL_TRACES_EXPORTER=otlp explicitly asks for the default endpoint
// (http://localhost:4318); with no OTEL variables set it is off, and the
// caller installs a no-op TracerProvider so that spans cost nothing.
func traceExportFromEnv(e env) (traceExport, error) {
	if e.sdkDisabled() {
		return traceExport{}, nil
	}
	explicit, err := tracesExporterFromEnv(e)
	if err != nil {
		return traceExport{}, err
	}
	base, tracesURL := e.get(envOTLPEndpoint), e.get(envOTLPTracesEndpoint)
	switch {
	case explicit == "none":
		return traceExport{}, nil
	case explicit == "" && base == "" && tracesURL == "":
		return traceExport{}, nil
	}

	var errs []error
	x := traceExport{enabled: true}

	switch p, key := e.first(envOTLPTracesProtocol, envOTLPProtocol); p {
	case "", "http/protobuf":
		x.exporter = append(x.exporter, otlptracehttp.WithEncoding(otlptracehttp.EncodingProtobuf))
	case "http/json":
		x.exporter = append(x.exporter, otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON))
	default:
		errs = append(errs, fmt.Errorf("%s=%q: only http/protobuf and http/json are supported (OTLP/HTTP, usually port 4318)", key, p))
	}

	switch {
	case tracesURL != "":
		u, err := otlpURL(envOTLPTracesEndpoint, tracesURL)
		if err != nil {
			errs = append(errs, err)
			break
		}
		x.exporter = append(x.exporter, otlptracehttp.WithEndpointURL(u.String()))
	case base != "":
		u, err := otlpURL(envOTLPEndpoint, base)
		if err != nil {
			errs = append(errs, err)
			break
		}
		u.Path = path.Join("/", u.Path, tracesPath)
		u.RawPath = ""
		x.exporter = append(x.exporter, otlptracehttp.WithEndpointURL(u.String()))
	}

	// Headers usually carry the collector's credentials: they go to the
	// exporter and nowhere else, and errors name the variable, not the value.
	headers := map[string]string{}
	for _, key := range []string{envOTLPHeaders, envOTLPTracesHeaders} {
		if err := parseKeyValues(e.get(key), func(k, v string) { headers[k] = v }); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	if len(headers) > 0 {
		x.exporter = append(x.exporter, otlptracehttp.WithHeaders(headers))
	}

	switch c, key := e.first(envOTLPTracesCompression, envOTLPCompression); c {
	case "":
	case "none":
		x.exporter = append(x.exporter, otlptracehttp.WithCompression(otlptracehttp.NoCompression))
	case "gzip":
		x.exporter = append(x.exporter, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want gzip or none", key, c))
	}

	if d, ok, err := millis(e, envOTLPTracesTimeout, envOTLPTimeout); err != nil {
		errs = append(errs, err)
	} else if ok {
		x.exporter = append(x.exporter, otlptracehttp.WithTimeout(d))
	}

	sampler, err := samplerFromEnv(e)
	if err != nil {
		errs = append(errs, err)
	} else if sampler != nil {
		x.provider = append(x.provider, sdktrace.WithSampler(sampler))
	}

	if d, ok, err := millis(e, envBSPScheduleDelay); err != nil {
		errs = append(errs, err)
	} else if ok {
		x.processor = append(x.processor, sdktrace.WithBatchTimeout(d))
	}
	if d, ok, err := millis(e, envBSPExportTimeout); err != nil {
		errs = append(errs, err)
	} else if ok {
		x.processor = append(x.processor, sdktrace.WithExportTimeout(d))
	}
	if n, ok, err := positiveInt(e, envBSPMaxQueueSize); err != nil {
		errs = append(errs, err)
	} else if ok {
		x.processor = append(x.processor, sdktrace.WithMaxQueueSize(n))
	}
	if n, ok, err := positiveInt(e, envBSPMaxExportBatch); err != nil {
		errs = append(errs, err)
	} else if ok {
		x.processor = append(x.processor, sdktrace.WithMaxExportBatchSize(n))
	}

	if err := errors.Join(errs...); err != nil {
		return traceExport{}, err
	}
	return x, nil
}

// tracesExporterFromEnv returns "", "otlp" or "none" from
// OTEL_TRACES_EXPORTER (a comma-separated list by the specification).
func tracesExporterFromEnv(e env) (string, error) {
	v := e.get(envTracesExporter)
	if v == "" {
		return "", nil
	}
	var otlp, none bool
	for _, name := range strings.Split(v, ",") {
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "otlp":
			otlp = true
		case "none":
			none = true
		default:
			return "", fmt.Errorf("%s=%q: only otlp and none are supported", envTracesExporter, v)
		}
	}
	if otlp {
		return "otlp", nil
	}
	if none {
		return "none", nil
	}
	return "", nil
}

// metricsEnabledFromEnv reports whether the OTel metrics pipeline (served
// by the Prometheus exporter) is on. Metrics are pulled, so there is no
// endpoint to configure; OTEL_METRICS_EXPORTER=none or OTEL_SDK_DISABLED
// turn the instruments into no-ops.
func metricsEnabledFromEnv(e env) (bool, error) {
	if e.sdkDisabled() {
		return false, nil
	}
	switch v := strings.ToLower(e.get(envMetricsExporter)); v {
	case "", "prometheus":
		return true, nil
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: only prometheus (scraped from the metrics endpoint) and none are supported", envMetricsExporter, v)
	}
}

// otlpURL validates an OTLP/HTTP endpoint. The specification wants a full
// URL; "collector:4318" would parse with "collector" as the scheme and send
// spans nowhere, so it is rejected here instead.
//
// User info is rejected too: the exporter sends only the host, so a
// password in the URL would be silently dropped; credentials belong in
// OTEL_EXPORTER_OTLP_HEADERS. Errors show the URL with the password masked.
func otlpURL(key, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: not a URL; want one such as http://collector:4318", key)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s=%q: want a URL such as http://collector:4318", key, u.Redacted())
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s=%q: credentials in the URL are not sent; use OTEL_EXPORTER_OTLP_HEADERS (authorization=Basic%%20...)", key, u.Redacted())
	}
	return u, nil
}

// samplerFromEnv maps OTEL_TRACES_SAMPLER. Unset means nil: the SDK default,
// parentbased_always_on, which honours the sampled flag of the agent's
// traceparent.
func samplerFromEnv(e env) (sdktrace.Sampler, error) {
	name := strings.ToLower(e.get(envTracesSampler))
	if name == "" {
		return nil, nil
	}
	ratio := func() (float64, error) {
		arg := e.get(envTracesSamplerArg)
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("%s=%q: want a ratio between 0 and 1", envTracesSamplerArg, arg)
		}
		return r, nil
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.TraceIDRatioBased(r), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	default:
		return nil, fmt.Errorf("%s=%q: unsupported sampler", envTracesSampler, name)
	}
}

// resourceAttributesFromEnv parses OTEL_RESOURCE_ATTRIBUTES
// ("key1=value1,key2=value2", values percent-encoded).
func resourceAttributesFromEnv(e env) ([]attribute.KeyValue, error) {
	var kvs []attribute.KeyValue
	err := parseKeyValues(e.get(envResourceAttributes), func(k, v string) {
		kvs = append(kvs, attribute.String(k, v))
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envResourceAttributes, err)
	}
	return kvs, nil
}

// parseKeyValues parses the "k1=v1,k2=v2" lists of OTEL_RESOURCE_ATTRIBUTES
// and OTEL_EXPORTER_OTLP_HEADERS. Errors do not quote values: they may be
// credentials.
func parseKeyValues(s string, fn func(k, v string)) error {
	if s == "" {
		return nil
	}
	for i, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("entry %d: want key=value", i+1)
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("entry %d (%s): bad percent-encoding", i+1, k)
		}
		fn(k, dv)
	}
	return nil
}

// millis reads the first set key as a non-negative number of milliseconds.
func millis(e env, keys ...string) (time.Duration, bool, error) {
	v, key := e.first(keys...)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("%s=%q: want milliseconds", key, v)
	}
	return time.Duration(n) * time.Millisecond, true, nil
}

func positiveInt(e env, key string) (int, bool, error) {
	v := e.get(key)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%s=%q: want a positive integer", key, v)
	}
	return n, true, nil
}
