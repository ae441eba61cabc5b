// Package api holds effectline's published HTTP API description: the OpenAPI
// 3.1 document of every endpoint of contract §7, embedded so the server can
// serve the exact document it was built with at /v1/openapi.json.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document of the HTTP API, as JSON.
//
//go:embed openapi.json
var OpenAPI []byte
