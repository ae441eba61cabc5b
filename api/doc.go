// Package api is effectline's HTTP API (contract §7): intake of intents for
// services that cannot use the Go outbox, the operation record and its
// history, a page of operations from the read model, and the health, readiness,
// metrics and OpenAPI endpoints.
//
// # Reads and writes
//
// POST /v1/intents journals intent.recorded through the store's group
// committer, so concurrent requests share one transaction and one commit. The
// event store's one head row per operation key is the only deduplication: a
// second intent under a key loses the insert race, and the
// handler then loads the head record and answers from it (the stored result
// when completed, the current status otherwise, 409 when the args differ).
// Nothing is read before the write, so two racing requests can never both
// create the operation.
//
// GET /v1/operations/{key} reads the write-side head record, not the read
// model, so a client sees its own write at once. GET /v1/operations pages the
// read model (the projector's operation_state), which may lag the head by a
// moment; it is the only query that scans.
//
// # Security
//
// Every endpoint except /healthz, /readyz, /metrics and /v1/openapi.json
// needs a bearer token mapped to a principal (Config.Tokens); tokens are
// compared in constant time. Two are authenticated otherwise: webhooks by
// their Standard Webhooks signature, and the approval UI under /ui/ by its
// own cookie session with CSRF tokens (package api/ui). Tool args are redacted with the tool's own
// redaction before they leave in a response, and never appear in logs,
// errors or span attributes. Request bodies are bounded (Config.MaxBodyBytes)
// and must be application/json, which also keeps a browser from posting a
// "simple" cross-site form to a dev server running open on localhost.
//
// # Adding routes
//
// Other files of this package (decisions, webhooks, the mount of the
// approval UI of package api/ui) add their routes with [Server.Handle],
// naming the access level a route needs;
// the wrapper adds tracing, metrics, panic recovery, the request timeout and
// authentication, so a handler only reads [PrincipalFrom] and [IsApprover].
// Built-in routes are registered in registerRoutes (routes.go): a new file
// adds one line there calling its own registration method, e.g.
// s.decisionRoutes(). Every route must also be described in
// api/openapi.json, with every status code its tests observe: the tests
// fail otherwise (TestOpenAPIDocumentsEveryRoute, and TestMain for the
// status codes seen through fixture.do).
package api
