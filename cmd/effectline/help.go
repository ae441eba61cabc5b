package main

import "github.com/effectline/effectline/cmd/effectline/app"

// commandHelp is what `effectline COMMAND --help` says beside the flags:
// what the command does and the environment variables it reads.
var commandHelp = map[string]struct {
	summary string
	env     []string
}{
	"dev": {
		summary: `Runs every component (relay, executor, projector, reconciler, workflow, API and
approval UI) in one process, on an embedded Kafka-protocol broker unless
EFFECTLINE_KAFKA_BROKERS names a real one. The database schema is applied on
start. --demo starts three demo services with realistic faults and places one
order; the same --order-id on the same database resumes that order.`,
		env: []string{
			app.EnvDatabaseURL, app.EnvKafkaBrokers, app.EnvTools, app.EnvHTTPAddr,
			app.EnvAPITokens, app.EnvApprovers, app.EnvReaders, app.EnvTopicPrefix,
			app.EnvKafkaPartitions, app.EnvLogLevel, app.EnvShutdownGrace,
			app.EnvExecutorLease, app.EnvSweepInterval, app.EnvCommitWindow, app.EnvRelayWindow,
			app.EnvKafkaPrincipals, app.EnvRetention, app.EnvTombstoneRetention,
			app.EnvEmbeddedRetention, app.EnvRowFormat, envOTEL,
		},
	},
	"run": {
		summary: `Runs the named components, for production: relay, executor, projector,
reconciler, workflow, api. Run "effectline migrate" first. The API refuses to
start without EFFECTLINE_API_TOKENS unless --insecure-open is given.`,
		env: []string{
			app.EnvDatabaseURL, app.EnvKafkaBrokers, app.EnvTools, app.EnvHTTPAddr,
			app.EnvAPITokens, app.EnvApprovers, app.EnvReaders, app.EnvInsecureOpenAPI,
			app.EnvTopicPrefix, app.EnvKafkaPartitions, app.EnvKafkaReplication,
			app.EnvKafkaInstanceID, app.EnvKafkaPrincipals, app.EnvLogLevel,
			app.EnvShutdownGrace, app.EnvExecutorLease, app.EnvSweepInterval,
			app.EnvCommitWindow, app.EnvRelayWindow, app.EnvRetention, app.EnvTombstoneRetention, app.EnvRowFormat, envOTEL,
		},
	},
	"migrate": {
		summary: "Applies the database schema (the embedded migrations not yet applied) and exits.",
		env:     []string{app.EnvDatabaseURL},
	},
	"projector rebuild": {
		summary: "Rebuilds the operation_state read model from the event store and exits.",
		env:     []string{app.EnvDatabaseURL},
	},
	"prune": {
		summary: `Prunes settled operations past their tool's dedup_window to tombstones, and
expires tombstones past EFFECTLINE_TOMBSTONE_RETENTION, once, now.`,
		env: []string{app.EnvDatabaseURL, app.EnvTools, app.EnvRetention, app.EnvTombstoneRetention},
	},
	"bench": {
		summary: `Drives intents through the whole pipeline (on a database of its own, removed
afterwards unless -keep) and reports throughput and latency.`,
		env: []string{app.EnvDatabaseURL, app.EnvKafkaBrokers, app.EnvKafkaPartitions, app.EnvCommitWindow, app.EnvLogLevel},
	},
}

// envOTEL stands for the standard OpenTelemetry variables in the help.
const envOTEL = "OTEL_*"

// envHelp says in one line what each variable holds and its default.
var envHelp = map[string]string{
	app.EnvDatabaseURL:        "PostgreSQL URL (default " + app.DefaultDatabaseURL + ")",
	app.EnvKafkaBrokers:       "Kafka bootstrap brokers, comma-separated (dev: unset runs an embedded broker)",
	app.EnvTools:              "path of the tools file (docs/tools-file.md)",
	app.EnvHTTPAddr:           "address of the API, UI and /metrics (default " + app.DefaultHTTPAddr + ")",
	app.EnvAPITokens:          "principal=token,… (tokens of at least 16 characters; dev: unset is open)",
	app.EnvApprovers:          "principals who may decide escalated operations, comma-separated",
	app.EnvReaders:            "principals who read every operation, comma-separated",
	app.EnvInsecureOpenAPI:    "true serves the API without tokens, like --insecure-open",
	app.EnvTopicPrefix:        "prefix of every topic name (default none)",
	app.EnvKafkaPartitions:    "partitions of the topics effectline creates",
	app.EnvKafkaReplication:   "replication factor of the topics effectline creates",
	app.EnvKafkaInstanceID:    "stable, unique id per replica for static consumer-group membership",
	app.EnvKafkaPrincipals:    "principals an intent produced straight to Kafka may name (unset: any)",
	app.EnvLogLevel:           "debug, info, warn or error (dev: warn, the terminal shows the timeline)",
	app.EnvShutdownGrace:      "how long a shutdown may take (default 10s)",
	app.EnvExecutorLease:      "how long an executor's claim holds without a heartbeat",
	app.EnvSweepInterval:      "how often the reconciler sweeps expired leases",
	app.EnvCommitWindow:       "the journal committer's pacing window, 0 to 1s (0: none)",
	app.EnvRelayWindow:        "the relay's pacing window, 0 to 1s (0, the default: none)",
	app.EnvRowFormat:          "compact (default) or plain: rows an older binary can read, while one still runs",
	app.EnvRetention:          "dedup_window of tools that name none (default 720h)",
	app.EnvTombstoneRetention: "how long a pruned operation's tombstone is kept (default forever)",
	app.EnvEmbeddedRetention:  "how long the embedded broker keeps a message every live consumer group has read (default 2m)",
	envOTEL:                   "the standard OpenTelemetry variables; traces are exported only when an endpoint is set",
}
