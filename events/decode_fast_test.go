package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The fast decoders must be invisible: whenever they accept an input,
// strictUnmarshal accepts it too and decodes the very same value; whenever
// they decline, they leave their target zero for strictUnmarshal.

// fastDiffData fails t when fastDecodeData and strictUnmarshal disagree on
// b decoded as the data of type typ.
func fastDiffData(t testing.TB, typ Type, b []byte) {
	t.Helper()
	want := dataFor(typ)
	wantErr := strictUnmarshal(b, want)
	got := dataFor(typ)
	if !fastDecodeData(b, got) {
		if zero := dataFor(typ); !reflect.DeepEqual(got, zero) {
			t.Fatalf("fastDecodeData(%s, %q) declined but left %+v", typ, b, got)
		}
		return
	}
	if wantErr != nil {
		t.Fatalf("fastDecodeData(%s, %q) accepted what strictUnmarshal refuses: %v", typ, b, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fastDecodeData(%s, %q)\n got %#v\nwant %#v", typ, b, got, want)
	}
}

// fastDiffEnvelope is fastDiffData for an envelope, and checks Decode
// against decodeSlow, which never takes the envelope's fast path.
func fastDiffEnvelope(t testing.TB, b []byte) {
	t.Helper()
	var want wireEnvelope
	wantErr := strictUnmarshal(b, &want)
	var v Envelope
	if data, present, ok := fastDecodeEnvelope(b, &v); ok {
		if wantErr != nil {
			t.Fatalf("fastDecodeEnvelope(%q) accepted what strictUnmarshal refuses: %v", b, wantErr)
		}
		got := wireFrom(&v, present)
		got.Data = data
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fastDecodeEnvelope(%q)\n got %s\nwant %s", b, fastDump(got), fastDump(want))
		}
	}
	e, err := Decode(b)
	wantE, wantDecodeErr := decodeSlow(b)
	if len(b) > MaxEnvelopeBytes {
		return
	}
	if !reflect.DeepEqual(e, wantE) || (err == nil) != (wantDecodeErr == nil) ||
		(err != nil && err.Error() != wantDecodeErr.Error()) {
		t.Fatalf("Decode(%q) = %+v, %v\nwant %+v, %v", b, e, err, wantE, wantDecodeErr)
	}
}

func fastDump(w wireEnvelope) string {
	var b strings.Builder
	field := func(name string, p any) {
		v := reflect.ValueOf(p)
		if v.IsNil() {
			b.WriteString(name + ":nil ")
			return
		}
		b.WriteString(name + ":" + strings.TrimSpace(strings.ReplaceAll(fmtAny(v.Elem().Interface()), "\n", " ")) + " ")
	}
	field("event_id", w.EventID)
	field("type", w.Type)
	field("operation_key", w.OperationKey)
	field("seq", w.Seq)
	field("occurred_at", w.OccurredAt)
	field("tool", w.Tool)
	field("effect_class", w.EffectClass)
	field("attempt", w.Attempt)
	b.WriteString("data:" + string(w.Data))
	return b.String()
}

func fmtAny(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// fastSamples returns one fully populated value of every data type, so that
// every field is exercised.
func fastSamples() map[Type]any {
	at := time.Date(2026, 3, 14, 9, 26, 53, 589793000, time.UTC)
	later := at.Add(time.Minute).In(time.FixedZone("CET", 3600))
	return map[Type]any{
		IntentRecorded: &IntentData{Args: json.RawMessage(`{"amount":1299,"customer":{"id":"c_1","tags":["a"]}}`), Principal: "billing-agent",
			PayloadHash: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
		IntentRejected: &IntentRejectedData{Reason: "payload_conflict", PayloadHash: strings.Repeat("ab", 32),
			Principal: "billing-agent", EventID: "evt-1"},
		AttemptStarted: &AttemptStartedData{DownstreamKey: "k", Worker: "w-1", LeaseUntil: later, BackoffWaitedMS: 1830},
		AttemptSucceeded: &AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"r"}`),
			DownstreamID: "r", UndoRef: "u", Late: true, Precondition: json.RawMessage(`{"check":"precondition","verdict":"passed"}`)},
		AttemptFailed: &AttemptFailedData{Kind: Retryable, ErrorClass: "http_503", Error: `Post "http://x": EOF`,
			StatusCode: 503, RetryAt: &later, Late: true, Response: json.RawMessage(`{"error":"busy"}`),
			Precondition: json.RawMessage(`{"check":"check","verdict":"unchecked"}`)},
		AttemptUnknown: &AttemptUnknownData{ErrorClass: "timeout", Error: "deadline", StatusCode: 504,
			Next: NextRetry, RetryAt: &later, Late: true, Precondition: json.RawMessage(`{"check":"precondition","verdict":"passed"}`)},
		CompensationStarted:   &CompensationStartedData{DownstreamKey: "k", DownstreamID: "r", Worker: "w", LeaseUntil: at},
		CompensationSucceeded: &CompensationSucceededData{StatusCode: 200, RetryAt: &at},
		CompensationFailed:    &CompensationFailedData{Outcome: Unknown, ErrorClass: "c", Error: "e", StatusCode: 409},
		ReconciliationResolved: &ReconciliationResolvedData{Found: true, Result: json.RawMessage(`[1,2]`),
			DownstreamID: "d", Source: "reconcile", RetryAt: &at},
		OperationEscalated: &EscalationData{Reason: "r", Request: json.RawMessage(`{"a":1}`),
			Downstream: json.RawMessage(`{"status":503}`), ProposedAction: ActionRetry, Detail: "d", Approvers: 2},
		DecisionRecorded: &DecisionData{Action: ActionRetry, Note: "n", Approver: "alice", RetryAt: &at,
			DownstreamID: "d", Result: json.RawMessage(`{"id":"d"}`)},
	}
}

// TestFastDecodeKnowsEveryField: every field of every data type, and of the
// envelope, is read by the fast path; a name it missed would send every
// event with that field down the slow path.
func TestFastDecodeKnowsEveryField(t *testing.T) {
	t.Parallel()
	samples := fastSamples()
	for _, typ := range Types() {
		d, ok := samples[typ]
		if !ok {
			t.Fatalf("no sample of %s", typ)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) != len(jsonNames(d)) {
			t.Fatalf("the sample of %s does not set every field: %s", typ, b)
		}
		got := dataFor(typ)
		if !fastDecodeData(b, got) {
			t.Fatalf("fastDecodeData(%s) declined %s", typ, b)
		}
		fastDiffData(t, typ, b)

		e, err := New(typ, "k", 2, "tool", Compensable, 1, d, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var v Envelope
		if _, present, ok := fastDecodeEnvelope(raw, &v); !ok || present != 1<<8-1 {
			t.Fatalf("fastDecodeEnvelope declined %s (present %b)", raw, present)
		}
		fastDiffEnvelope(t, raw)
	}
}

// fastValues are JSON values of every kind an event field holds, and of
// the kinds it must not hold, spelled in the ways that trip decoders.
var fastValues = map[string][]string{
	"string": {`"x"`, `""`, `"billing-agent"`, `"é€😀"`, "\"\xff\xfe\"", "\"\xed\xa0\x80\"", `"a\"b"`, `"\u0061"`,
		`"\ud800"`, `"<&>"`, "\"\u2028\"", "\"a\tb\"", `"final"`, `"retryable"`, `"retry"`, `"unknown"`,
		`"attempt.started"`, `"intent.recorded"`, `"irreversible"`, `"compensable"`, `"record_success"`, `"abandon"`,
		`"FINAL"`, `"\/"`},
	"int": {`0`, `1`, `-1`, `-0`, `2`, `1.0`, `1e3`, `2.5`, `01`, `-`, `9223372036854775807`, `-9223372036854775808`,
		`9223372036854775808`, `123456789012345678`, `1234567890123456789`, `999999999999999999`, `"1"`, `1E2`},
	"bool": {`true`, `false`, `"true"`, `1`, `tru`, `falsey`},
	"time": {`"2026-03-14T09:26:53.589793Z"`, `"2026-03-14T10:26:53+01:00"`, `"0001-01-01T00:00:00Z"`,
		`"14/03/2026"`, `1773480413`, `"2026-02-30T00:00:00Z"`, `"\u0032026-03-14T09:26:53Z"`,
		`"9999-12-31T23:59:59.999999999-23:59"`, `"2026-03-14t09:26:53z"`, `"2026-03-14T09:26:53.Z"`,
		`"2026-03-14T09:26:53,5Z"`, `"2026-03-14T09:26:53+24:00"`, `""`, `"2026-03-14T09:26:53.1234567891Z"`},
	"raw": {`{}`, `[]`, `{"amount":1299,"currency":"EUR"}`, ` { "a" : [ 1 , 2 ] } `, `"s"`, `1`, `-0.5e-3`, `true`,
		`{"a":1,"a":2}`, `[1,]`, `{"a":"\ud800"}`, `{"a":1e400}`, `{"a":"\u00e9\n"}`, "{\"a\":\"\xff\"}", `[{}]`,
		`{"a":[{"b":{"c":null}}]}`, `{"a":01}`, `{"a" 1}`, `{,}`, `[1 2]`, `{"a":"\x"}`, `{"a":"\u12"}`,
		strings.Repeat("[", 300) + strings.Repeat("]", 300), strings.Repeat("[", 255) + strings.Repeat("]", 255)},
	"other": {`null`, `{}`, `[]`, `nul`, `"`, `{`, ``},
}

func abs(n int) int { return max(n, -n) }

// fastGood are valid values of the fields whose values are checked, so
// that enough random events pass validation.
var fastGood = map[string][]string{
	"kind":            {`"final"`, `"retryable"`},
	"next":            {`"retry"`, `"compensate"`, `"reconcile"`},
	"outcome":         {`"failed"`, `"unknown"`},
	"action":          {`"record_success"`, `"retry"`, `"abandon"`},
	"proposed_action": {`"compensate"`, `"retry"`},
	"effect_class":    {`"compensable"`, `"idempotent"`, `"irreversible"`},
	"args":            {`{"amount":1299,"currency":"EUR"}`, `{}`, `{"b":[1,2.50,"é"],"a":null}`, ` { "x" : 1 } `},
	"lease_until":     {`"2026-03-14T09:26:53.589793Z"`},
	"occurred_at":     {`"2026-03-14T10:26:53+01:00"`},
	"event_id":        {`"e-1"`},
	"operation_key":   {`"order-7731/charge"`, `"k\u00e9y \"q\""`},
	"tool":            {`"payments.charge"`},
	"principal":       {`"billing-agent"`},
	"reason":          {`"payload_conflict"`},
	"error_class":     {`"http_503"`},
	"downstream_key":  {`"k"`},
	"source":          {`"reconcile"`},
	"approver":        {`"alice"`},
}

// fastKind is the fastValues kind of a struct field's type.
func fastKind(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(json.RawMessage(nil)):
		return "raw"
	case t == reflect.TypeOf(time.Time{}), t == reflect.TypeOf(&time.Time{}):
		return "time"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int64:
		return "int"
	}
	panic("no kind for " + t.String())
}

// fastRandomObject writes a random object for a struct of type st: most
// fields with a value of their kind, some with any value, some missing,
// now and then an unknown, duplicate, miscased or escaped name, and random
// whitespace. fixed, when set, gives the raw value of named members.
func fastRandomObject(r *rand.Rand, st reflect.Type, fixed map[string]string) []byte {
	space := func(b []byte) []byte {
		if r.IntN(5) == 0 {
			b = append(b, " \t\n\r"[r.IntN(4)])
		}
		return b
	}
	pick := func(kind string) string {
		if r.IntN(12) == 0 {
			kinds := []string{"string", "int", "bool", "time", "raw", "other"}
			kind = kinds[r.IntN(len(kinds))]
		}
		vs := fastValues[kind]
		if r.IntN(6) > 0 { // mostly the first, valid, values
			return vs[r.IntN(min(3, len(vs)))]
		}
		return vs[r.IntN(len(vs))]
	}
	var b []byte
	b = space(b)
	b = append(b, '{')
	n := 0
	member := func(name, value string) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = space(b)
		b = append(b, name...)
		b = space(b)
		b = append(b, ':')
		b = space(b)
		b = append(b, value...)
		b = space(b)
	}
	// At most one odd name per object, so that most objects stay valid.
	odd, oddKind := -1, r.IntN(4)
	if r.IntN(4) == 0 {
		odd = r.IntN(st.NumField())
	}
	for i := range st.NumField() {
		f := st.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if r.IntN(12) == 0 {
			continue
		}
		value, ok := fixed[name]
		if !ok {
			value = pick(fastKind(f.Type))
			if good := fastGood[name]; good != nil && r.IntN(3) > 0 {
				value = good[r.IntN(len(good))]
			}
		}
		quoted := `"` + name + `"`
		switch oddKind + 4*min(1, abs(i-odd)) {
		case 0:
			quoted = `"` + strings.ToUpper(name) + `"`
		case 1:
			quoted = fmt.Sprintf(`"\u%04x%s"`, name[0], name[1:])
		case 2:
			member(quoted, pick(fastKind(f.Type))) // a duplicate
		case 3:
			member(`"extra"`, `1`)
		}
		member(quoted, value)
	}
	b = append(b, '}')
	return space(b)
}

var fastStructs = map[Type]reflect.Type{}

func init() {
	for _, typ := range Types() {
		fastStructs[typ] = reflect.TypeOf(dataFor(typ)).Elem()
	}
}

// fastRandomEvent returns a random data object of a random type and an
// envelope around it.
func fastRandomEvent(r *rand.Rand) (Type, []byte, []byte) {
	types := Types()
	typ := types[r.IntN(len(types))]
	data := fastRandomObject(r, fastStructs[typ], nil)
	seq := `2`
	if typ == IntentRecorded {
		seq = `1`
	}
	fixed := map[string]string{"data": string(data), "type": `"` + string(typ) + `"`, "seq": seq,
		"event_id": `"e-1"`, "attempt": `1`}
	if r.IntN(4) == 0 {
		fixed = map[string]string{"data": string(data)}
	}
	env := fastRandomObject(r, reflect.TypeOf(wireEnvelope{}), fixed)
	return typ, data, env
}

func TestFastDecodeMatchesStrictUnmarshal(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	n := 8000
	if testing.Short() {
		n = 800
	}
	accepted := 0
	for range n {
		typ, data, env := fastRandomEvent(r)
		fastDiffData(t, typ, data)
		fastDiffEnvelope(t, env)
		if _, err := Decode(env); err == nil {
			accepted++
		}
		for range 2 {
			fastDiffData(t, typ, canonMutate(r, data))
			fastDiffEnvelope(t, canonMutate(r, env))
		}
	}
	// The generator must reach valid events, or the comparison proves little.
	if accepted < n/50 {
		t.Fatalf("only %d of %d random events decode", accepted, n)
	}
}

func FuzzFastDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 100 {
		_, _, env := fastRandomEvent(r)
		f.Add(env)
	}
	for typ, d := range fastSamples() {
		e, err := New(typ, "k", 2, "tool", Compensable, 1, d, time.Now())
		if err != nil {
			f.Fatal(err)
		}
		b, err := json.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fastDiffEnvelope(t, b)
		// The same bytes as the data of every type, and the envelope's own
		// data if it has one.
		var m map[string]json.RawMessage
		_ = json.Unmarshal(b, &m)
		for _, typ := range Types() {
			fastDiffData(t, typ, b)
			if d := m["data"]; d != nil {
				fastDiffData(t, typ, bytes.TrimSpace(d))
			}
		}
	})
}
