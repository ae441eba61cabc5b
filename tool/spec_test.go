package tool

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
)

const chargeSchema = `{
  "type": "object",
  "required": ["amount", "currency"],
  "additionalProperties": false,
  "properties": {
    "amount": {"type": "integer", "minimum": 1},
    "currency": {"type": "string", "enum": ["EUR", "USD"]},
    "card": {"type": "string", "writeOnly": true},
    "cvv2": {"type": "string", "x-sensitive": true},
    "lines": {"type": "array", "items": {"type": "object", "required": ["sku"],
      "properties": {"sku": {"type": "string"}, "pin": {"type": "string", "writeOnly": true}}}},
    "meta/data": {"type": "object", "properties": {"n": {"type": "integer"}}}
  }
}`

func chargeSpec(t *testing.T) *Spec {
	t.Helper()
	s := &Spec{Name: "payments.charge", Effect: events.Irreversible, ArgsSchema: json.RawMessage(chargeSchema),
		AllowedPrincipals: []string{"billing-agent"}}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidateArgs(t *testing.T) {
	t.Parallel()
	s := chargeSpec(t)
	tests := []struct {
		name  string
		args  string
		field string // "" with ok=true means valid
		ok    bool
	}{
		{"valid", `{"amount": 5, "currency": "EUR"}`, "", true},
		{"below minimum", `{"amount": 0, "currency": "EUR"}`, "/amount", false},
		{"wrong type", `{"amount": "5", "currency": "EUR"}`, "/amount", false},
		{"not in enum", `{"amount": 5, "currency": "GBP"}`, "/currency", false},
		{"missing", `{"amount": 5}`, "/currency", false},
		{"extra", `{"amount": 5, "currency": "EUR", "tip": 1}`, "/tip", false},
		{"nested in array", `{"amount": 5, "currency": "EUR", "lines": [{"sku": "a"}, {"sku": 7}]}`, "/lines/1/sku", false},
		{"missing nested", `{"amount": 5, "currency": "EUR", "lines": [{}]}`, "/lines/0/sku", false},
		{"pointer escaping", `{"amount": 5, "currency": "EUR", "meta/data": {"n": "x"}}`, "/meta~1data/n", false},
		{"array", `[1, 2]`, "", false},
		{"string", `"hello"`, "", false},
		{"not json", `{amount: 5}`, "", false},
		{"several errors: the first field wins", `{"currency": "GBP", "amount": 0, "zeta": 1}`, "/amount", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := s.ValidateArgs(json.RawMessage(tt.args))
			if tt.ok {
				if err != nil {
					t.Fatalf("ValidateArgs(%s) = %v", tt.args, err)
				}
				return
			}
			var ae *ArgsError
			if !errors.As(err, &ae) || !errors.Is(err, ErrInvalidArgs) || !IsArgsError(err) {
				t.Fatalf("ValidateArgs(%s) = %v, want an *ArgsError", tt.args, err)
			}
			if ae.Field != tt.field || ae.Reason == "" || ae.Tool != "payments.charge" {
				t.Fatalf("ValidateArgs(%s): field %q reason %q, want field %q", tt.args, ae.Field, ae.Reason, tt.field)
			}
			t.Logf("%s", err)
		})
	}
}

func TestValidateArgsWithoutSchema(t *testing.T) {
	t.Parallel()
	s := &Spec{Name: "free", Effect: events.Idempotent}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{`{}`, `{"anything": [1, {"x": null}]}`, ``} {
		if err := s.ValidateArgs(json.RawMessage(ok)); err != nil {
			t.Errorf("ValidateArgs(%q) = %v", ok, err)
		}
	}
	if err := s.ValidateArgs(json.RawMessage(`[]`)); !IsArgsError(err) {
		t.Errorf("an array passed: %v", err)
	}
	for _, bad := range []string{`{"a":`, `{} {}`, `nul`} {
		var ae *ArgsError
		if err := s.ValidateArgs(json.RawMessage(bad)); !errors.As(err, &ae) || !strings.HasPrefix(ae.Reason, "not valid JSON: ") {
			t.Errorf("ValidateArgs(%q) = %v, want not valid JSON with the decoder's reason", bad, err)
		}
	}
	// An unprepared spec still validates against its schema.
	raw := &Spec{Name: "raw", Effect: events.Idempotent, ArgsSchema: json.RawMessage(`{"type":"object","required":["x"]}`)}
	var ae *ArgsError
	if err := raw.ValidateArgs(json.RawMessage(`{}`)); !errors.As(err, &ae) || ae.Field != "/x" {
		t.Errorf("unprepared spec: %v", err)
	}
}

func TestAuthorize(t *testing.T) {
	t.Parallel()
	s := chargeSpec(t)
	if err := s.Authorize("billing-agent"); err != nil {
		t.Fatalf("allowed principal: %v", err)
	}
	for _, p := range []string{"support-agent", "", "Billing-Agent"} {
		err := s.Authorize(p)
		var fe *ForbiddenError
		if !errors.As(err, &fe) || fe.Principal != p || fe.Tool != "payments.charge" || !errors.Is(err, ErrForbidden) || !IsForbidden(err) {
			t.Fatalf("Authorize(%q) = %v, want *ForbiddenError", p, err)
		}
	}
	open := &Spec{Name: "open", Effect: events.Idempotent}
	if err := open.Authorize("anyone"); err != nil {
		t.Fatalf("empty allowed_principals: %v", err)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	s := chargeSpec(t)
	args := `{"amount":5,"currency":"EUR","card":"4242424242424242","cvv2":"123",
	  "lines":[{"sku":"a","pin":"0000"}],
	  "customer":{"name":"Ada","Password":"hunter2","nested":{"api_key":"k1","note":"<keep & this>"}},
	  "access_token":"t","client_secret":"s","card_number":"4111","cvc":"999","count":1.50}`
	got := s.Redact(json.RawMessage(args))
	want := `{"access_token":"[redacted]","amount":5,"card":"[redacted]","card_number":"[redacted]",` +
		`"client_secret":"[redacted]","count":1.50,"currency":"EUR","customer":{"Password":"[redacted]",` +
		`"name":"Ada","nested":{"api_key":"[redacted]","note":"<keep & this>"}},"cvc":"[redacted]",` +
		`"cvv2":"[redacted]","lines":[{"pin":"[redacted]","sku":"a"}]}`
	if string(got) != want {
		t.Fatalf("Redact:\n got %s\nwant %s", got, want)
	}
	// The input is not modified.
	if !json.Valid([]byte(args)) || !strings.Contains(args, "hunter2") {
		t.Fatal("Redact modified its input")
	}
	if got := s.Redact(json.RawMessage(`{not json`)); string(got) != `"[redacted]"` {
		t.Fatalf("Redact(invalid) = %s", got)
	}
	if got := (&Spec{Name: "x"}).Redact(json.RawMessage(`[{"token":"t"}]`)); string(got) != `[{"token":"[redacted]"}]` {
		t.Fatalf("Redact(array, no schema) = %s", got)
	}
}
