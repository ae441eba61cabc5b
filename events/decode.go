package events

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// MaxEnvelopeBytes caps one encoded event. Tool args and results live inside
// events, so the cap bounds what one intent may carry; larger payloads belong
// in the downstream system, referenced by id.
const MaxEnvelopeBytes = 1 << 20

// MaxOperationKeyBytes caps an operation key; keys are Kafka message keys and
// primary keys, and a key that long is a bug in the caller's workflow layer.
const MaxOperationKeyBytes = 512

// ErrInvalidEvent is the sentinel every decoding error wraps.
var ErrInvalidEvent = errors.New("invalid event")

// DecodeError says which field of an event is wrong and why.
type DecodeError struct {
	Field  string
	Reason string
}

func (e *DecodeError) Error() string {
	if e.Field == "" {
		return "invalid event: " + e.Reason
	}
	return fmt.Sprintf("invalid event: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidEvent) true for every DecodeError.
func (e *DecodeError) Is(target error) bool { return target == ErrInvalidEvent }

// IsInvalidEvent reports whether err is a decoding error of an event.
func IsInvalidEvent(err error) bool {
	var de *DecodeError
	return errors.As(err, &de)
}

func invalid(field, format string, args ...any) error {
	return &DecodeError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// wireEnvelope has pointer fields so a missing field is told apart from a
// zero value.
type wireEnvelope struct {
	EventID      *string         `json:"event_id"`
	Type         *Type           `json:"type"`
	OperationKey *string         `json:"operation_key"`
	Seq          *int64          `json:"seq"`
	OccurredAt   *time.Time      `json:"occurred_at"`
	Tool         *string         `json:"tool"`
	EffectClass  *EffectClass    `json:"effect_class"`
	Attempt      *int            `json:"attempt"`
	Data         json.RawMessage `json:"data"`
}

// Decode parses and validates one event. It either returns a complete,
// valid envelope or a *DecodeError; it never panics and never returns a
// half-filled envelope.
func Decode(b []byte) (Envelope, error) {
	if len(b) > MaxEnvelopeBytes {
		return Envelope{}, invalid("", "event is %d bytes, over the %d byte limit", len(b), MaxEnvelopeBytes)
	}
	var v Envelope // what the fast path's wireEnvelope points to
	data, present, ok := fastDecodeEnvelope(b, &v)
	if !ok {
		return decodeSlow(b)
	}
	return wireFrom(&v, present).validate(data)
}

// decodeSlow is Decode through encoding/json, for the inputs
// fastDecodeEnvelope leaves to it. It is a function of its own so that the
// fast path's values do not escape to the heap with w.
func decodeSlow(b []byte) (Envelope, error) {
	var w wireEnvelope
	if err := strictUnmarshal(b, &w); err != nil {
		return Envelope{}, invalid("", "%v", err)
	}
	e, err := w.validate(w.Data)
	// encoding/json turns bytes that are not UTF-8 into U+FFFD, so a key
	// that is not UTF-8 would silently become another key: refused, as the
	// key rule refuses it everywhere else. (The fast path never decodes
	// such a key; it leaves the input to this one.)
	if err == nil && !utf8.Valid(b) && strings.ContainsRune(e.OperationKey, utf8.RuneError) {
		return Envelope{}, invalid("operation_key", "not valid UTF-8")
	}
	return e, err
}

// validate applies every rule of the contract to a parsed envelope whose
// data is data (w.Data, or the fast path's copy: kept apart from w so that
// returning it does not make the values w points to escape to the heap).
func (w wireEnvelope) validate(data json.RawMessage) (Envelope, error) {
	switch {
	case w.EventID == nil || *w.EventID == "":
		return Envelope{}, invalid("event_id", "missing")
	case w.Type == nil || *w.Type == "":
		return Envelope{}, invalid("type", "missing")
	case !w.Type.Valid():
		return Envelope{}, invalid("type", "unknown type %q", *w.Type)
	case w.OperationKey == nil || *w.OperationKey == "":
		return Envelope{}, invalid("operation_key", "missing")
	}
	if err := CheckOperationKey(*w.OperationKey); err != nil {
		return Envelope{}, invalid("operation_key", "%s", operationKeyReason(err))
	}
	switch {
	case w.Seq == nil:
		return Envelope{}, invalid("seq", "missing")
	case *w.Seq < 1:
		return Envelope{}, invalid("seq", "must be at least 1, got %d", *w.Seq)
	case *w.Type == IntentRecorded && *w.Seq != 1:
		return Envelope{}, invalid("seq", "intent.recorded must have seq 1, got %d", *w.Seq)
	case *w.Type != IntentRecorded && *w.Seq == 1:
		return Envelope{}, invalid("seq", "seq 1 is reserved for intent.recorded")
	case w.OccurredAt == nil || w.OccurredAt.IsZero():
		return Envelope{}, invalid("occurred_at", "missing")
	case w.Tool == nil || *w.Tool == "":
		return Envelope{}, invalid("tool", "missing")
	case w.EffectClass == nil:
		return Envelope{}, invalid("effect_class", "missing")
	case !w.EffectClass.Valid():
		return Envelope{}, invalid("effect_class", "unknown effect class %q", *w.EffectClass)
	case len(data) == 0 || bytes.Equal(data, []byte("null")):
		return Envelope{}, invalid("data", "missing")
	}
	e := Envelope{
		EventID:      *w.EventID,
		Type:         *w.Type,
		OperationKey: *w.OperationKey,
		Seq:          *w.Seq,
		OccurredAt:   *w.OccurredAt,
		Tool:         *w.Tool,
		EffectClass:  *w.EffectClass,
		Data:         data,
	}
	if w.Attempt != nil {
		e.Attempt = *w.Attempt
	}
	if e.Type.HasAttempt() && e.Attempt < 1 {
		return Envelope{}, invalid("attempt", "%s needs an attempt of at least 1", e.Type)
	}
	if !e.Type.HasAttempt() && e.Attempt < 0 {
		return Envelope{}, invalid("attempt", "must not be negative")
	}
	if _, err := e.DecodeData(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// DecodeData parses e.Data into the Go shape of e.Type (a pointer to one of
// the *Data structs) and validates its required fields.
func (e Envelope) DecodeData() (any, error) {
	return e.decodeData(nil)
}

// decodeData is DecodeData. For an intent it also sets *argsHash, when
// argsHash is not nil, to PayloadHash of the args: validation derives their
// canonical form anyway, and Apply would otherwise derive it a second time.
func (e Envelope) decodeData(argsHash *string) (any, error) {
	d := dataFor(e.Type)
	if d == nil {
		return nil, invalid("type", "unknown type %q", e.Type)
	}
	if !fastDecodeData(e.Data, d) {
		if err := strictUnmarshal(e.Data, d); err != nil {
			return nil, invalid("data", "%v", err)
		}
	}
	if err := validateData(d, argsHash); err != nil {
		return nil, err
	}
	return d, nil
}

// validateData checks the required fields of d; see decodeData for argsHash.
func validateData(d any, argsHash *string) error {
	switch d := d.(type) {
	case *IntentData:
		if len(d.Args) == 0 || d.Args[0] != '{' {
			return invalid("data.args", "must be a JSON object")
		}
		if d.Principal == "" {
			return invalid("data.principal", "missing")
		}
		if d.PayloadHash != "" && !isPayloadHash(d.PayloadHash) {
			return invalid("data.payload_hash", "must be 64 lowercase hex digits")
		}
		// An intent whose args cannot be hashed could never be folded.
		s := canonGet(d.Args)
		defer canonPut(s)
		if err := s.run(); err != nil {
			return invalid("data.args", "%v", err)
		}
		if argsHash != nil {
			*argsHash = s.hash()
		}
	case *IntentRejectedData:
		if d.Reason == "" {
			return invalid("data.reason", "missing")
		}
	case *AttemptStartedData:
		if d.DownstreamKey == "" {
			return invalid("data.downstream_key", "missing")
		}
		if d.LeaseUntil.IsZero() {
			return invalid("data.lease_until", "missing")
		}
	case *AttemptFailedData:
		if d.Kind != Retryable && d.Kind != Final {
			return invalid("data.kind", "must be retryable or final, got %q", d.Kind)
		}
		if d.ErrorClass == "" {
			return invalid("data.error_class", "missing")
		}
	case *AttemptUnknownData:
		if d.Next != NextRetry && d.Next != NextCompensate && d.Next != NextReconcile {
			return invalid("data.next", "must be retry, compensate or reconcile, got %q", d.Next)
		}
		if d.ErrorClass == "" {
			return invalid("data.error_class", "missing")
		}
	case *CompensationStartedData:
		if d.DownstreamKey == "" {
			return invalid("data.downstream_key", "missing")
		}
		if d.LeaseUntil.IsZero() {
			return invalid("data.lease_until", "missing")
		}
	case *CompensationFailedData:
		if d.Outcome != Failed && d.Outcome != Unknown {
			return invalid("data.outcome", "must be failed or unknown, got %q", d.Outcome)
		}
	case *ReconciliationResolvedData:
		if d.Source == "" {
			return invalid("data.source", "missing")
		}
	case *EscalationData:
		if d.Reason == "" {
			return invalid("data.reason", "missing")
		}
		if _, err := ParseAction(string(d.ProposedAction)); err != nil {
			return invalid("data.proposed_action", "%v", err)
		}
	case *DecisionData:
		if _, err := ParseAction(string(d.Action)); err != nil {
			return invalid("data.action", "%v", err)
		}
		if d.Approver == "" {
			return invalid("data.approver", "missing")
		}
	}
	return nil
}

// strictUnmarshal decodes one JSON object into v, refusing what
// encoding/json would let through but a parser in another language might
// read differently: unknown fields, names that match only case-insensitively,
// duplicate names (Go keeps the last, others the first) and trailing data.
//
// Decode and DecodeData try fastDecodeEnvelope and fastDecodeData first;
// those read the common, plainly written events in one pass and leave all
// others, and so every error message, to strictUnmarshal.
func strictUnmarshal(b []byte, v any) error {
	if err := checkObjectNames(b, jsonNames(v)); err != nil {
		return err
	}
	// The names are exact and known by now; json.Unmarshal also refuses
	// trailing data after the value.
	return json.Unmarshal(b, v)
}

// checkObjectNames reports a top-level member name of the object in b that
// is duplicated or not exactly one of names. It only finds the boundaries
// of members (strings, nesting); the decoder that runs next checks the
// syntax. It is a hand-written scan because encoding/json's Token API made
// it the most expensive part of decoding an event (BenchmarkDecode).
func checkObjectNames(b []byte, names map[string]bool) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errors.New("not a JSON object")
	}
	var seen [16]string
	n := 0
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return checkEnd(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return errors.New("invalid JSON object")
		}
		end, escaped := skipString(b, i)
		if end < 0 {
			return errors.New("unterminated string")
		}
		name := string(b[i+1 : end-1])
		if escaped {
			if err := json.Unmarshal(b[i:end], &name); err != nil {
				return err
			}
		}
		for _, s := range seen[:min(n, len(seen))] {
			if s == name {
				return fmt.Errorf("duplicate field %q", name)
			}
		}
		if n < len(seen) {
			seen[n] = name
		}
		n++
		if !names[name] {
			return fmt.Errorf("unknown field %q", name)
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return errors.New("invalid JSON object")
		}
		if i = skipValue(b, skipSpace(b, i+1)); i < 0 {
			return errors.New("invalid JSON value")
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return errors.New("unexpected end of JSON input")
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return checkEnd(b, i+1)
		default:
			return errors.New("invalid JSON object")
		}
	}
}

func checkEnd(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] (a quote)
// and whether it holds escapes; -1 if it does not end.
func skipString(b []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// skipValue returns the index after the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := skipString(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := skipString(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

var namesCache sync.Map // reflect.Type -> map[string]bool

// jsonNames returns the JSON member names of the struct v points to.
func jsonNames(v any) map[string]bool {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if m, ok := namesCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = true
	}
	namesCache.Store(t, m)
	return m
}

// marshal is json.Marshal without HTML escaping: escaping turns one byte of
// '<' into six, so an event accepted under the size limit could exceed it
// when re-encoded.
func marshal(v any) ([]byte, error) {
	if b, ok := fastMarshal(v); ok {
		return b, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Encode returns the JSON of e. It validates e with Decode's rules, so
// effectline never emits an event its own consumers would reject.
func Encode(e Envelope) ([]byte, error) {
	b, err := marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encoding %s event: %w", e.Type, err)
	}
	// Validated with Decode's rules, without parsing the bytes just made.
	if len(b) > MaxEnvelopeBytes {
		return nil, invalid("", "event is %d bytes, over the %d byte limit", len(b), MaxEnvelopeBytes)
	}
	w := wireEnvelope{EventID: &e.EventID, Type: &e.Type, OperationKey: &e.OperationKey, Seq: &e.Seq,
		OccurredAt: &e.OccurredAt, Tool: &e.Tool, EffectClass: &e.EffectClass, Data: e.Data}
	if e.Attempt != 0 {
		w.Attempt = &e.Attempt
	}
	if _, err := w.validate(w.Data); err != nil {
		return nil, err
	}
	return b, nil
}

// New builds an envelope with a fresh event id, marshalling data.
func New(t Type, key string, seq int64, tool string, class EffectClass, attempt int, data any, at time.Time) (Envelope, error) {
	raw, err := marshal(data)
	if err != nil {
		return Envelope{}, fmt.Errorf("encoding %s data: %w", t, err)
	}
	return Envelope{
		EventID:      NewID(),
		Type:         t,
		OperationKey: key,
		Seq:          seq,
		OccurredAt:   at.UTC(),
		Tool:         tool,
		EffectClass:  class,
		Attempt:      attempt,
		Data:         raw,
	}, nil
}

// NewID returns a random RFC 4122 version 4 UUID.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms.
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}
