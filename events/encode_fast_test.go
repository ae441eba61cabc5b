package events

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// refMarshal is marshal before its fast path: encoding/json without HTML
// escaping.
func refMarshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// fastDiffMarshal fails t when marshal and refMarshal disagree on v, or
// when the fast path accepts what encoding/json refuses.
func fastDiffMarshal(t testing.TB, v any) {
	t.Helper()
	want, wantErr := refMarshal(v)
	if fast, ok := fastMarshal(v); ok {
		if wantErr != nil {
			t.Fatalf("fastMarshal(%#v) = %s; encoding/json refuses it: %v", v, fast, wantErr)
		}
		if !bytes.Equal(fast, want) {
			t.Fatalf("fastMarshal(%#v)\n got %s\nwant %s", v, fast, want)
		}
	}
	got, err := marshal(v)
	if !bytes.Equal(got, want) || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("marshal(%#v) = %s, %v; want %s, %v", v, got, err, want, wantErr)
	}
}

var fastStringPieces = []string{
	"a", "Z", "0", " ", "~", "/", "<", ">", "&", "\x7f", "\"", "\\", "\b", "\f", "\n", "\r", "\t", "\x00", "\x01",
	"\x1f", "é", "€", "😀", "\u2028", "\u2029", "\ufffd", "\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80",
	"payments.charge", `Post "http://127.0.0.1:9000/charge": EOF`,
}

func fastRandomString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(6) {
		b.WriteString(fastStringPieces[r.IntN(len(fastStringPieces))])
	}
	return b.String()
}

var fastRawValues = []string{
	`{"amount":1299,"currency":"EUR"}`, `{}`, `[]`, `"s"`, `1`, `null`, ` { "a" : [ 1 , 2 ] , "b":"x y" } `,
	"\t[\n1,\r\"\\\" \"]\n", `{"a":"<&>\u2028"}`, "{\"a\":\"\u2028\xff\"}", `{"a":1,"a":2}`, `[1,]`, `{"a" 1}`,
	`{`, ``, ` `, `{"a":"\x"}`, strings.Repeat("[", 300) + strings.Repeat("]", 300), `{"a":1} x`, `1 2`,
}

func fastRandomTime(r *rand.Rand) time.Time {
	t := time.Unix(r.Int64N(1<<37)-1<<36, r.Int64N(1e9)) // years -200 to 4100
	switch r.IntN(6) {
	case 0:
		t = time.Date(r.IntN(3)*9999-1+r.IntN(3), 1, 1, 0, 0, 0, 0, time.UTC) // the edges of RFC 3339
	case 1:
		t = t.In(time.FixedZone("odd", r.IntN(200000)-100000))
	case 2:
		t = t.In(time.FixedZone("CET", 3600))
	case 3:
		t = t.Truncate(time.Second)
	}
	return t
}

// fastRandomValue sets every field of the struct v points to at random.
func fastRandomValue(r *rand.Rand, v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		if r.IntN(4) == 0 {
			continue // the zero value, for omitempty
		}
		switch f.Interface().(type) {
		case json.RawMessage:
			if r.IntN(8) > 0 {
				f.Set(reflect.ValueOf(json.RawMessage(fastRawValues[r.IntN(len(fastRawValues))])))
			}
		case time.Time:
			f.Set(reflect.ValueOf(fastRandomTime(r)))
		case *time.Time:
			t := fastRandomTime(r)
			f.Set(reflect.ValueOf(&t))
		case *EscalationData:
			var d EscalationData
			fastRandomValue(r, reflect.ValueOf(&d).Elem())
			f.Set(reflect.ValueOf(&d))
		case []string:
			list := make([]string, r.IntN(3))
			for i := range list {
				list[i] = fastRandomString(r)
			}
			f.Set(reflect.ValueOf(list))
		case *Failure:
			var d Failure
			fastRandomValue(r, reflect.ValueOf(&d).Elem())
			f.Set(reflect.ValueOf(&d))
		default:
			switch f.Kind() {
			case reflect.String:
				f.SetString(fastRandomString(r))
			case reflect.Int, reflect.Int64:
				f.SetInt(r.Int64N(1<<40) - 1<<39)
			case reflect.Bool:
				f.SetBool(r.IntN(2) == 0)
			default:
				panic("no random value for " + f.Type().String())
			}
		}
	}
}

func TestFastMarshalMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for typ, d := range fastSamples() {
		if _, ok := fastMarshal(d); !ok {
			t.Errorf("fastMarshal declined the sample of %s", typ)
		}
		fastDiffMarshal(t, d)
		fastDiffMarshal(t, reflect.ValueOf(d).Elem().Interface())
		e, err := New(typ, "k", 2, "tool", Compensable, 1, d, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := fastMarshal(e); !ok {
			t.Errorf("fastMarshal declined the envelope of %s", typ)
		}
		fastDiffMarshal(t, e)
		fastDiffMarshal(t, &e)
	}
	at := time.Date(2026, 11, 30, 7, 0, 0, 123456789, time.UTC)
	op := Operation{Key: "order-7/charge", Tool: "payments.charge", EffectClass: Irreversible, PayloadHash: "ab",
		Principal: "billing-agent", Args: json.RawMessage(`{"amount":1299}`), Status: StatusNeedsReconciliation,
		Phase: PhaseAttempt, Attempt: 2, LeaseUntil: &at, Result: json.RawMessage(`{"id":"ch_1"}`),
		Escalation:  &EscalationData{Reason: "unknown", Request: json.RawMessage(`{}`), ProposedAction: ActionRetry},
		LastFailure: &Failure{Kind: Final, StatusCode: 422, Response: json.RawMessage(`{"error":"too much"}`)},
		Seq:         5, LastOutcomeAt: &at, CreatedAt: at, UpdatedAt: at}
	if _, ok := fastMarshal(op); !ok {
		t.Error("fastMarshal declined an operation record")
	}
	fastDiffMarshal(t, op)
	for _, v := range []any{nil, 1, "s", (*IntentData)(nil), (*Envelope)(nil), (*Operation)(nil), map[string]int{"a": 1}, IntentData{}, Envelope{}, Operation{}} {
		fastDiffMarshal(t, v)
	}

	r := rand.New(rand.NewPCG(11, 12))
	n := 10000
	if testing.Short() {
		n = 1000
	}
	for range n {
		types := Types()
		d := dataFor(types[r.IntN(len(types))])
		fastRandomValue(r, reflect.ValueOf(d).Elem())
		fastDiffMarshal(t, d)
		fastDiffMarshal(t, reflect.ValueOf(d).Elem().Interface())
		var e Envelope
		fastRandomValue(r, reflect.ValueOf(&e).Elem())
		fastDiffMarshal(t, e)
		var op Operation
		fastRandomValue(r, reflect.ValueOf(&op).Elem())
		fastDiffMarshal(t, op)
		fastDiffMarshal(t, &op)
	}
}

func FuzzFastMarshal(f *testing.F) {
	f.Add("order-7731/charge", "unknown_outcome", `{"amount":1299}`, int64(3), int64(1773480413))
	f.Add("k\u2028\xff\"", "<&>\x00", " [ 1 , {\"a\" : \"b c\"} ] ", int64(0), int64(-62135596800))
	f.Add("", "", "", int64(-1), int64(253402300800))
	f.Fuzz(func(t *testing.T, s1, s2, raw string, n, sec int64) {
		at := time.Unix(sec, n%1e9).In(time.FixedZone("z", int(n%100000)))
		d := EscalationData{Reason: s1, Request: json.RawMessage(raw), Downstream: json.RawMessage(raw),
			ProposedAction: Action(s2), Detail: s2}
		fastDiffMarshal(t, d)
		fastDiffMarshal(t, AttemptFailedData{Kind: FailureKind(s1), ErrorClass: s2, Error: s1 + s2,
			StatusCode: int(n), RetryAt: &at, Late: n%2 == 0, Response: json.RawMessage(raw)})
		fastDiffMarshal(t, Envelope{EventID: s1, Type: Type(s2), OperationKey: s1, Seq: n, OccurredAt: at,
			Tool: s2, EffectClass: EffectClass(s1), Attempt: int(n), Data: json.RawMessage(raw)})
	})
}
