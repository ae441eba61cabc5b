package events

import (
	"encoding/json"
	"time"
	"unicode/utf8"
)

// The fast path of strictUnmarshal.
//
// encoding/json was most of the cost of decoding an event: it validates the
// whole input, then walks it again through reflection, and every consumer
// pays that once per message (BenchmarkDecodeIntent,
// BenchmarkDecodeAttemptStarted). Events are flat objects of strings,
// integers, booleans, times and raw JSON, so a reader written for exactly
// those shapes does the same job in one pass.
//
// It does not try to reproduce encoding/json's every rule. It decodes only
// what it can decode with certainty — exact, unique member names written
// without escapes; strings of valid UTF-8 whose escapes are not halves of
// surrogate pairs; integers of at most 18 digits without fraction or
// exponent; times through time.Time's own UnmarshalJSON; raw values that
// are valid JSON — and gives up on anything else, leaving the input to
// strictUnmarshal. So an input it accepts decodes to exactly what
// strictUnmarshal would give, and every input it declines gets
// strictUnmarshal's result and error messages unchanged.
// decode_fast_test.go holds it to that.

// fastMaxDepth bounds the nesting the fast path follows inside raw values;
// deeper input is left to encoding/json and its own limit.
const fastMaxDepth = 256

// fastReader reads one JSON object member by member: more advances to the
// next member and leaves its name in name; the caller reads the value with
// one of the value methods, each of which reports false when the value is
// not one it decodes with certainty.
type fastReader struct {
	b     []byte
	i     int
	name  []byte
	state int8 // fastBefore, fastInside, fastClosed or fastFailed
	// spaced records that whitespace was stepped over.
	spaced bool
	// seen holds the spans of the names read so far, to refuse duplicates.
	seen [fastMaxMembers][2]int
	n    int
}

// fastMaxMembers is the number of fields of the envelope, the largest object
// the fast path reads: an object with more members has an unknown or a
// duplicate name.
const fastMaxMembers = 9

const (
	fastBefore int8 = iota
	fastInside
	fastClosed
	fastFailed
)

func (r *fastReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
			r.spaced = true
		default:
			return
		}
	}
}

// more moves to the next member; false when the object has ended (see
// closed) or is not one the fast path reads.
func (r *fastReader) more() bool {
	switch r.state {
	case fastBefore:
		r.space()
		if r.i >= len(r.b) || r.b[r.i] != '{' {
			r.state = fastFailed
			return false
		}
		r.i++
		if r.space(); r.i < len(r.b) && r.b[r.i] == '}' {
			r.i++
			r.state = fastClosed
			return false
		}
	case fastInside:
		r.space()
		if r.i < len(r.b) && r.b[r.i] == '}' {
			r.i++
			r.state = fastClosed
			return false
		}
		if r.i >= len(r.b) || r.b[r.i] != ',' {
			r.state = fastFailed
			return false
		}
		r.i++
	default:
		return false
	}
	r.state = fastFailed // until the member is read
	r.space()
	start, end, ok := r.plainString()
	if !ok || r.n == len(r.seen) {
		return false
	}
	name := r.b[start:end]
	for _, s := range r.seen[:r.n] {
		// Names of one struct mostly differ in length or first byte.
		if s[1]-s[0] == len(name) && (len(name) == 0 || r.b[s[0]] == name[0]) &&
			string(r.b[s[0]:s[1]]) == string(name) {
			return false
		}
	}
	r.seen[r.n] = [2]int{start, end}
	r.n++
	if r.space(); r.i >= len(r.b) || r.b[r.i] != ':' {
		return false
	}
	r.i++
	r.space()
	r.name = name
	r.state = fastInside
	return true
}

// closed reports whether the object was read to its end with nothing but
// whitespace after it.
func (r *fastReader) closed() bool {
	if r.state != fastClosed {
		return false
	}
	r.space()
	return r.i == len(r.b)
}

// plainString reads a string without escapes whose bytes are valid UTF-8,
// the strings encoding/json hands over unchanged; start and end delimit its
// contents.
func (r *fastReader) plainString() (start, end int, ok bool) {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return 0, 0, false
	}
	start = r.i + 1
	j := start
	for j < len(r.b) && canonPlain[r.b[j]] {
		j++
	}
	if j < len(r.b) && r.b[j] >= utf8.RuneSelf {
		for j < len(r.b) && fastStringByte[r.b[j]] {
			j++
		}
		if !utf8.Valid(r.b[start:j]) {
			return 0, 0, false
		}
	}
	if j >= len(r.b) || r.b[j] != '"' {
		return 0, 0, false // an escape, a control character or the end
	}
	r.i = j + 1
	return start, j, true
}

// fastStringByte marks the bytes a string may hold as they are: all but
// '"', '\\' and the control characters.
var fastStringByte = func() (t [256]bool) {
	for c := 0x20; c < len(t); c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (r *fastReader) literal(lit string) bool {
	if len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
		r.i += len(lit)
		return true
	}
	return false
}

func (r *fastReader) isNull() bool {
	return r.i < len(r.b) && r.b[r.i] == 'n'
}

// str reads a string into dst. A null leaves dst as it is, as encoding/json
// does for a non-pointer field.
func (r *fastReader) str(dst *string) bool {
	if r.isNull() {
		return r.literal("null")
	}
	start, end, ok := r.plainString()
	if ok {
		*dst = string(r.b[start:end])
		return true
	}
	return r.escapedString(dst)
}

// escapedString reads a string with escapes, those encoding/json and every
// other serializer write for '"', '\\' and control characters. The escape of
// half a surrogate pair and invalid UTF-8, which encoding/json replaces
// by U+FFFD, are left to it.
func (r *fastReader) escapedString(dst *string) bool {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return false
	}
	var buf [64]byte
	out := buf[:0]
	start := r.i + 1
	for j := start; j < len(r.b); {
		c := r.b[j]
		if canonPlain[c] {
			j++
			continue
		}
		switch {
		case c == '"':
			out = append(out, r.b[start:j]...)
			if !utf8.Valid(out) {
				return false
			}
			*dst = string(out)
			r.i = j + 1
			return true
		case c >= utf8.RuneSelf:
			j++ // checked as a whole at the end
			continue
		case c != '\\' || j+1 >= len(r.b):
			return false
		}
		out = append(out, r.b[start:j]...)
		switch e := r.b[j+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			u, ok := canonHex4(r.b, j+2)
			if !ok || 0xD800 <= u && u <= 0xDFFF {
				return false
			}
			out = utf8.AppendRune(out, rune(u))
			j += 4
		default:
			return false
		}
		j += 2
		start = j
	}
	return false
}

// enum reads a string into dst like str, sharing the text of known, the
// values the field takes, rather than allocating a copy of it.
func (r *fastReader) enum(dst *string, known []string) bool {
	if r.isNull() {
		return r.literal("null")
	}
	start, end, ok := r.plainString()
	if !ok {
		return r.escapedString(dst)
	}
	for _, k := range known {
		if string(r.b[start:end]) == k {
			*dst = k
			return true
		}
	}
	*dst = string(r.b[start:end])
	return true
}

// The values of the enumerated fields, for fastReader.enum.
var (
	typeNames        = stringsOf(Types())
	effectClassNames = stringsOf(EffectClasses())
	failureKindNames = []string{string(Retryable), string(Final)}
	nextNames        = []string{string(NextRetry), string(NextCompensate), string(NextReconcile)}
	outcomeNames     = []string{string(Succeeded), string(Failed), string(Unknown)}
	actionNames      = stringsOf(Actions())
)

func stringsOf[S ~string](values []S) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// strOpt reads a string for a pointer field: present is false for null,
// which leaves the pointer nil.
func (r *fastReader) strOpt(dst *string) (present, ok bool) {
	if r.isNull() {
		return false, r.literal("null")
	}
	return true, r.str(dst)
}

func (r *fastReader) enumOpt(dst *string, known []string) (present, ok bool) {
	if r.isNull() {
		return false, r.literal("null")
	}
	return true, r.enum(dst, known)
}

// integer reads an integer literal of at most 18 digits, which cannot
// overflow an int64 (encoding/json refuses fractions and exponents for
// integer fields; longer ones are left to it).
func (r *fastReader) integer() (int64, bool) {
	i, neg := r.i, false
	if i < len(r.b) && r.b[i] == '-' {
		neg = true
		i++
	}
	start := i
	var n int64
	for i < len(r.b) && '0' <= r.b[i] && r.b[i] <= '9' {
		n = n*10 + int64(r.b[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && r.b[start] == '0') {
		return 0, false
	}
	if i < len(r.b) && (r.b[i] == '.' || r.b[i] == 'e' || r.b[i] == 'E') {
		return 0, false
	}
	r.i = i
	if neg {
		n = -n
	}
	return n, true
}

func (r *fastReader) int64(dst *int64) bool {
	if r.isNull() {
		return r.literal("null")
	}
	n, ok := r.integer()
	if ok {
		*dst = n
	}
	return ok
}

func (r *fastReader) int64Opt(dst *int64) (present, ok bool) {
	if r.isNull() {
		return false, r.literal("null")
	}
	return true, r.int64(dst)
}

func (r *fastReader) int(dst *int) bool {
	if r.isNull() {
		return r.literal("null")
	}
	n, ok := r.integer()
	if !ok || int64(int(n)) != n {
		return false
	}
	*dst = int(n)
	return true
}

func (r *fastReader) intOpt(dst *int) (present, ok bool) {
	if r.isNull() {
		return false, r.literal("null")
	}
	return true, r.int(dst)
}

func (r *fastReader) bool(dst *bool) bool {
	switch {
	case r.isNull():
		return r.literal("null")
	case r.literal("true"):
		*dst = true
		return true
	case r.literal("false"):
		*dst = false
		return true
	}
	return false
}

// time reads a time through time.Time's UnmarshalJSON, which is what
// encoding/json calls with the same bytes. A null leaves dst as it is.
func (r *fastReader) time(dst *time.Time) bool {
	if r.isNull() {
		return r.literal("null")
	}
	start := r.i
	if !r.skipString() {
		return false
	}
	return dst.UnmarshalJSON(r.b[start:r.i]) == nil
}

// timePtr reads a time for a pointer field; null leaves it nil.
func (r *fastReader) timePtr(dst **time.Time) bool {
	if r.isNull() {
		return r.literal("null")
	}
	var t time.Time
	if !r.time(&t) {
		return false
	}
	*dst = &t
	return true
}

func (r *fastReader) timeOpt(dst *time.Time) (present, ok bool) {
	if r.isNull() {
		return false, r.literal("null")
	}
	return true, r.time(dst)
}

// raw reads any valid JSON value into dst as a copy of its bytes, as
// json.RawMessage's UnmarshalJSON does (a null included).
func (r *fastReader) raw(dst *json.RawMessage) bool {
	start := r.i
	if !r.skipValue(0) {
		return false
	}
	*dst = append(json.RawMessage(nil), r.b[start:r.i]...)
	return true
}

// skipValue steps over the value at r.i, checking its syntax as
// encoding/json's scanner does; depth is the nesting of its container.
func (r *fastReader) skipValue(depth int) bool {
	if r.i >= len(r.b) {
		return false
	}
	switch r.b[r.i] {
	case '{':
		if depth >= fastMaxDepth {
			return false
		}
		r.i++
		if r.space(); r.i < len(r.b) && r.b[r.i] == '}' {
			r.i++
			return true
		}
		for {
			if r.space(); !r.skipString() {
				return false
			}
			if r.space(); r.i >= len(r.b) || r.b[r.i] != ':' {
				return false
			}
			r.i++
			if r.space(); !r.skipValue(depth + 1) {
				return false
			}
			if r.space(); r.i >= len(r.b) {
				return false
			}
			r.i++
			switch r.b[r.i-1] {
			case ',':
			case '}':
				return true
			default:
				return false
			}
		}
	case '[':
		if depth >= fastMaxDepth {
			return false
		}
		r.i++
		if r.space(); r.i < len(r.b) && r.b[r.i] == ']' {
			r.i++
			return true
		}
		for {
			if r.space(); !r.skipValue(depth + 1) {
				return false
			}
			if r.space(); r.i >= len(r.b) {
				return false
			}
			r.i++
			switch r.b[r.i-1] {
			case ',':
			case ']':
				return true
			default:
				return false
			}
		}
	case '"':
		return r.skipString()
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	}
	return r.skipNumber()
}

// skipString steps over a string, checking its escapes and refusing raw
// control characters; like encoding/json's scanner it lets any other byte
// through.
func (r *fastReader) skipString() bool {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return false
	}
	for j := r.i + 1; j < len(r.b); j++ {
		c := r.b[j]
		if fastStringByte[c] {
			continue
		}
		switch c {
		case '"':
			r.i = j + 1
			return true
		case '\\':
			if j+1 >= len(r.b) {
				return false
			}
			switch r.b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if _, ok := canonHex4(r.b, j+2); !ok {
					return false
				}
				j += 5
			default:
				return false
			}
		default: // a control character
			return false
		}
	}
	return false
}

// skipNumber steps over a number of JSON's grammar.
func (r *fastReader) skipNumber() bool {
	b, i := r.b, r.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	r.i = i
	return true
}

// The envelope members fastDecodeEnvelope found (not null), as bits.
const (
	hasEventID uint16 = 1 << iota
	hasType
	hasOperationKey
	hasSeq
	hasOccurredAt
	hasTool
	hasEffectClass
	hasAttempt
)

// fastDecodeEnvelope is strictUnmarshal(b, &w) for the inputs the fast
// path reads: it stores the values in v, says in present which of w's
// pointers would be set (wireFrom sets them) and returns w.Data. It reports
// false, with v in an unspecified state, for any other input.
//
// It fills v rather than w because stores of pointers through a pointer
// parameter make the compiler move their target to the heap.
func fastDecodeEnvelope(b []byte, v *Envelope) (data json.RawMessage, present uint16, ok bool) {
	r := fastReader{b: b}
	for r.more() {
		var has bool
		var bit uint16
		switch string(r.name) {
		case "event_id":
			has, ok = r.strOpt(&v.EventID)
			bit = hasEventID
		case "type":
			has, ok = r.enumOpt((*string)(&v.Type), typeNames)
			bit = hasType
		case "operation_key":
			has, ok = r.strOpt(&v.OperationKey)
			bit = hasOperationKey
		case "seq":
			has, ok = r.int64Opt(&v.Seq)
			bit = hasSeq
		case "occurred_at":
			has, ok = r.timeOpt(&v.OccurredAt)
			bit = hasOccurredAt
		case "tool":
			has, ok = r.strOpt(&v.Tool)
			bit = hasTool
		case "effect_class":
			has, ok = r.enumOpt((*string)(&v.EffectClass), effectClassNames)
			bit = hasEffectClass
		case "attempt":
			has, ok = r.intOpt(&v.Attempt)
			bit = hasAttempt
		case "data":
			ok = r.raw(&data)
		default:
			ok = false
		}
		if !ok {
			return nil, 0, false
		}
		if has {
			present |= bit
		}
	}
	return data, present, r.closed()
}

// wireFrom is the wireEnvelope encoding/json would have decoded, less its
// Data, from fastDecodeEnvelope's results.
func wireFrom(v *Envelope, present uint16) wireEnvelope {
	var w wireEnvelope
	if present&hasEventID != 0 {
		w.EventID = &v.EventID
	}
	if present&hasType != 0 {
		w.Type = &v.Type
	}
	if present&hasOperationKey != 0 {
		w.OperationKey = &v.OperationKey
	}
	if present&hasSeq != 0 {
		w.Seq = &v.Seq
	}
	if present&hasOccurredAt != 0 {
		w.OccurredAt = &v.OccurredAt
	}
	if present&hasTool != 0 {
		w.Tool = &v.Tool
	}
	if present&hasEffectClass != 0 {
		w.EffectClass = &v.EffectClass
	}
	if present&hasAttempt != 0 {
		w.Attempt = &v.Attempt
	}
	return w
}

// fastDecodeData is strictUnmarshal(b, d) for d from dataFor, for the
// inputs the fast path reads. It reports false, with d left zero, for any
// other input.
func fastDecodeData(b []byte, d any) bool {
	r := fastReader{b: b}
	switch d := d.(type) {
	case *IntentData:
		if d.fastDecode(&r) {
			return true
		}
		*d = IntentData{}
	case *IntentRejectedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = IntentRejectedData{}
	case *AttemptStartedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = AttemptStartedData{}
	case *AttemptSucceededData:
		if d.fastDecode(&r) {
			return true
		}
		*d = AttemptSucceededData{}
	case *AttemptFailedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = AttemptFailedData{}
	case *AttemptUnknownData:
		if d.fastDecode(&r) {
			return true
		}
		*d = AttemptUnknownData{}
	case *CompensationStartedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = CompensationStartedData{}
	case *CompensationSucceededData:
		if d.fastDecode(&r) {
			return true
		}
		*d = CompensationSucceededData{}
	case *CompensationFailedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = CompensationFailedData{}
	case *ReconciliationResolvedData:
		if d.fastDecode(&r) {
			return true
		}
		*d = ReconciliationResolvedData{}
	case *EscalationData:
		if d.fastDecode(&r) {
			return true
		}
		*d = EscalationData{}
	case *DecisionData:
		if d.fastDecode(&r) {
			return true
		}
		*d = DecisionData{}
	}
	return false
}

// The fastDecode methods read the members of one data type; the names are
// its json tags (TestFastDecodeKnowsEveryField keeps them in step).

func (d *IntentData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "args":
			ok = r.raw(&d.Args)
		case "principal":
			ok = r.str(&d.Principal)
		case "payload_hash":
			ok = r.str(&d.PayloadHash)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *IntentRejectedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "reason":
			ok = r.str(&d.Reason)
		case "payload_hash":
			ok = r.str(&d.PayloadHash)
		case "principal":
			ok = r.str(&d.Principal)
		case "rejected_event_id":
			ok = r.str(&d.EventID)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *AttemptStartedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "downstream_key":
			ok = r.str(&d.DownstreamKey)
		case "worker":
			ok = r.str(&d.Worker)
		case "lease_until":
			ok = r.time(&d.LeaseUntil)
		case "backoff_waited_ms":
			ok = r.int64(&d.BackoffWaitedMS)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *AttemptSucceededData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "status_code":
			ok = r.int(&d.StatusCode)
		case "result":
			ok = r.raw(&d.Result)
		case "downstream_id":
			ok = r.str(&d.DownstreamID)
		case "undo_ref":
			ok = r.str(&d.UndoRef)
		case "late":
			ok = r.bool(&d.Late)
		case "precondition":
			ok = r.raw(&d.Precondition)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *AttemptFailedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "kind":
			ok = r.enum((*string)(&d.Kind), failureKindNames)
		case "error_class":
			ok = r.str(&d.ErrorClass)
		case "error":
			ok = r.str(&d.Error)
		case "status_code":
			ok = r.int(&d.StatusCode)
		case "retry_at":
			ok = r.timePtr(&d.RetryAt)
		case "late":
			ok = r.bool(&d.Late)
		case "precondition":
			ok = r.raw(&d.Precondition)
		case "response":
			ok = r.raw(&d.Response)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *AttemptUnknownData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "error_class":
			ok = r.str(&d.ErrorClass)
		case "error":
			ok = r.str(&d.Error)
		case "status_code":
			ok = r.int(&d.StatusCode)
		case "next":
			ok = r.enum((*string)(&d.Next), nextNames)
		case "retry_at":
			ok = r.timePtr(&d.RetryAt)
		case "late":
			ok = r.bool(&d.Late)
		case "precondition":
			ok = r.raw(&d.Precondition)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *CompensationStartedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "downstream_key":
			ok = r.str(&d.DownstreamKey)
		case "downstream_id":
			ok = r.str(&d.DownstreamID)
		case "worker":
			ok = r.str(&d.Worker)
		case "lease_until":
			ok = r.time(&d.LeaseUntil)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *CompensationSucceededData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "status_code":
			ok = r.int(&d.StatusCode)
		case "retry_at":
			ok = r.timePtr(&d.RetryAt)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *CompensationFailedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "outcome":
			ok = r.enum((*string)(&d.Outcome), outcomeNames)
		case "error_class":
			ok = r.str(&d.ErrorClass)
		case "error":
			ok = r.str(&d.Error)
		case "status_code":
			ok = r.int(&d.StatusCode)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *ReconciliationResolvedData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "found":
			ok = r.bool(&d.Found)
		case "result":
			ok = r.raw(&d.Result)
		case "downstream_id":
			ok = r.str(&d.DownstreamID)
		case "source":
			ok = r.str(&d.Source)
		case "retry_at":
			ok = r.timePtr(&d.RetryAt)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *EscalationData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "reason":
			ok = r.str(&d.Reason)
		case "request":
			ok = r.raw(&d.Request)
		case "downstream":
			ok = r.raw(&d.Downstream)
		case "proposed_action":
			ok = r.enum((*string)(&d.ProposedAction), actionNames)
		case "detail":
			ok = r.str(&d.Detail)
		case "approvers":
			ok = r.int(&d.Approvers)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}

func (d *DecisionData) fastDecode(r *fastReader) bool {
	for r.more() {
		var ok bool
		switch string(r.name) {
		case "action":
			ok = r.enum((*string)(&d.Action), actionNames)
		case "note":
			ok = r.str(&d.Note)
		case "approver":
			ok = r.str(&d.Approver)
		case "retry_at":
			ok = r.timePtr(&d.RetryAt)
		case "downstream_id":
			ok = r.str(&d.DownstreamID)
		case "result":
			ok = r.raw(&d.Result)
		}
		if !ok {
			return false
		}
	}
	return r.closed()
}
