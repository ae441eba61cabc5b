package main

import "github.com/effectline/effectline/cmd/effectline/app"

// The environment variables the end-to-end tests set on the binary, under
// the short names the tests were written with; the binary's names are
// package app's.
const (
	envDatabaseURL        = app.EnvDatabaseURL
	envKafkaBrokers       = app.EnvKafkaBrokers
	envTools              = app.EnvTools
	envHTTPAddr           = app.EnvHTTPAddr
	envAPITokens          = app.EnvAPITokens
	envApprovers          = app.EnvApprovers
	envKafkaPartitions    = app.EnvKafkaPartitions
	envLogLevel           = app.EnvLogLevel
	envShutdownGrace      = app.EnvShutdownGrace
	envInsecureOpenAPI    = app.EnvInsecureOpenAPI
	envExecutorLease      = app.EnvExecutorLease
	envSweepInterval      = app.EnvSweepInterval
	envReaders            = app.EnvReaders
	envKafkaPrincipals    = app.EnvKafkaPrincipals
	envKafkaInstanceID    = app.EnvKafkaInstanceID
	envRetention          = app.EnvRetention
	envTombstoneRetention = app.EnvTombstoneRetention
)

// envCrashPoint is read only by a binary built with -tags crashpoints
// (crashBinary).
const envCrashPoint = "EFFECTLINE_CRASHPOINT"
