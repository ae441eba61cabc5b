package events

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestPublicIntent: the public copy carries redacted args and the recorded
// args' hash; it folds into a record with the true hash and no args.
func TestPublicIntent(t *testing.T) {
	t.Parallel()
	args := json.RawMessage(`{"amount":5,"card_number":"4111111111111111"}`)
	e, err := New(IntentRecorded, "k-1", 1, "payments.charge", Irreversible, 0, IntentData{Args: args, Principal: "p"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := PublicIntent(e, func(json.RawMessage) json.RawMessage {
		return json.RawMessage(`{"amount":5,"card_number":"[redacted]"}`)
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := Encode(pub)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("4111")) {
		t.Fatalf("the public copy carries the card number: %s", raw)
	}
	dec, err := Decode(raw)
	if err != nil {
		t.Fatalf("the public copy does not decode: %v", err)
	}
	want, _ := PayloadHash(args)
	op, err := Apply(Operation{}, dec)
	if err != nil {
		t.Fatal(err)
	}
	if op.PayloadHash != want || op.Args != nil || op.Principal != "p" {
		t.Fatalf("folded public copy = hash %s args %s, want hash %s and no args", op.PayloadHash, op.Args, want)
	}
	// Making a public copy of a public copy changes nothing.
	again, err := PublicIntent(dec, func(json.RawMessage) json.RawMessage { return json.RawMessage(`{}`) })
	if err != nil || !bytes.Equal(again.Data, dec.Data) {
		t.Fatalf("PublicIntent of a public copy = %s, %v", again.Data, err)
	}
	// A malformed hash is refused.
	bad := dec
	bad.Data = json.RawMessage(`{"args":{},"principal":"p","payload_hash":"xyz"}`)
	if b, err := Encode(bad); err == nil {
		if _, err := Decode(b); !IsInvalidEvent(err) {
			t.Fatalf("a malformed payload_hash: Decode = %v", err)
		}
	}
}
