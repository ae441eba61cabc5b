package events

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// The fast path of marshal, for envelopes and the *Data structs.
//
// encoding/json spends most of an event's encoding on reflection and on
// compacting raw JSON (BenchmarkEncode, BenchmarkNew). The writer below
// produces the same bytes for the shapes events are made of, and gives up
// — leaving the value to encoding/json, its output and its errors — where
// matching encoding/json would take more than a few lines: a time it cannot
// format, raw JSON nested deeper than fastMaxDepth or not valid at all.
// encode_fast_test.go compares the two byte for byte.

// fastWriter writes one JSON object member by member, as encoding/json
// writes a struct without HTML escaping.
type fastWriter struct {
	b  []byte
	n  int  // members written
	ok bool // false once a value was left to encoding/json
}

func (w *fastWriter) member(name string) {
	if w.b == nil {
		w.b = make([]byte, 0, 128)
	}
	if w.n == 0 {
		w.b = append(w.b, '{', '"')
	} else {
		w.b = append(w.b, ',', '"')
	}
	w.n++
	w.b = append(w.b, name...)
	w.b = append(w.b, '"', ':')
}

// end closes the object and returns its bytes, or false if a value was
// left to encoding/json.
func (w *fastWriter) end() ([]byte, bool) {
	if w.n == 0 {
		w.b = append(w.b, '{')
	}
	return append(w.b, '}'), w.ok
}

func (w *fastWriter) str(name, s string) {
	w.member(name)
	w.b = appendJSONString(w.b, s)
}

func (w *fastWriter) strOmit(name, s string) {
	if s != "" {
		w.str(name, s)
	}
}

func (w *fastWriter) int(name string, n int64) {
	w.member(name)
	w.b = strconv.AppendInt(w.b, n, 10)
}

func (w *fastWriter) intOmit(name string, n int64) {
	if n != 0 {
		w.int(name, n)
	}
}

func (w *fastWriter) bool(name string, v bool) {
	w.member(name)
	w.b = strconv.AppendBool(w.b, v)
}

func (w *fastWriter) boolOmit(name string, v bool) {
	if v {
		w.bool(name, v)
	}
}

// time writes t as its MarshalJSON does: RFC 3339 with nanoseconds, which
// AppendText writes too. A time it refuses is left to encoding/json, for
// its error message.
func (w *fastWriter) time(name string, t time.Time) {
	w.member(name)
	w.b = append(w.b, '"')
	b, err := t.AppendText(w.b)
	if err != nil {
		w.ok = false
		return
	}
	w.b = append(b, '"')
}

func (w *fastWriter) timeOmit(name string, t *time.Time) {
	if t != nil {
		w.time(name, *t)
	}
}

// timeNull writes t, or null when it is nil.
func (w *fastWriter) timeNull(name string, t *time.Time) {
	if t == nil {
		w.member(name)
		w.b = append(w.b, "null"...)
		return
	}
	w.time(name, *t)
}

// raw writes m as encoding/json writes a json.RawMessage: null when nil,
// else compacted after checking its syntax.
func (w *fastWriter) raw(name string, m json.RawMessage) {
	w.member(name)
	if m == nil {
		w.b = append(w.b, "null"...)
		return
	}
	r := fastReader{b: m}
	r.space()
	if !r.skipValue(0) {
		w.ok = false
		return
	}
	if r.space(); r.i != len(m) {
		w.ok = false
		return
	}
	if !r.spaced {
		w.b = append(w.b, m...) // already compact, as everything encoding/json wrote is
		return
	}
	w.b = appendCompactJSON(w.b, m)
}

func (w *fastWriter) rawOmit(name string, m json.RawMessage) {
	if len(m) != 0 {
		w.raw(name, m)
	}
}

// appendCompactJSON appends the valid JSON src without the whitespace
// outside its strings, as encoding/json's compaction does.
func appendCompactJSON(dst, src []byte) []byte {
	start, inString := 0, false
	for i := 0; i < len(src); i++ {
		c := src[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case ' ', '\t', '\n', '\r':
			dst = append(dst, src[start:i]...)
			start = i + 1
		}
	}
	return append(dst, src[start:]...)
}

// appendJSONString appends s quoted as encoding/json quotes a string with
// HTML escaping off: '"', '\\' and the control characters escaped (with
// the short forms for \b, \f, \n, \r and \t), invalid UTF-8 replaced by
// \ufffd, U+2028 and U+2029 escaped, everything else as it is.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if canonPlain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// fastMarshal is marshal(v) for an Envelope, a *Data struct or an Operation (a value or
// a non-nil pointer); false for any other v, or when a value needs
// encoding/json.
//
// The type switch is long on purpose: a call through an interface would let
// the writer escape to the heap, one more allocation for every event (an
// interface version measured 7 allocations per Encode against 6).
func fastMarshal(v any) ([]byte, bool) {
	w := fastWriter{ok: true}
	switch v := v.(type) {
	case Operation:
		v.fastMarshal(&w)
	case *Operation:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case Envelope:
		v.fastMarshal(&w)
	case *Envelope:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case IntentData:
		v.fastMarshal(&w)
	case *IntentData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case IntentRejectedData:
		v.fastMarshal(&w)
	case *IntentRejectedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case AttemptStartedData:
		v.fastMarshal(&w)
	case *AttemptStartedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case AttemptSucceededData:
		v.fastMarshal(&w)
	case *AttemptSucceededData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case AttemptFailedData:
		v.fastMarshal(&w)
	case *AttemptFailedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case AttemptUnknownData:
		v.fastMarshal(&w)
	case *AttemptUnknownData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case CompensationStartedData:
		v.fastMarshal(&w)
	case *CompensationStartedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case CompensationSucceededData:
		v.fastMarshal(&w)
	case *CompensationSucceededData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case CompensationFailedData:
		v.fastMarshal(&w)
	case *CompensationFailedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case ReconciliationResolvedData:
		v.fastMarshal(&w)
	case *ReconciliationResolvedData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case EscalationData:
		v.fastMarshal(&w)
	case *EscalationData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	case DecisionData:
		v.fastMarshal(&w)
	case *DecisionData:
		if v == nil {
			return nil, false
		}
		v.fastMarshal(&w)
	default:
		return nil, false
	}
	return w.end()
}

// The fastMarshal methods write the fields of one struct in declaration
// order under their json tags, honouring omitempty as encoding/json does.

func (e *Envelope) fastMarshal(w *fastWriter) {
	w.b = make([]byte, 0, 192+len(e.OperationKey)+len(e.Tool)+len(e.Data))
	w.str("event_id", e.EventID)
	w.str("type", string(e.Type))
	w.str("operation_key", e.OperationKey)
	w.int("seq", e.Seq)
	w.time("occurred_at", e.OccurredAt)
	w.str("tool", e.Tool)
	w.str("effect_class", string(e.EffectClass))
	w.intOmit("attempt", int64(e.Attempt))
	w.raw("data", e.Data)
}

func (d *IntentData) fastMarshal(w *fastWriter) {
	w.b = make([]byte, 0, 32+len(d.Args)+len(d.Principal))
	w.raw("args", d.Args)
	w.str("principal", d.Principal)
	w.strOmit("payload_hash", d.PayloadHash)
}

func (d *IntentRejectedData) fastMarshal(w *fastWriter) {
	w.str("reason", d.Reason)
	w.str("payload_hash", d.PayloadHash)
	w.strOmit("principal", d.Principal)
	w.strOmit("rejected_event_id", d.EventID)
}

func (d *AttemptStartedData) fastMarshal(w *fastWriter) {
	w.str("downstream_key", d.DownstreamKey)
	w.str("worker", d.Worker)
	w.time("lease_until", d.LeaseUntil)
	w.intOmit("backoff_waited_ms", d.BackoffWaitedMS)
}

func (d *AttemptSucceededData) fastMarshal(w *fastWriter) {
	w.intOmit("status_code", int64(d.StatusCode))
	w.rawOmit("result", d.Result)
	w.strOmit("downstream_id", d.DownstreamID)
	w.strOmit("undo_ref", d.UndoRef)
	w.boolOmit("late", d.Late)
	w.rawOmit("precondition", d.Precondition)
}

func (d *AttemptFailedData) fastMarshal(w *fastWriter) {
	w.str("kind", string(d.Kind))
	w.str("error_class", d.ErrorClass)
	w.strOmit("error", d.Error)
	w.intOmit("status_code", int64(d.StatusCode))
	w.timeOmit("retry_at", d.RetryAt)
	w.boolOmit("late", d.Late)
	w.rawOmit("precondition", d.Precondition)
	w.rawOmit("response", d.Response)
}

func (d *AttemptUnknownData) fastMarshal(w *fastWriter) {
	w.str("error_class", d.ErrorClass)
	w.strOmit("error", d.Error)
	w.intOmit("status_code", int64(d.StatusCode))
	w.str("next", string(d.Next))
	w.timeOmit("retry_at", d.RetryAt)
	w.boolOmit("late", d.Late)
	w.rawOmit("precondition", d.Precondition)
}

func (d *CompensationStartedData) fastMarshal(w *fastWriter) {
	w.str("downstream_key", d.DownstreamKey)
	w.strOmit("downstream_id", d.DownstreamID)
	w.str("worker", d.Worker)
	w.time("lease_until", d.LeaseUntil)
}

func (d *CompensationSucceededData) fastMarshal(w *fastWriter) {
	w.intOmit("status_code", int64(d.StatusCode))
	w.timeOmit("retry_at", d.RetryAt)
}

func (d *CompensationFailedData) fastMarshal(w *fastWriter) {
	w.str("outcome", string(d.Outcome))
	w.str("error_class", d.ErrorClass)
	w.strOmit("error", d.Error)
	w.intOmit("status_code", int64(d.StatusCode))
}

func (d *ReconciliationResolvedData) fastMarshal(w *fastWriter) {
	w.bool("found", d.Found)
	w.rawOmit("result", d.Result)
	w.strOmit("downstream_id", d.DownstreamID)
	w.str("source", d.Source)
	w.timeOmit("retry_at", d.RetryAt)
}

func (d *EscalationData) fastMarshal(w *fastWriter) {
	w.str("reason", d.Reason)
	w.raw("request", d.Request)
	w.rawOmit("downstream", d.Downstream)
	w.str("proposed_action", string(d.ProposedAction))
	w.strOmit("detail", d.Detail)
	w.intOmit("approvers", int64(d.Approvers))
}

func (d *DecisionData) fastMarshal(w *fastWriter) {
	w.str("action", string(d.Action))
	w.strOmit("note", d.Note)
	w.str("approver", d.Approver)
	w.timeOmit("retry_at", d.RetryAt)
	w.strOmit("downstream_id", d.DownstreamID)
	w.rawOmit("result", d.Result)
}

func (o *Operation) fastMarshal(w *fastWriter) { o.appendMembers(w, true) }

// appendMembers writes op's members; without identity, it leaves out the
// six that MarshalOperationBody leaves out.
func (o *Operation) appendMembers(w *fastWriter, identity bool) {
	if identity {
		w.str("operation_key", o.Key)
		w.str("tool", o.Tool)
		w.str("effect_class", string(o.EffectClass))
		w.str("payload_hash", o.PayloadHash)
	}
	w.str("principal", o.Principal)
	w.rawOmit("args", o.Args)
	if identity {
		w.str("status", string(o.Status))
	}
	w.str("phase", string(o.Phase))
	w.int("attempt", int64(o.Attempt))
	w.strOmit("lease_owner", o.LeaseOwner)
	w.timeNull("lease_until", o.LeaseUntil)
	w.timeOmit("due_at", o.DueAt)
	w.raw("result", o.Result)
	w.str("downstream_id", o.DownstreamID)
	w.str("undo_ref", o.UndoRef)
	w.strOmit("downstream_key", o.DownstreamKey)
	w.int("compensations", int64(o.Compensations))
	w.boolOmit("approved", o.Approved)
	if len(o.Approvals) > 0 {
		w.ok = false // a list of strings: left to encoding/json
	}
	w.str("last_error_class", o.LastErrorClass)
	if f := o.LastFailure; f != nil {
		w.member("last_failure")
		sub := fastWriter{ok: true}
		sub.str("kind", string(f.Kind))
		sub.intOmit("status_code", int64(f.StatusCode))
		sub.rawOmit("response", f.Response)
		b, ok := sub.end()
		w.ok = w.ok && ok
		w.b = append(w.b, b...)
	}
	w.intOmit("evidence", int64(o.Evidence))
	if o.Escalation != nil {
		w.member("escalation")
		sub := fastWriter{ok: true}
		o.Escalation.fastMarshal(&sub)
		b, ok := sub.end()
		w.ok = w.ok && ok
		w.b = append(w.b, b...)
	}
	if identity {
		w.int("seq", o.Seq)
	}
	w.timeOmit("first_attempt_at", o.FirstAttemptAt)
	w.timeOmit("last_attempt_at", o.LastAttemptAt)
	w.timeOmit("last_outcome_at", o.LastOutcomeAt)
	w.time("created_at", o.CreatedAt)
	w.time("updated_at", o.UpdatedAt)
}
