package ops

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/kafka"
)

var t0 = time.Date(2026, 12, 1, 20, 38, 51, 123456789, time.UTC)

func TestWriteOperationsAlignsColumns(t *testing.T) {
	var b bytes.Buffer
	err := writeOperations(&b, []Operation{
		{OperationKey: "wf:ord-1001/confirm", Tool: "email.send", EffectClass: "irreversible", Status: "completed", Attempt: 2, UpdatedAt: t0},
		{OperationKey: "k", Tool: "inventory.reserve", EffectClass: "compensable", Status: "escalated", Attempt: 1,
			UpdatedAt: t0.In(time.FixedZone("CET", 3600))},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"KEY                  TOOL               CLASS         STATUS     ATTEMPT  UPDATED",
		"wf:ord-1001/confirm  email.send         irreversible  completed  2        2026-12-01T20:38:51Z",
		"k                    inventory.reserve  compensable   escalated  1        2026-12-01T20:38:51Z",
		"",
	}, "\n")
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteOperationsEmpty(t *testing.T) {
	var b bytes.Buffer
	if err := writeOperations(&b, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "KEY  TOOL  CLASS  STATUS  ATTEMPT  UPDATED\n" {
		t.Errorf("empty table = %q, want the header alone", got)
	}
}

func TestWriteOperationShowsRecordThenHistory(t *testing.T) {
	lease := t0.Add(time.Minute)
	op := Operation{
		OperationKey: "wf:ord-1001/charge", Tool: "payments.charge", EffectClass: "irreversible",
		Status: "escalated", Attempt: 1, Principal: "order-agent", LeaseUntil: &lease,
		CreatedAt: t0, UpdatedAt: t0, Result: json.RawMessage("null"),
		Outcome:    &Outcome{State: "unknown", Next: "ask_human", Reason: "absent_downstream"},
		Escalation: &Escalation{Reason: "absent_downstream", ProposedAction: "retry"},
		Events: []Event{
			{Seq: 1, Type: "intent.recorded", OccurredAt: t0, Data: json.RawMessage(`{"args":{"amount":1},"principal":"order-agent"}`)},
			{Seq: 2, Type: "attempt.started", Attempt: 1, OccurredAt: t0, Data: json.RawMessage(`{"downstream_key":"wf:ord-1001/charge","worker":"w1"}`)},
			{Seq: 3, Type: "attempt.unknown", Attempt: 1, OccurredAt: t0, Data: json.RawMessage(`{"error_class":"http_500","status_code":500,"next":"reconcile","error":"long text"}`)},
		},
	}
	var b bytes.Buffer
	if err := writeOperation(&b, op); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"operation_key    wf:ord-1001/charge",
		"tool             payments.charge",
		"effect_class     irreversible",
		"status           escalated",
		"outcome          unknown, next: ask_human",
		"reason           absent_downstream",
		"attempt          1",
		"principal        order-agent",
		"lease_until      2026-12-01T20:39:51Z",
		"created_at       2026-12-01T20:38:51Z",
		"updated_at       2026-12-01T20:38:51Z",
		"escalation       absent_downstream",
		"proposed_action  retry",
		"",
		"SEQ  TYPE             ATTEMPT  OCCURRED              DETAIL",
		"1    intent.recorded           2026-12-01T20:38:51Z  principal=order-agent",
		"2    attempt.started  1        2026-12-01T20:38:51Z  downstream_key=wf:ord-1001/charge",
		"3    attempt.unknown  1        2026-12-01T20:38:51Z  status_code=500 error_class=http_500 next=reconcile",
		"",
	}, "\n")
	if b.String() != want {
		t.Errorf("record:\n%s\nwant:\n%s", b.String(), want)
	}
	if strings.Contains(b.String(), "amount") || strings.Contains(b.String(), "long text") {
		t.Errorf("the table shows args or error text; they belong to --json")
	}
}

func TestWatchLineHasFixedColumns(t *testing.T) {
	a := watchLine(Event{Seq: 1, Type: "intent.recorded", OccurredAt: t0, Data: json.RawMessage(`{"principal":"p"}`)})
	b := watchLine(Event{Seq: 12, Type: "reconciliation.resolved", Attempt: 3, OccurredAt: t0, Data: json.RawMessage(`{"found":true}`)})
	if got, want := a, "1      intent.recorded                   2026-12-01T20:38:51Z  principal=p"; got != want {
		t.Errorf("watch line\n%q, want\n%q", got, want)
	}
	if strings.Index(a, "principal") != strings.Index(b, "found") {
		t.Errorf("watch lines do not align:\n%s\n%s", a, b)
	}
	if c := watchLine(Event{Seq: 2, Type: "attempt.started", OccurredAt: t0}); strings.HasSuffix(c, " ") {
		t.Errorf("watch line %q ends in spaces", c)
	}
}

func TestWriteDeadLetters(t *testing.T) {
	var b bytes.Buffer
	err := writeDeadLetters(&b, []DeadLetter{{kafka.DeadLetter{
		DLQPartition: 1, DLQOffset: 7, At: t0, Key: []byte("k1"), Value: []byte("{\"a\":\n1}\x00"),
		Reason: "malformed JSON", Topic: "effectline.intents", Partition: 2, Offset: 40,
	}}, {kafka.DeadLetter{
		DLQPartition: 0, DLQOffset: 3, At: t0, Key: nil, Value: []byte{0xff, 'x'},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		`PARTITION  OFFSET  TIME                  KEY  REASON          SOURCE                   VALUE`,
		`1          7       2026-12-01T20:38:51Z  k1   malformed JSON  effectline.intents/2/40  {"a":\n1}\x00`,
		`0          3       2026-12-01T20:38:51Z                                                \xffx`,
		``,
	}, "\n")
	if b.String() != want {
		t.Errorf("dead letters:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestDeadLetterJSON(t *testing.T) {
	d := DeadLetter{kafka.DeadLetter{DLQPartition: 1, DLQOffset: 7, At: t0, Key: []byte("k"), Value: []byte{0xff},
		Reason: "not JSON", Detail: "invalid character", Topic: "t", Partition: 0, Offset: 9}}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"key": "k", "value_base64": "/w==", "reason": "not JSON", "source_topic": "t",
		"source_partition": "0", "source_offset": "9", "offset": 7.0, "partition": 1.0, "detail": "invalid character"} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (%s)", k, got[k], want, b)
		}
	}
	if _, ok := got["value"]; ok {
		t.Errorf("a value that is not UTF-8 is also given as text: %s", b)
	}
}

func TestCell(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 10, "plain"},
		{"line\nbreak\ttab", 40, `line\nbreak\ttab`},
		{"\x1b[31mred", 40, `\x1b[31mred`},
		{"bad\xffutf8", 40, `bad\xffutf8`},
		{"ünïcödé", 40, "ünïcödé"},
		{"abcdefghij", 4, "abcd…"},
		{"ab\ncd", 3, `ab…`},
		{"\u0085next-line", 40, `\u0085next-line`},
	} {
		if got := cell(c.in, c.max); got != c.want {
			t.Errorf("cell(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestEventDetail(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{`{"action":"abandon","note":"customer\ncancelled","approver":"alice"}`, `action=abandon approver=alice note=customer\ncancelled`},
		{`{"found":true,"source":"webhook","result":{"secret":"x"}}`, `found=true source=webhook`},
		{`{"error_class":"","status_code":0}`, `status_code=0`},
		{`not json`, ``},
		{`null`, ``},
	} {
		if got := eventDetail(json.RawMessage(c.data)); got != c.want {
			t.Errorf("eventDetail(%s) = %q, want %q", c.data, got, c.want)
		}
	}
}

func TestSettled(t *testing.T) {
	for status, want := range map[string]bool{
		"pending": false, "in_progress": false, "completed": true, "failed": true, "compensated": true,
		"needs_reconciliation": true, "escalated": true,
	} {
		if got := (Operation{Status: status}).settled(); got != want {
			t.Errorf("settled(%s) = %v, want %v", status, got, want)
		}
	}
	// The outcome, when given, decides.
	if (Operation{Status: "failed", Outcome: &Outcome{State: "pending"}}).settled() {
		t.Errorf("an operation whose outcome is pending is settled")
	}
}
