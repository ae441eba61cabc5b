package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
)

// FuzzDecode holds Decode to its promise: it never panics, it either
// returns a complete valid envelope or a *DecodeError (and then nothing
// else), and what it accepts survives Encode and decodes to the same event,
// so a consumer can always re-publish what it consumed.
func FuzzDecode(f *testing.F) {
	for _, ex := range exampleEvents(f) {
		f.Add(mustEncode(f, ex.env))
	}
	ex := encodedExamples(f)
	started, intent := ex["attempt started"], ex["intent"]
	for _, b := range [][]byte{
		nil,
		[]byte(`null`),
		[]byte(`{}`),
		[]byte(`[]`),
		[]byte(`{"event_id":1}`),
		[]byte(`{"data":{"args":[]}}`),
		edit(f, started, "seq", `1`),
		edit(f, started, "seq", `-9223372036854775808`),
		edit(f, started, "attempt", del),
		edit(f, started, "attempt", `1e3`),
		edit(f, started, "occurred_at", `"0001-01-01T00:00:00Z"`),
		edit(f, started, "occurred_at", `"9999-12-31T23:59:59.999999999-23:59"`),
		edit(f, started, "effect_class", `"safe"`),
		edit(f, started, "data", `null`),
		edit(f, started, "extra", `{}`),
		editData(f, started, "lease_until", `"2026-02-30T00:00:00Z"`),
		editData(f, intent, "args", `[{}]`),
		editData(f, intent, "args", `{"a":"\ud800","b":1e400,"c":"<&>\u2028"}`),
		editData(f, ex["decision abandon"], "action", `"approve"`),
		append(bytes.Clone(started), '}'),
		append(bytes.Clone(started), " {}"...),
		bytes.Replace(started, []byte(`"seq"`), []byte(`"Seq"`), 1),
		[]byte(strings.Repeat(`[`, 20000)),
		[]byte("{\"event_id\":\"\xff\xfe\"}"),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := events.Decode(b)
		if err != nil {
			var de *events.DecodeError
			if !errors.As(err, &de) || !errors.Is(err, events.ErrInvalidEvent) || !events.IsInvalidEvent(err) {
				t.Fatalf("Decode error %v (%T) is not a *DecodeError", err, err)
			}
			if !reflect.DeepEqual(e, events.Envelope{}) {
				t.Fatalf("Decode returned %+v with its error", e)
			}
			return
		}
		switch {
		case len(b) > events.MaxEnvelopeBytes:
			t.Fatalf("accepted %d bytes", len(b))
		case e.EventID == "" || e.Tool == "" || e.OperationKey == "" || len(e.OperationKey) > events.MaxOperationKeyBytes:
			t.Fatalf("accepted an envelope with an empty or oversize identity: %+v", e)
		case !e.Type.Valid() || !e.EffectClass.Valid() || e.Seq < 1 || e.OccurredAt.IsZero():
			t.Fatalf("accepted an invalid envelope: %+v", e)
		case (e.Seq == 1) != (e.Type == events.IntentRecorded):
			t.Fatalf("accepted %s with seq %d", e.Type, e.Seq)
		case e.Type.HasAttempt() && e.Attempt < 1:
			t.Fatalf("accepted %s without an attempt", e.Type)
		}
		if _, err := e.DecodeData(); err != nil {
			t.Fatalf("Decode accepted data that DecodeData refuses: %v", err)
		}
		out, err := events.Encode(e)
		if err != nil {
			t.Fatalf("Decode accepted %q but Encode refuses it: %v", b, err)
		}
		e2, err := events.Decode(out)
		if err != nil {
			t.Fatalf("Encode wrote %q, which Decode refuses: %v", out, err)
		}
		if !sameEvent(e, e2) {
			t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", e2, e)
		}
		// After one round the bytes are canonical for Encode.
		if out2, err := events.Encode(e2); err != nil || !bytes.Equal(out2, out) {
			t.Fatalf("Encode is not a fixed point: %q then %q (%v)", out, out2, err)
		}
	})
}

// sameEvent compares envelopes as events: times as instants (a decoded
// offset gets a fresh *time.Location), data as JSON values (Encode compacts
// and escapes data, which changes bytes but not meaning).
func sameEvent(a, b events.Envelope) bool {
	if !a.OccurredAt.Equal(b.OccurredAt) || !sameJSON(a.Data, b.Data) {
		return false
	}
	a.OccurredAt, a.Data = b.OccurredAt, b.Data
	return reflect.DeepEqual(a, b)
}

func sameJSON(a, b []byte) bool {
	va, errA := decodeJSON(a)
	vb, errB := decodeJSON(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // compare numbers by their text, not as float64
	var v any
	err := dec.Decode(&v)
	return v, err
}
