package events

import (
	"encoding/json"
	"fmt"
)

// PublicIntent returns the copy of an intent.recorded event that may be
// published outside the intents topic: the same envelope, with args
// replaced by redact(args) and the payload hash of the recorded args in
// data.payload_hash. Only the intents topic carries args whole, because the
// executor needs them; consumers of outcomes (the projector, analytics,
// other teams) get the redacted copy, and folding it (Apply) gives the true
// payload hash and a record without args.
//
// Other events are returned unchanged, as is a copy already public.
func PublicIntent(e Envelope, redact func(args json.RawMessage) json.RawMessage) (Envelope, error) {
	if e.Type != IntentRecorded {
		return e, nil
	}
	var hash string
	d, err := e.decodeData(&hash)
	if err != nil {
		return e, err
	}
	in := d.(*IntentData)
	if in.PayloadHash != "" {
		return e, nil
	}
	args := redact(in.Args)
	if len(args) == 0 || args[0] != '{' {
		// The copy must stay a valid intent.recorded: args are an object.
		args = json.RawMessage(`{}`)
	}
	data, err := marshal(IntentData{Args: args, Principal: in.Principal, PayloadHash: hash})
	if err != nil {
		return e, fmt.Errorf("public copy of the intent of %s: %w", e.OperationKey, err)
	}
	e.Data = data
	return e, nil
}

// isPayloadHash reports whether s has the shape PayloadHash returns.
func isPayloadHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
