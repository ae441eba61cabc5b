package events_test

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/effectline/effectline/events"
)

// compiledSchemas registers every embedded schema under its $id, as a
// consumer in another language would, and compiles them with formats
// asserted (date-time is only an annotation by default in 2020-12). It
// returns the compiled schemas by file name and the parsed documents.
func compiledSchemas(tb testing.TB) (map[string]*jsonschema.Schema, map[string]map[string]any) {
	tb.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	docs := map[string]map[string]any{}
	for name, b := range events.Schemas() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			tb.Fatalf("%s is not JSON: %v", name, err)
		}
		obj, ok := doc.(map[string]any)
		if !ok {
			tb.Fatalf("%s is not a JSON object", name)
		}
		id, _ := obj["$id"].(string)
		if id != events.SchemaBaseURL+name {
			tb.Fatalf("%s has $id %q; want %q", name, id, events.SchemaBaseURL+name)
		}
		if s := obj["$schema"]; s != "https://json-schema.org/draft/2020-12/schema" {
			tb.Fatalf("%s has $schema %v; want draft 2020-12", name, s)
		}
		if err := c.AddResource(id, doc); err != nil {
			tb.Fatalf("adding %s: %v", name, err)
		}
		docs[name] = obj
	}
	out := map[string]*jsonschema.Schema{}
	for name := range docs {
		sch, err := c.Compile(events.SchemaBaseURL + name)
		if err != nil {
			tb.Fatalf("compiling %s: %v", name, err)
		}
		out[name] = sch
	}
	return out, docs
}

func schemaFile(t events.Type) string { return string(t) + ".schema.json" }

func instance(tb testing.TB, b []byte) any {
	tb.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		tb.Fatalf("instance %s: %v", b, err)
	}
	return v
}

func TestSchemasAreEmbedded(t *testing.T) {
	t.Parallel()
	got := events.Schemas()
	want := []string{events.EnvelopeSchema}
	for _, typ := range events.Types() {
		want = append(want, schemaFile(typ))
	}
	want = append(want, "workflow.envelope.schema.json")
	for _, typ := range events.WorkflowTypes() {
		want = append(want, string(typ)+".schema.json")
	}
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("Schemas() files = %v; want %v", names, want)
	}
	// The map is the caller's: changing it does not change the package's.
	got[events.EnvelopeSchema][0] = 'X'
	delete(got, schemaFile(events.IntentRecorded))
	again := events.Schemas()
	if again[events.EnvelopeSchema][0] != '{' || again[schemaFile(events.IntentRecorded)] == nil {
		t.Errorf("Schemas() shares its storage with callers")
	}
}

// TestEmittedEventsMatchSchemas: every event the Go code can emit (one of
// every type and variant) validates against envelope.schema.json, whose
// per-type branches validate the data; and the data validates against the
// type's own schema too.
func TestEmittedEventsMatchSchemas(t *testing.T) {
	t.Parallel()
	schemas, _ := compiledSchemas(t)
	for _, ex := range exampleEvents(t) {
		t.Run(ex.name, func(t *testing.T) {
			t.Parallel()
			b := mustEncode(t, ex.env)
			if err := schemas[events.EnvelopeSchema].Validate(instance(t, b)); err != nil {
				t.Errorf("%s does not match the envelope schema: %v", b, err)
			}
			if err := schemas[schemaFile(ex.env.Type)].Validate(instance(t, ex.env.Data)); err != nil {
				t.Errorf("data %s does not match %s: %v", ex.env.Data, schemaFile(ex.env.Type), err)
			}
		})
	}
}

// TestEmittedHistoriesMatchSchemas runs the state machine's histories
// through the schema too: those are the events in the order the executor,
// reconciler and approval gate write them.
func TestEmittedHistoriesMatchSchemas(t *testing.T) {
	t.Parallel()
	schemas, _ := compiledSchemas(t)
	histories := map[string][]step{
		"escalated then decided": hist(hEscalated, []step{decisionStep(events.ActionRetry, &retryAt), rejectedStep()}),
		"compensated":            hCompensated,
		"undo failed":            hCompEscalated,
		"retried":                hist(hRunning2, []step{succeededStep(2), succeededStep(1)}),
		"reconciled":             hist(hNeedsRec, []step{resolvedStep(false, &retryAt)}),
	}
	for name, h := range histories {
		for i, s := range h {
			b := mustEncode(t, envAt(t, events.Compensable, int64(i+1), s))
			if err := schemas[events.EnvelopeSchema].Validate(instance(t, b)); err != nil {
				t.Errorf("%s, event %d: %s does not match: %v", name, i+1, b, err)
			}
		}
	}
}

// TestSchemaRejectsInvalidEvents: the schema refuses what Decode refuses,
// so a producer that validates against it is not surprised by effectline.
// Every case is checked against both.
func TestSchemaRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	schemas, _ := compiledSchemas(t)
	ex := encodedExamples(t)
	started, intent := ex["attempt started"], ex["intent"]
	tests := []struct {
		name string
		in   []byte
	}{
		{"missing event_id", edit(t, started, "event_id", del)},
		{"missing data", edit(t, started, "data", del)},
		{"missing occurred_at", edit(t, intent, "occurred_at", del)},
		{"empty tool", edit(t, started, "tool", `""`)},
		{"unknown type", edit(t, started, "type", `"attempt.exploded"`)},
		{"unknown effect class", edit(t, started, "effect_class", `"safe"`)},
		{"extra envelope field", edit(t, started, "traceparent", `"00-abc"`)},
		{"extra data field", editData(t, started, "lease", `"soon"`)},
		{"seq 0", edit(t, started, "seq", `0`)},
		{"seq a string", edit(t, started, "seq", `"2"`)},
		{"intent with seq 2", edit(t, intent, "seq", `2`)},
		{"non-intent with seq 1", edit(t, started, "seq", `1`)},
		{"attempt missing on attempt.started", edit(t, started, "attempt", del)},
		{"attempt 0", edit(t, started, "attempt", `0`)},
		{"occurred_at not a date-time", edit(t, started, "occurred_at", `"14/03/2026"`)},
		{"lease_until not a date-time", editData(t, started, "lease_until", `"soon"`)},
		{"data an array", edit(t, started, "data", `[]`)},
		{"data null", edit(t, started, "data", `null`)},
		{"data of another type", edit(t, started, "data", `{"kind":"final","error_class":"http_400"}`)},
		{"intent args an array", editData(t, intent, "args", `[1]`)},
		{"intent without principal", editData(t, intent, "principal", del)},
		{"failure of an unknown kind", editData(t, ex["attempt failed final"], "kind", `"transient"`)},
		{"unknown with an unknown next", editData(t, ex["attempt unknown reconcile"], "next", `"pray"`)},
		{"compensation failure that succeeded", editData(t, ex["compensation failed"], "outcome", `"succeeded"`)},
		{"reconciliation without source", editData(t, ex["reconciliation found"], "source", del)},
		{"escalation with an unknown action", editData(t, ex["escalated minimal"], "proposed_action", `"ignore"`)},
		{"decision with an unknown action", editData(t, ex["decision abandon"], "action", `"approve"`)},
		{"decision without approver", editData(t, ex["decision abandon"], "approver", `""`)},
		{"operation key of 513 characters", edit(t, started, "operation_key", `"`+strings.Repeat("k", 513)+`"`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := schemas[events.EnvelopeSchema].Validate(instance(t, tt.in)); err == nil {
				t.Errorf("the schema accepted %s", tt.in)
			}
			if _, err := events.Decode(tt.in); err == nil {
				t.Errorf("Decode accepted %s, which the schema refuses", tt.in)
			}
		})
	}
}

// TestSchemaValidEventsDecode: what a producer in another language writes
// by the schema alone, with only the required fields, is accepted by Decode.
func TestSchemaValidEventsDecode(t *testing.T) {
	t.Parallel()
	schemas, _ := compiledSchemas(t)
	env := func(typ events.Type, seq, attempt int, data string) []byte {
		a := ""
		if attempt > 0 {
			a = `"attempt":` + strconv.Itoa(attempt) + `,`
		}
		return []byte(`{"event_id":"e-1","type":"` + string(typ) + `","operation_key":"k","seq":` + strconv.Itoa(seq) +
			`,"occurred_at":"2026-03-14T09:26:53+01:00","tool":"t","effect_class":"compensable",` + a + `"data":` + data + `}`)
	}
	minimal := map[events.Type][]byte{
		events.IntentRecorded:         env(events.IntentRecorded, 1, 0, `{"args":{},"principal":"p"}`),
		events.IntentRejected:         env(events.IntentRejected, 2, 0, `{"reason":"payload_conflict"}`),
		events.AttemptStarted:         env(events.AttemptStarted, 2, 1, `{"downstream_key":"k","lease_until":"2026-03-14T09:27:53Z"}`),
		events.AttemptSucceeded:       env(events.AttemptSucceeded, 3, 1, `{}`),
		events.AttemptFailed:          env(events.AttemptFailed, 3, 1, `{"kind":"final","error_class":"http_400"}`),
		events.AttemptUnknown:         env(events.AttemptUnknown, 3, 1, `{"error_class":"timeout","next":"reconcile"}`),
		events.CompensationStarted:    env(events.CompensationStarted, 4, 1, `{"downstream_key":"k","lease_until":"2026-01-01T00:00:00Z"}`),
		events.CompensationSucceeded:  env(events.CompensationSucceeded, 5, 1, `{}`),
		events.CompensationFailed:     env(events.CompensationFailed, 5, 1, `{"outcome":"unknown"}`),
		events.ReconciliationResolved: env(events.ReconciliationResolved, 4, 0, `{"source":"reconcile"}`),
		events.OperationEscalated:     env(events.OperationEscalated, 4, 0, `{"reason":"r","proposed_action":"abandon"}`),
		events.DecisionRecorded:       env(events.DecisionRecorded, 5, 0, `{"action":"abandon","approver":"a"}`),
	}
	for _, typ := range events.Types() {
		b, ok := minimal[typ]
		if !ok {
			t.Errorf("no minimal %s", typ)
			continue
		}
		if err := schemas[events.EnvelopeSchema].Validate(instance(t, b)); err != nil {
			t.Errorf("minimal %s does not match the schema: %v", typ, err)
		}
		if _, err := events.Decode(b); err != nil {
			t.Errorf("minimal %s matches the schema but Decode refuses it: %v", typ, err)
		}
	}
}

// TestSchemasMatchGoStructs keeps the schemas and the Go shapes from
// drifting apart: the same property names (json tags), the required fields
// decode.go enforces, and the same enums as the vocabulary.
func TestSchemasMatchGoStructs(t *testing.T) {
	t.Parallel()
	_, docs := compiledSchemas(t)
	shapes := map[events.Type]any{
		events.IntentRecorded: events.IntentData{}, events.IntentRejected: events.IntentRejectedData{},
		events.AttemptStarted: events.AttemptStartedData{}, events.AttemptSucceeded: events.AttemptSucceededData{},
		events.AttemptFailed: events.AttemptFailedData{}, events.AttemptUnknown: events.AttemptUnknownData{},
		events.CompensationStarted: events.CompensationStartedData{}, events.CompensationSucceeded: events.CompensationSucceededData{},
		events.CompensationFailed: events.CompensationFailedData{}, events.ReconciliationResolved: events.ReconciliationResolvedData{},
		events.OperationEscalated: events.EscalationData{}, events.DecisionRecorded: events.DecisionData{},
	}
	// What decode.go's validateData requires of each type's data.
	required := map[events.Type][]string{
		events.IntentRecorded:         {"args", "principal"},
		events.IntentRejected:         {"reason"},
		events.AttemptStarted:         {"downstream_key", "lease_until"},
		events.AttemptSucceeded:       nil,
		events.AttemptFailed:          {"error_class", "kind"},
		events.AttemptUnknown:         {"error_class", "next"},
		events.CompensationStarted:    {"downstream_key", "lease_until"},
		events.CompensationSucceeded:  nil,
		events.CompensationFailed:     {"outcome"},
		events.ReconciliationResolved: {"source"},
		events.OperationEscalated:     {"proposed_action", "reason"},
		events.DecisionRecorded:       {"action", "approver"},
	}
	for _, typ := range events.Types() {
		doc := docs[schemaFile(typ)]
		if doc == nil {
			t.Errorf("no schema for %s", typ)
			continue
		}
		if got, want := propertyNames(doc), jsonFields(shapes[typ]); !slices.Equal(got, want) {
			t.Errorf("%s properties %v; Go fields %v", typ, got, want)
		}
		if got := stringList(doc["required"]); !slices.Equal(got, required[typ]) {
			t.Errorf("%s required %v; decode.go requires %v", typ, got, required[typ])
		}
		if doc["additionalProperties"] != false || doc["type"] != "object" {
			t.Errorf("%s must be an object with additionalProperties false", typ)
		}
	}
	env := docs[events.EnvelopeSchema]
	if got, want := propertyNames(env), jsonFields(events.Envelope{}); !slices.Equal(got, want) {
		t.Errorf("envelope properties %v; Go fields %v", got, want)
	}
	if env["additionalProperties"] != false {
		t.Errorf("envelope must have additionalProperties false")
	}
	props := func(doc map[string]any) map[string]any { return doc["properties"].(map[string]any) }
	enum := func(doc map[string]any, field string) []string {
		p, _ := props(doc)[field].(map[string]any)
		return stringList(p["enum"])
	}
	strs := func(vs ...any) []string {
		var out []string
		for _, v := range vs {
			out = append(out, reflect.ValueOf(v).String())
		}
		sort.Strings(out)
		return out
	}
	var types, classes, actions []any
	for _, v := range events.Types() {
		types = append(types, v)
	}
	for _, v := range events.EffectClasses() {
		classes = append(classes, v)
	}
	for _, v := range events.Actions() {
		actions = append(actions, v)
	}
	enums := []struct {
		file, field string
		want        []string
	}{
		{events.EnvelopeSchema, "type", strs(types...)},
		{events.EnvelopeSchema, "effect_class", strs(classes...)},
		{schemaFile(events.AttemptFailed), "kind", strs(events.Retryable, events.Final)},
		{schemaFile(events.AttemptUnknown), "next", strs(events.NextRetry, events.NextCompensate, events.NextReconcile)},
		{schemaFile(events.CompensationFailed), "outcome", strs(events.Failed, events.Unknown)},
		{schemaFile(events.OperationEscalated), "proposed_action", strs(actions...)},
		{schemaFile(events.DecisionRecorded), "action", strs(actions...)},
	}
	for _, e := range enums {
		if got := enum(docs[e.file], e.field); !slices.Equal(got, e.want) {
			t.Errorf("%s %s enum %v; want %v", e.file, e.field, got, e.want)
		}
	}
	// One if/then branch per type, each pointing at that type's schema.
	branches, _ := env["allOf"].([]any)
	refs := map[string]string{}
	for _, b := range branches {
		br := b.(map[string]any)
		typ := br["if"].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["const"].(string)
		ref := br["then"].(map[string]any)["properties"].(map[string]any)["data"].(map[string]any)["$ref"].(string)
		refs[typ] = ref
	}
	for _, typ := range events.Types() {
		if want := events.SchemaBaseURL + schemaFile(typ); refs[string(typ)] != want {
			t.Errorf("envelope applies %q to %s data; want %q", refs[string(typ)], typ, want)
		}
	}
	if len(refs) != len(events.Types()) {
		t.Errorf("envelope has %d type branches; want %d", len(refs), len(events.Types()))
	}
}

func propertyNames(doc map[string]any) []string {
	p, _ := doc["properties"].(map[string]any)
	out := make([]string, 0, len(p))
	for k := range p {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func stringList(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// jsonFields lists the JSON names encoding/json uses for v's fields.
func jsonFields(v any) []string {
	rt := reflect.TypeOf(v)
	var out []string
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// The schema documents are plain JSON for any language: no Go-only
// encodings slipped in.
func TestSchemasAreStrictJSON(t *testing.T) {
	t.Parallel()
	for name, b := range events.Schemas() {
		dec := json.NewDecoder(bytes.NewReader(b))
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%s is not a JSON object: %v", name, err)
		}
		if _, err := dec.Token(); err != io.EOF {
			t.Errorf("%s has data after its object", name)
		}
		if !bytes.HasSuffix(b, []byte("}\n")) {
			t.Errorf("%s does not end with a newline", name)
		}
	}
}
