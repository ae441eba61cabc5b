package tool

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRedactEcho(t *testing.T) {
	s := &Spec{Name: "payments.charge", ArgsSchema: json.RawMessage(`{"type":"object","properties":{
		"pan":{"type":"string","writeOnly":true},
		"pin":{"type":"integer","x-sensitive":true},
		"currency":{"type":"string"}}}`)}
	args := json.RawMessage(`{"pan":"4242424242424242","pin":12345,"api_key":"sk_live_abc","currency":"EUR","amount":100}`)
	body := json.RawMessage(`{"id":"ch_1","currency":"EUR","amount":100,
		"source":{"number":"4242424242424242","last4":"4242","code":12345},
		"request":{"pan":"4242424242424242","api_key":"sk_live_abc"},
		"note":"charged 4242424242424242 with key sk_live_abc",
		"sk_live_abc":true}`)
	got := string(s.RedactEcho(args, body))
	for _, secret := range []string{"4242424242424242", "sk_live_abc", "12345"} {
		if strings.Contains(got, secret) {
			t.Errorf("RedactEcho left %q in %s", secret, got)
		}
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(got), &doc); err != nil {
		t.Fatalf("RedactEcho returned invalid JSON %s: %v", got, err)
	}
	// What is not a sensitive value stays: the downstream's own fields, and
	// non-sensitive args it echoes (the currency, too short to look for
	// anyway; "4242" is shorter than a sensitive value and not one).
	if doc["id"] != "ch_1" || doc["currency"] != "EUR" || doc["amount"] != float64(100) {
		t.Errorf("RedactEcho changed innocent fields: %s", got)
	}
	if src := doc["source"].(map[string]any); src["last4"] != "4242" || src["number"] != Redacted || src["code"] != Redacted {
		t.Errorf("source = %v", src)
	}
	if doc["note"] != "charged [redacted] with key [redacted]" {
		t.Errorf("note = %q", doc["note"])
	}

	// No sensitive args: Redact alone.
	if got, want := string(s.RedactEcho(json.RawMessage(`{"currency":"EUR"}`), body)), string(s.Redact(body)); got != want {
		t.Errorf("RedactEcho without sensitive args = %s, want %s", got, want)
	}
	if got := s.RedactEcho(args, json.RawMessage(`{not json`)); string(got) != `"[redacted]"` {
		t.Errorf("RedactEcho(invalid body) = %s", got)
	}
	if got := s.RedactEcho(args, nil); len(got) != 0 {
		t.Errorf("RedactEcho(no body) = %s", got)
	}
}

// A document with nothing to redact keeps its bytes: member order, number
// spelling and spacing, so a client comparing a stored result sees the
// downstream's own answer.
func TestScrubKeepsTheBytesOfWhatHasNothingToHide(t *testing.T) {
	t.Parallel()
	args := json.RawMessage(`{"amount":700,"card_number":"4111111111111111"}`)
	for _, doc := range []string{
		`{"id":"ch_700", "amount":7.00e2}`,
		`{"z":1,"a":{"y":[3,2,1],"b":true}}`,
	} {
		if got := Scrub(nil, args, json.RawMessage(doc)); string(got) != doc {
			t.Errorf("Scrub(%s) = %s, want the same bytes", doc, got)
		}
	}
	echo := `{"id":"ch_700","source":{"number":"4111111111111111"}}`
	if got := string(Scrub(nil, args, json.RawMessage(echo))); got == echo || strings.Contains(got, "4111111111111111") {
		t.Errorf("Scrub(%s) = %s, want the echoed card number redacted", echo, got)
	}
}

// BenchmarkScrubNothingToHide: a result and args with no secret in them,
// as most are; the executor scrubs every result and the API every answer.
// Decoding both to find nothing was 21–25 µs and 107 allocations; the
// check of nothingToRedact is ~2 µs and none (session 17).
func BenchmarkScrubNothingToHide(b *testing.B) {
	s := &Spec{Name: "payments.charge", ArgsSchema: json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"},"currency":{"type":"string"}}}`)}
	args := json.RawMessage(`{"amount":1250,"currency":"EUR","customer":"cus_123","description":"order 42"}`)
	res := json.RawMessage(`{"id":"ch_3","status":"succeeded","amount":1250,"currency":"EUR","created":1733443200}`)
	for b.Loop() {
		if got := Scrub(s, args, res); len(got) != len(res) {
			b.Fatalf("Scrub changed %s to %s", res, got)
		}
	}
}
