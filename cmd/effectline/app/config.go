package app

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/effectline/effectline/cmd/effectline/ops"
	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/store"
)

// Environment variables the binary reads (contract, contract §7). Only cmd
// reads the environment; components get typed config.
const (
	EnvDatabaseURL      = "EFFECTLINE_DATABASE_URL"
	EnvKafkaBrokers     = "EFFECTLINE_KAFKA_BROKERS"
	EnvTools            = "EFFECTLINE_TOOLS"
	EnvHTTPAddr         = "EFFECTLINE_HTTP_ADDR"
	EnvAPITokens        = "EFFECTLINE_API_TOKENS"
	EnvApprovers        = "EFFECTLINE_APPROVERS"
	EnvTopicPrefix      = "EFFECTLINE_TOPIC_PREFIX"
	EnvKafkaPartitions  = "EFFECTLINE_KAFKA_PARTITIONS"
	EnvKafkaReplication = "EFFECTLINE_KAFKA_REPLICATION"
	EnvLogLevel         = "EFFECTLINE_LOG_LEVEL"
	EnvShutdownGrace    = "EFFECTLINE_SHUTDOWN_GRACE"
	EnvInsecureOpenAPI  = "EFFECTLINE_INSECURE_OPEN_API"
	EnvExecutorLease    = "EFFECTLINE_EXECUTOR_LEASE"
	EnvSweepInterval    = "EFFECTLINE_RECONCILER_SWEEP_INTERVAL"
	EnvCommitWindow     = "EFFECTLINE_COMMIT_WINDOW"
	EnvRelayWindow      = "EFFECTLINE_RELAY_WINDOW"
	// EnvRowFormat is how the process writes journal and head rows
	// (store.RowFormat): compact, the default, or plain for a rolling
	// upgrade from a binary older than compact rows.
	EnvRowFormat = "EFFECTLINE_ROW_FORMAT"
	EnvReaders   = "EFFECTLINE_READERS"
	// EnvKafkaPrincipals lists the principals an intent produced straight to
	// Kafka may name (contract); unset, any.
	EnvKafkaPrincipals = "EFFECTLINE_KAFKA_PRINCIPALS"
	// EnvKafkaInstanceID makes the process a static member of its consumer
	// groups (kafka.Config.InstanceID): stable per replica, unique.
	EnvKafkaInstanceID = "EFFECTLINE_KAFKA_INSTANCE_ID"
	// EnvRetention is the dedup_window of tools that name none;
	// EnvTombstoneRetention how long a pruned operation's tombstone is
	// kept (unset: forever).
	EnvRetention          = "EFFECTLINE_RETENTION"
	EnvTombstoneRetention = "EFFECTLINE_TOMBSTONE_RETENTION"
	// EnvEmbeddedRetention is how long dev's embedded broker keeps a
	// message that every live consumer group has read (default
	// DefaultEmbeddedRetention).
	EnvEmbeddedRetention = "EFFECTLINE_EMBEDDED_RETENTION"
	DefaultDatabaseURL   = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultHTTPAddr      = "127.0.0.1:8080"
	DefaultShutdownGrace = 10 * time.Second
)

// EnvVars lists every variable the binary reads, for the docs and for the
// test that checks docker-compose.kafka.yml and the Kubernetes manifests
// against it. Standard OTEL_* variables are read by the OpenTelemetry SDK.
var EnvVars = []string{
	EnvDatabaseURL, EnvKafkaBrokers, EnvTools, EnvHTTPAddr, EnvAPITokens, EnvApprovers,
	EnvTopicPrefix, EnvKafkaPartitions, EnvKafkaReplication, EnvLogLevel, EnvShutdownGrace,
	EnvInsecureOpenAPI, EnvExecutorLease, EnvSweepInterval, EnvCommitWindow, EnvRelayWindow,
	EnvReaders, EnvKafkaPrincipals, EnvKafkaInstanceID, EnvRetention, EnvTombstoneRetention,
	EnvEmbeddedRetention, EnvRowFormat, ops.EnvAPIURL, ops.EnvAPIToken, // read by `effectline ops`, the API's client
}

// Components that `effectline run --components` accepts.
const (
	Relay      = "relay"
	Executor   = "executor"
	Projector  = "projector"
	Reconciler = "reconciler"
	API        = "api"
	Workflow   = "workflow"
)

// Components lists every component in start order.
var Components = []string{Relay, Executor, Projector, Reconciler, Workflow, API}

// Config is the process configuration, read from the environment and flags.
type Config struct {
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
	// EmbeddedRetention bounds the embedded broker's messages by age
	// (dev only; zero: DefaultEmbeddedRetention).
	EmbeddedRetention time.Duration
	InsecureOpen      bool
	Lease             time.Duration
	SweepInterval     time.Duration
	// CommitWindow is the journal committer's pacing window
	// (store.CommitterConfig.Window): zero for the default, negative for
	// none (EFFECTLINE_COMMIT_WINDOW=0).
	CommitWindow time.Duration
	// RelayWindow is the relay's pacing window (outbox.RelayConfig.Window,
	// EFFECTLINE_RELAY_WINDOW): zero, the default, for none.
	RelayWindow time.Duration
	// RowFormat is how rows are written (EFFECTLINE_ROW_FORMAT).
	RowFormat store.RowFormat
	// KafkaPrincipals are the principals a direct intent may name; empty
	// means any.
	KafkaPrincipals []string
	// KafkaInstanceID is the static group membership id, or "".
	KafkaInstanceID string
	// Retention is the default dedup_window; TombstoneRetention zero keeps
	// tombstones forever.
	Retention          time.Duration
	TombstoneRetention time.Duration
	// PruneInterval is how often the pruner looks for work; zero for its
	// default (30s). No variable sets it: `effectline bench -retention`
	// shortens it so that a short soak prunes many times.
	PruneInterval time.Duration
}

func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		DatabaseURL: getenv(EnvDatabaseURL),
		ToolsFile:   getenv(EnvTools),
		HTTPAddr:    getenv(EnvHTTPAddr),
		APITokens:   getenv(EnvAPITokens),
		TopicPrefix: getenv(EnvTopicPrefix),
		LogLevel:    getenv(EnvLogLevel),
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = DefaultDatabaseURL
	}
	c.HTTPAddrSet = c.HTTPAddr != ""
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	c.KafkaBrokers = SplitList(getenv(EnvKafkaBrokers))
	c.Approvers = SplitList(getenv(EnvApprovers))
	c.Readers = SplitList(getenv(EnvReaders))
	c.KafkaPrincipals = SplitList(getenv(EnvKafkaPrincipals))
	c.KafkaInstanceID = strings.TrimSpace(getenv(EnvKafkaInstanceID))
	var errs []error
	if v := getenv(EnvKafkaPartitions); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", EnvKafkaPartitions, v))
		}
		c.Partitions = int32(n)
	}
	if v := getenv(EnvKafkaReplication); v != "" {
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", EnvKafkaReplication, v))
		}
		c.Replication = int16(n)
	}
	c.ShutdownGrace = DefaultShutdownGrace
	if v := getenv(EnvShutdownGrace); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration like 10s", EnvShutdownGrace, v))
		}
		c.ShutdownGrace = d
	}
	if v := getenv(EnvEmbeddedRetention); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration like 2m", EnvEmbeddedRetention, v))
		}
		c.EmbeddedRetention = d
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{EnvExecutorLease, &c.Lease}, {EnvSweepInterval, &c.SweepInterval},
		{EnvRetention, &c.Retention}, {EnvTombstoneRetention, &c.TombstoneRetention}} {
		if v := getenv(d.name); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a duration like 30s", d.name, v))
			}
			*d.dst = p
		}
	}
	if v := getenv(EnvCommitWindow); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Second {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration from 0 (no pacing) to 1s, like 4ms", EnvCommitWindow, v))
		}
		c.CommitWindow = d
		if d == 0 {
			c.CommitWindow = -1
		}
	}
	if v := getenv(EnvRelayWindow); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Second {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration from 0 (no pacing) to 1s, like 8ms", EnvRelayWindow, v))
		}
		c.RelayWindow = d
	}
	switch v := getenv(EnvRowFormat); v {
	case "", "compact":
		c.RowFormat = store.Compact
	case "plain":
		c.RowFormat = store.Plain
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want compact (the default) or plain (while a binary older than compact rows still runs)", EnvRowFormat, v))
	}
	if v := getenv(EnvInsecureOpenAPI); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvInsecureOpenAPI, v))
		}
		c.InsecureOpen = b
	}
	if c.Retention == 0 {
		c.Retention = pruner.DefaultRetention
	}
	return c, errors.Join(errs...)
}

// SplitList splits a comma-separated variable as the binary does: spaces
// trimmed, empty items dropped.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ParseComponents validates a --components list.
func ParseComponents(s string) ([]string, error) {
	list := SplitList(s)
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
