package events

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

func TestCheckOperationKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		key  string
		ok   bool
	}{
		{"plain", "order-7/charge", true},
		{"unicode", "commande-é/支付", true},
		{"512 bytes", strings.Repeat("k", MaxOperationKeyBytes), true},
		{"replacement character as sent", "a\uFFFDb", true},
		{"empty", "", false},
		{"513 bytes", strings.Repeat("k", MaxOperationKeyBytes+1), false},
		{"invalid UTF-8", "a\xffb", false},
		{"truncated rune", "a\xe2\x82", false},
		{"NUL", "a\x00b", false},
		{"newline", "a\nb", false},
		{"carriage return", "a\rb", false},
		{"tab", "a\tb", false},
		{"DEL", "a\x7fb", false},
		{"C1 control", "a\u0085b", false},
	} {
		err := CheckOperationKey(c.key)
		if (err == nil) != c.ok {
			t.Errorf("%s: CheckOperationKey = %v, want ok %v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidOperationKey) {
			t.Errorf("%s: %v does not wrap ErrInvalidOperationKey", c.name, err)
		}
		if err != nil && c.key != "" && strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: the error quotes the key: %v", c.name, err)
		}
	}
}

// TestDecodeRefusesInvalidKeys: the decoder applies the same rule, also to
// bytes that encoding/json would have rewritten to U+FFFD.
func TestDecodeRefusesInvalidKeys(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a\nb", "a\x00b", strings.Repeat("k", MaxOperationKeyBytes+1), "a\x7fb"} {
		e, err := New(IntentRecorded, key, 1, "tool", Idempotent, 0, IntentData{Args: []byte(`{}`), Principal: "p"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, err := Encode(e)
		if err == nil {
			if _, err := Decode(b); !IsInvalidEvent(err) {
				t.Errorf("key %q: Decode = %v, want an invalid event", key, err)
			}
		}
	}
	raw := []byte(`{"event_id":"e1","type":"intent.recorded","operation_key":"a` + "\xff" + `b","seq":1,` +
		`"occurred_at":"2026-01-01T00:00:00Z","tool":"t","effect_class":"idempotent","data":{"args":{},"principal":"p"}}`)
	if _, err := Decode(raw); !IsInvalidEvent(err) {
		t.Errorf("a key of invalid UTF-8: Decode = %v, want an invalid event", err)
	}
}

// FuzzOperationKey: CheckOperationKey accepts exactly the keys of the rule,
// and the decoder agrees with it on every key that survives encoding.
func FuzzOperationKey(f *testing.F) {
	for _, s := range []string{"k", "", "a\nb", "a\x00", "\xff", "é", strings.Repeat("x", 513), "a\u2028b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := key != "" && len(key) <= MaxOperationKeyBytes && utf8.ValidString(key)
		if want {
			for _, r := range key {
				want = want && !unicode.IsControl(r)
			}
		}
		err := CheckOperationKey(key)
		if (err == nil) != want {
			t.Fatalf("CheckOperationKey(%q) = %v, want ok %v", key, err, want)
		}
		e := Envelope{EventID: "e1", Type: IntentRecorded, OperationKey: key, Seq: 1, OccurredAt: time.Unix(1, 0).UTC(),
			Tool: "t", EffectClass: Idempotent, Data: []byte(`{"args":{},"principal":"p"}`)}
		b, encErr := Encode(e)
		if encErr != nil {
			return
		}
		got, decErr := Decode(b)
		if want && decErr != nil {
			t.Fatalf("a valid key %q was refused by the decoder: %v", key, decErr)
		}
		if !want && decErr == nil && got.OperationKey == key {
			t.Fatalf("an invalid key %q passed the decoder", key)
		}
		if decErr == nil && CheckOperationKey(got.OperationKey) != nil {
			t.Fatalf("the decoder returned a key the rule refuses: %q", got.OperationKey)
		}
	})
}
