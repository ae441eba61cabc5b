// Package testenv is the shared harness for effectline's integration tests.
//
// effectline's correctness claims (exactly-once effects, reconciliation after
// an unknown outcome, compensation) only mean something against real
// infrastructure, so this package gives every test cheap, isolated instances
// of the three things the pipeline talks to:
//
//   - PostgreSQL: [NewDatabase] creates a fresh database per test on a real
//     server (see [DatabaseURL]) and drops it on cleanup, so tests can run in
//     parallel without sharing rows. [NewDatabaseFrom] copies a [Template]
//     database instead, built once per server and schema revision, so the
//     schema's migrations do not run again for every test; testenv
//     deliberately imports no other effectline package so that it can be used
//     by every package, including the store that owns the schema, and the
//     store's template lives in the storedb subpackage.
//   - Kafka: [NewBroker] starts an in-process Kafka-protocol cluster (kfake)
//     on 127.0.0.1 that both franz-go and sarama clients can use. Topic
//     auto-creation is off by default because the product provisions its own
//     topics and tests should catch it if it forgets to.
//   - Downstream tools: [NewFakeTool] starts an HTTP server modelling a
//     resource API that honours Idempotency-Key headers, answers reconcile
//     queries and accepts compensating releases, and that can be scripted to
//     fail in the ways real tools fail (lost responses, errors before or after
//     the effect, stalls).
//
// Every server listens on 127.0.0.1 only, and everything a helper starts is
// stopped by t.Cleanup. Helpers fail the test (t.Fatalf) rather than skip it
// when infrastructure is missing: a silently skipped integration test is
// worse than a loudly failing one.
package testenv
