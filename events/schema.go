package events

import (
	"embed"
	"io/fs"
)

// The JSON Schemas (draft 2020-12) of the envelope and of each event type's
// data, for producers and consumers in any language (contract §4). Each file's
// $id is SchemaBaseURL + its file name; envelope.schema.json applies the
// per-type data schema by $ref to that $id, so a validator needs every file
// registered under its $id, not a network fetch.
//
//go:embed schema/*.json
var schemaFiles embed.FS

// SchemaBaseURL prefixes the $id of every schema file.
const SchemaBaseURL = "https://effectline.dev/schema/"

// EnvelopeSchema is the file name of the envelope schema, the one to
// validate an event against.
const EnvelopeSchema = "envelope.schema.json"

// Schemas returns every schema file by name (for example
// "envelope.schema.json", "attempt.succeeded.schema.json"). The map and its
// byte slices are fresh on every call, so callers may keep or change them.
func Schemas() map[string][]byte {
	entries, err := fs.ReadDir(schemaFiles, "schema")
	if err != nil {
		// The directory is embedded at build time; failing to read it is a
		// broken build, not a runtime condition.
		panic("events: reading embedded schemas: " + err.Error())
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := schemaFiles.ReadFile("schema/" + e.Name())
		if err != nil {
			panic("events: reading embedded schema " + e.Name() + ": " + err.Error())
		}
		out[e.Name()] = b
	}
	return out
}
