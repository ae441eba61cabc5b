package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/effectline/effectline/cmd/effectline/ops"
)

// Environment variables the binary reads (contract, DESIGN §7). Only cmd
// reads the environment; components get typed config.
const (
	envDatabaseURL      = "EFFECTLINE_DATABASE_URL"
	envKafkaBrokers     = "EFFECTLINE_KAFKA_BROKERS"
	envTools            = "EFFECTLINE_TOOLS"
	envHTTPAddr         = "EFFECTLINE_HTTP_ADDR"
	envAPITokens        = "EFFECTLINE_API_TOKENS"
	envApprovers        = "EFFECTLINE_APPROVERS"
	envReaders          = "EFFECTLINE_READERS"
	envTopicPrefix      = "EFFECTLINE_TOPIC_PREFIX"
	envKafkaPartitions  = "EFFECTLINE_KAFKA_PARTITIONS"
	envKafkaReplication = "EFFECTLINE_KAFKA_REPLICATION"
	envLogLevel         = "EFFECTLINE_LOG_LEVEL"
	envShutdownGrace    = "EFFECTLINE_SHUTDOWN_GRACE"
	envInsecureOpenAPI  = "EFFECTLINE_INSECURE_OPEN_API"
	envExecutorLease    = "EFFECTLINE_EXECUTOR_LEASE"
	envSweepInterval    = "EFFECTLINE_RECONCILER_SWEEP_INTERVAL"
	envCommitWindow     = "EFFECTLINE_COMMIT_WINDOW"
	// envCrashPoint makes the executor SIGKILL its own process at a named
	// point (executor.Point*): for the crash-matrix tests only.
	envCrashPoint        = "EFFECTLINE_CRASHPOINT"
	defaultDatabaseURL   = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultHTTPAddr      = "127.0.0.1:8080"
	defaultShutdownGrace = 10 * time.Second
)

// EnvVars lists every variable the binary reads, for the docs and for the
// test that checks docker-compose.kafka.yml and the Kubernetes manifests
// against it. Standard OTEL_* variables are read by the OpenTelemetry SDK.
var EnvVars = []string{
	envDatabaseURL, envKafkaBrokers, envTools, envHTTPAddr, envAPITokens, envApprovers, envReaders,
	envTopicPrefix, envKafkaPartitions, envKafkaReplication, envLogLevel, envShutdownGrace,
	envInsecureOpenAPI, envExecutorLease, envSweepInterval, envCommitWindow,
	ops.EnvAPIURL, ops.EnvAPIToken, // read by `effectline ops`, the API's client
}

// Components that `effectline run --components` accepts.
const (
	componentRelay      = "relay"
	componentExecutor   = "executor"
	componentProjector  = "projector"
	componentReconciler = "reconciler"
	componentAPI        = "api"
)

// Components lists every component in start order.
var Components = []string{componentRelay, componentExecutor, componentProjector, componentReconciler, componentAPI}

// config is the process configuration, read from the environment and flags.
type config struct {
	DatabaseURL  string
	KafkaBrokers []string
	ToolsFile    string
	HTTPAddr     string
	// HTTPAddrSet says EFFECTLINE_HTTP_ADDR was given: a process without
	// the API serves its health endpoints only then, so several such
	// processes on one host do not fight over the default port.
	HTTPAddrSet bool
	APITokens   string
	Approvers   []string
	// Readers read every operation without the approver role.
	Readers       []string
	TopicPrefix   string
	Partitions    int32
	Replication   int16
	LogLevel      string
	ShutdownGrace time.Duration
	InsecureOpen  bool
	Lease         time.Duration
	SweepInterval time.Duration
	// CommitWindow is the journal committer's pacing window
	// (store.CommitterConfig.Window): zero for the default, negative for
	// none (EFFECTLINE_COMMIT_WINDOW=0).
	CommitWindow time.Duration
	CrashPoint   string
}

func configFromEnv(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL: getenv(envDatabaseURL),
		ToolsFile:   getenv(envTools),
		HTTPAddr:    getenv(envHTTPAddr),
		APITokens:   getenv(envAPITokens),
		TopicPrefix: getenv(envTopicPrefix),
		LogLevel:    getenv(envLogLevel),
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = defaultDatabaseURL
	}
	c.HTTPAddrSet = c.HTTPAddr != ""
	if c.HTTPAddr == "" {
		c.HTTPAddr = defaultHTTPAddr
	}
	c.KafkaBrokers = splitList(getenv(envKafkaBrokers))
	c.Approvers = splitList(getenv(envApprovers))
	c.Readers = splitList(getenv(envReaders))
	var errs []error
	if v := getenv(envKafkaPartitions); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", envKafkaPartitions, v))
		}
		c.Partitions = int32(n)
	}
	if v := getenv(envKafkaReplication); v != "" {
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", envKafkaReplication, v))
		}
		c.Replication = int16(n)
	}
	c.ShutdownGrace = defaultShutdownGrace
	if v := getenv(envShutdownGrace); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration like 10s", envShutdownGrace, v))
		}
		c.ShutdownGrace = d
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{envExecutorLease, &c.Lease}, {envSweepInterval, &c.SweepInterval}} {
		if v := getenv(d.name); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a duration like 30s", d.name, v))
			}
			*d.dst = p
		}
	}
	if v := getenv(envCommitWindow); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Second {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration from 0 (no pacing) to 1s, like 4ms", envCommitWindow, v))
		}
		c.CommitWindow = d
		if d == 0 {
			c.CommitWindow = -1
		}
	}
	c.CrashPoint = getenv(envCrashPoint)
	if v := getenv(envInsecureOpenAPI); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", envInsecureOpenAPI, v))
		}
		c.InsecureOpen = b
	}
	return c, errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseComponents validates a --components list.
func parseComponents(s string) ([]string, error) {
	list := splitList(s)
	if len(list) == 0 {
		return nil, fmt.Errorf("--components is empty; choose from %s", strings.Join(Components, ","))
	}
	seen := map[string]bool{}
	for _, c := range list {
		known := false
		for _, k := range Components {
			known = known || c == k
		}
		if !known {
			return nil, fmt.Errorf("unknown component %q; choose from %s", c, strings.Join(Components, ","))
		}
		if seen[c] {
			return nil, fmt.Errorf("component %q named twice", c)
		}
		seen[c] = true
	}
	return list, nil
}
