package events

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// ErrInvalidJSON is wrapped by every error Canonicalize and PayloadHash
// return. Callers test for it with errors.Is to tell "the producer sent
// something we refuse to hash" apart from their own failures, and to answer
// with a client error rather than retrying.
var ErrInvalidJSON = errors.New("invalid JSON")

// canonMaxDepth bounds how deeply arrays and objects may nest. Arguments come
// from untrusted callers; a bound turns a hostile document into an ordinary
// ErrInvalidJSON instead of unbounded recursion, and 128 is far beyond any
// real tool-call payload.
const canonMaxDepth = 128

// Canonicalize rewrites a JSON document into its RFC 8785 (JSON
// Canonicalization Scheme) form.
//
// A payload hash is only useful if every producer, in whatever language and
// with whatever serializer, derives the same bytes for the same value: key
// order, whitespace, escaping choices and number spellings ("1.0", "1",
// "1e0") all vary between serializers without changing meaning. RFC 8785
// pins each of those choices to what ECMAScript's JSON.stringify does, so a
// producer written in JavaScript, Python, Java or Go can compute a matching
// hash with an off-the-shelf JCS library and no knowledge of this code.
//
// Canonicalize is strict where leniency would let two producers disagree:
// duplicate keys (whose meaning differs between parsers), invalid UTF-8 and
// lone surrogate escapes (which parsers silently repair in different ways),
// numbers that do not fit an IEEE-754 double (which JCS cannot represent),
// and anything after the top-level value are all rejected with an error
// wrapping ErrInvalidJSON.
func Canonicalize(raw []byte) ([]byte, error) {
	s := canonGet(raw)
	defer canonPut(s)
	if err := s.run(); err != nil {
		return nil, err
	}
	return append(make([]byte, 0, len(s.out)), s.out...), nil
}

// PayloadHash returns the lowercase hex SHA-256 of the canonical form of
// args. Hashing the canonical form rather than the bytes received means a
// retry re-serialized by a different client library still matches the
// original call. Absent arguments (len 0) hash as the empty object, so "no
// arguments" and "{}" are the same call.
func PayloadHash(args []byte) (string, error) {
	if len(args) == 0 {
		args = []byte("{}")
	}
	s := canonGet(args)
	defer canonPut(s)
	if err := s.run(); err != nil {
		return "", err
	}
	return s.hash(), nil
}

// canonScanner canonicalizes in one pass over the input: each value is
// checked and written in canonical form to out as it is read, with no tree
// in between. Only objects need a second look: their members are written in
// input order, and when that is not the canonical order the object's bytes
// in out are permuted once it is closed (nested objects are already
// canonical by then, so every object is sorted exactly once).
//
// The scanner and its buffers are pooled, so canonicalizing a small payload
// allocates nothing but the result.
type canonScanner struct {
	raw []byte
	i   int // next byte of raw to read
	out []byte
	// members is a stack of the members of the objects being read; an object
	// owns the entries above the length it found when it opened.
	members []canonMember
	// keys holds the unescaped text of member names written with escapes in
	// the input; other names are read straight from raw.
	keys []byte
	// tmp is scratch for reordering an object.
	tmp []byte
}

// canonMember is one member of an object being read: its name, unescaped,
// and where its canonical `"name":value` text sits in out.
type canonMember struct {
	keyStart, keyEnd int
	keyEscaped       bool // the name is keys[keyStart:keyEnd], not raw[keyStart:keyEnd]
	start, end       int
	index            int // position in the input, to report duplicates in input order
}

var canonPool = sync.Pool{New: func() any { return new(canonScanner) }}

// canonPoolMaxBytes bounds the buffers a pooled scanner keeps, so one large
// document does not pin its memory for the life of the process.
const canonPoolMaxBytes = 64 << 10

func canonGet(raw []byte) *canonScanner {
	s := canonPool.Get().(*canonScanner)
	s.raw, s.i = raw, 0
	if cap(s.out) < len(raw) {
		s.out = make([]byte, 0, max(len(raw), 256))
	}
	return s
}

func canonPut(s *canonScanner) {
	if cap(s.out) > canonPoolMaxBytes || cap(s.tmp) > canonPoolMaxBytes ||
		cap(s.keys) > canonPoolMaxBytes || cap(s.members) > canonPoolMaxBytes/64 {
		return
	}
	s.raw = nil
	s.out, s.members, s.keys, s.tmp = s.out[:0], s.members[:0], s.keys[:0], s.tmp[:0]
	canonPool.Put(s)
}

func (s *canonScanner) hash() string {
	sum := sha256.Sum256(s.out)
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], sum[:])
	return string(h[:])
}

// run canonicalizes s.raw into s.out.
func (s *canonScanner) run() error {
	var err error
	s.out, err = s.value(s.out[:0], 0)
	if err == nil {
		// Two documents glued together must not hash like the first one alone.
		if s.skipSpace(); s.i < len(s.raw) {
			err = fmt.Errorf("canonicalize: trailing data after top-level value: %w", ErrInvalidJSON)
		}
	}
	if err == nil {
		return nil
	}
	// Invalid UTF-8 and lone surrogates are reported first wherever they
	// are, as they were when they were checked before parsing: a document
	// that is wrong in several ways names the same fault it always did.
	if !utf8.Valid(s.raw) {
		return fmt.Errorf("canonicalize: input is not valid UTF-8: %w", ErrInvalidJSON)
	}
	if serr := canonCheckSurrogates(s.raw); serr != nil {
		return serr
	}
	return err
}

func (s *canonScanner) skipSpace() {
	for s.i < len(s.raw) {
		switch s.raw[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *canonScanner) errEnd() error {
	return fmt.Errorf("canonicalize: unexpected end of input: %w", ErrInvalidJSON)
}

func (s *canonScanner) errChar(context string) error {
	if s.i >= len(s.raw) {
		return s.errEnd()
	}
	return fmt.Errorf("canonicalize: invalid character %q at offset %d %s: %w", s.raw[s.i], s.i, context, ErrInvalidJSON)
}

// value reads the value at s.i and appends its canonical form to dst;
// depth is the nesting of its container. The output is threaded through
// arguments and results rather than kept in s, which keeps it in registers
// and spares a write barrier per append while the GC runs.
func (s *canonScanner) value(dst []byte, depth int) ([]byte, error) {
	s.skipSpace()
	if s.i >= len(s.raw) {
		return dst, s.errEnd()
	}
	switch c := s.raw[s.i]; c {
	case '{':
		return s.object(dst, depth+1)
	case '[':
		return s.array(dst, depth+1)
	case '"':
		dst, _, err := s.string(dst, true)
		return dst, err
	case 't':
		return s.literal(dst, "true")
	case 'f':
		return s.literal(dst, "false")
	case 'n':
		return s.literal(dst, "null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return s.number(dst)
		}
		return dst, s.errChar("looking for beginning of value")
	}
}

func (s *canonScanner) literal(dst []byte, lit string) ([]byte, error) {
	if len(s.raw)-s.i < len(lit) || string(s.raw[s.i:s.i+len(lit)]) != lit {
		for j := 0; j < len(lit) && s.i < len(s.raw) && s.raw[s.i] == lit[j]; j++ {
			s.i++
		}
		return dst, s.errChar("in literal " + lit)
	}
	s.i += len(lit)
	return append(dst, lit...), nil
}

func (s *canonScanner) nestingError() error {
	return fmt.Errorf("canonicalize: nesting deeper than %d: %w", canonMaxDepth, ErrInvalidJSON)
}

func (s *canonScanner) array(dst []byte, depth int) ([]byte, error) {
	if depth > canonMaxDepth {
		return dst, s.nestingError()
	}
	s.i++ // '['
	dst = append(dst, '[')
	if s.skipSpace(); s.i < len(s.raw) && s.raw[s.i] == ']' {
		s.i++
		return append(dst, ']'), nil
	}
	for {
		var err error
		if dst, err = s.value(dst, depth); err != nil {
			return dst, err
		}
		if s.skipSpace(); s.i >= len(s.raw) {
			return dst, s.errEnd()
		}
		switch s.raw[s.i] {
		case ',':
			s.i++
			dst = append(dst, ',')
		case ']':
			s.i++
			return append(dst, ']'), nil
		default:
			return dst, s.errChar("after array element")
		}
	}
}

func (s *canonScanner) object(dst []byte, depth int) ([]byte, error) {
	if depth > canonMaxDepth {
		return dst, s.nestingError()
	}
	s.i++ // '{'
	open := len(dst)
	dst = append(dst, '{')
	// Members and unescaped names are popped once the object is closed;
	// after an error the scanner is reset as a whole.
	base, keysBase := len(s.members), len(s.keys)
	if s.skipSpace(); s.i < len(s.raw) && s.raw[s.i] == '}' {
		s.i++
		return append(dst, '}'), nil
	}
	for {
		if s.skipSpace(); s.i >= len(s.raw) || s.raw[s.i] != '"' {
			return dst, s.errChar("looking for beginning of object key string")
		}
		m := canonMember{start: len(dst), index: len(s.members) - base}
		keyAt := s.i
		var escaped bool
		var err error
		if dst, escaped, err = s.string(dst, true); err != nil {
			return dst, err
		}
		if escaped {
			// Names are compared unescaped, so "a" and "\u0061" collide.
			end := s.i
			s.i = keyAt
			m.keyStart, m.keyEscaped = len(s.keys), true
			s.keys, _, _ = s.string(s.keys, false)
			m.keyEnd = len(s.keys)
			s.i = end
		} else {
			m.keyStart, m.keyEnd = keyAt+1, s.i-1
		}
		if s.skipSpace(); s.i >= len(s.raw) || s.raw[s.i] != ':' {
			return dst, s.errChar("after object key")
		}
		s.i++
		dst = append(dst, ':')
		if dst, err = s.value(dst, depth); err != nil {
			return dst, err
		}
		m.end = len(dst)
		s.members = append(s.members, m)

		if s.skipSpace(); s.i >= len(s.raw) {
			return dst, s.errEnd()
		}
		switch s.raw[s.i] {
		case ',':
			s.i++
			dst = append(dst, ',')
		case '}':
			s.i++
			dst = append(dst, '}')
			if err := s.sortMembers(dst, open, s.members[base:]); err != nil {
				return dst, err
			}
			s.members, s.keys = s.members[:base], s.keys[:keysBase]
			return dst, nil
		default:
			return dst, s.errChar("after object key:value pair")
		}
	}
}

func (s *canonScanner) key(m *canonMember) []byte {
	if m.keyEscaped {
		return s.keys[m.keyStart:m.keyEnd]
	}
	return s.raw[m.keyStart:m.keyEnd]
}

// sortMembers puts the members of the object written at dst[open:] in the
// order of RFC 8785 §3.2.3, and rejects duplicate names: parsers disagree on
// which duplicate wins, so none may.
func (s *canonScanner) sortMembers(dst []byte, open int, ms []canonMember) error {
	// Most objects arrive in order (Go's encoding/json sorts map keys), and
	// checking costs one comparison per member.
	sorted := true
	for j := 1; j < len(ms); j++ {
		c := canonCompareKeys(s.key(&ms[j-1]), s.key(&ms[j]))
		if c == 0 {
			return s.duplicateError(&ms[j])
		}
		if c > 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return nil
	}
	slices.SortFunc(ms, func(a, b canonMember) int {
		if c := canonCompareKeys(s.key(&a), s.key(&b)); c != 0 {
			return c
		}
		return a.index - b.index
	})
	// Equal names are now adjacent, the first occurrence first; report the
	// duplicate met first in the input, as a parser reading it would.
	var dup *canonMember
	for j := 1; j < len(ms); j++ {
		if string(s.key(&ms[j-1])) == string(s.key(&ms[j])) && (dup == nil || ms[j].index < dup.index) {
			dup = &ms[j]
		}
	}
	if dup != nil {
		return s.duplicateError(dup)
	}
	// Rewrite the members between the braces in their new order; the
	// length is unchanged, so they go back in place.
	body := dst[open+1 : len(dst)-1]
	s.tmp = append(s.tmp[:0], body...)
	w := 0
	for j, m := range ms {
		if j > 0 {
			body[w] = ','
			w++
		}
		w += copy(body[w:], s.tmp[m.start-open-1:m.end-open-1])
	}
	return nil
}

func (s *canonScanner) duplicateError(m *canonMember) error {
	return fmt.Errorf("canonicalize: duplicate object key %q: %w", s.key(m), ErrInvalidJSON)
}

// canonCompareKeys orders member names by their UTF-16 code units, which
// RFC 8785 §3.2.3 mandates so that ordering matches JavaScript's string
// comparison rather than any one language's byte order. a and b are valid
// UTF-8. UTF-8 byte order agrees with UTF-16 order except between a
// character above U+FFFF (a surrogate pair, 0xD800-0xDBFF first) and one in
// U+E000-U+FFFF, so bytes are compared and only the first differing
// character is looked at closer.
func canonCompareKeys(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	if a[i] < utf8.RuneSelf || b[i] < utf8.RuneSelf {
		return int(a[i]) - int(b[i])
	}
	// Back up to the start of the character both strings differ in.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return canonUTF16Rank(ra) - canonUTF16Rank(rb)
}

// canonUTF16Rank maps a character to a number that orders like its UTF-16
// encoding: characters above U+FFFF, encoded from 0xD800 on, sort between
// U+D7FF and U+E000.
func canonUTF16Rank(r rune) int {
	if r >= 0xE000 && r <= 0xFFFF {
		return int(r) + 0x200000
	}
	return int(r)
}

// string reads the string at s.i and appends it to dst: in canonical form
// with its quotes when canonical is set, else unescaped without quotes.
// escaped reports whether the input used escapes.
//
// The canonical form escapes exactly what RFC 8785 §3.2.2.2 (and
// JSON.stringify) escapes: '"', '\' and the C0 controls. Everything else,
// including '<', '>', '&', DEL and U+2028/U+2029, is written verbatim as
// UTF-8 — json.Marshal's HTML-safe escaping would change the hash.
func (s *canonScanner) string(dst []byte, canonical bool) (out []byte, escaped bool, err error) {
	raw := s.raw
	i := s.i + 1
	if canonical {
		dst = append(dst, '"')
	}
	start := i
	for i < len(raw) {
		c := raw[i]
		if canonPlain[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			// Invalid UTF-8 is refused, not repaired: two producers' bytes
			// would hash alike.
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				s.i = i
				return dst, escaped, fmt.Errorf("canonicalize: input is not valid UTF-8: %w", ErrInvalidJSON)
			}
			i += size
			continue
		}
		dst = append(dst, raw[start:i]...)
		if c == '"' {
			if canonical {
				dst = append(dst, '"')
			}
			s.i = i + 1
			return dst, escaped, nil
		}
		if c < 0x20 {
			s.i = i
			return dst, escaped, s.errChar("in string literal")
		}
		// A backslash.
		escaped = true
		if i+1 >= len(raw) {
			s.i = len(raw)
			return dst, escaped, s.errEnd()
		}
		var r rune
		switch raw[i+1] {
		case '"', '\\', '/':
			r = rune(raw[i+1])
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			r, err = s.unicodeEscape(i)
			if err != nil {
				return dst, escaped, err
			}
			if r > 0xFFFF {
				i += 6 // the low half of a surrogate pair
			}
			i += 4
		default:
			s.i = i + 1
			return dst, escaped, s.errChar("in string escape code")
		}
		i += 2
		start = i
		if canonical {
			dst = canonAppendRune(dst, r)
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	s.i = len(raw)
	return dst, escaped, s.errEnd()
}

// canonPlain marks the bytes a string copies through unchanged without a
// closer look: printable ASCII other than '"' and '\\'.
var canonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// unicodeEscape decodes the \u escape at s.raw[i:], joining a surrogate
// pair into one character. A lone half of a pair is refused: parsers
// replace it in different ways.
func (s *canonScanner) unicodeEscape(i int) (rune, error) {
	raw := s.raw
	hi, ok := canonHex4(raw, i+2)
	if !ok {
		s.i = i + 2
		return 0, fmt.Errorf("canonicalize: invalid \\u escape at offset %d: %w", i, ErrInvalidJSON)
	}
	switch {
	case hi >= 0xD800 && hi <= 0xDBFF:
		lo := -1
		if i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
			lo, _ = canonHex4(raw, i+8)
		}
		if lo < 0xDC00 || lo > 0xDFFF {
			return 0, fmt.Errorf("canonicalize: unpaired surrogate escape \\u%04x: %w", hi, ErrInvalidJSON)
		}
		return 0x10000 + rune(hi-0xD800)<<10 + rune(lo-0xDC00), nil
	case hi >= 0xDC00 && hi <= 0xDFFF:
		return 0, fmt.Errorf("canonicalize: unpaired surrogate escape \\u%04x: %w", hi, ErrInvalidJSON)
	}
	return rune(hi), nil
}

// canonAppendRune appends r as RFC 8785 writes it inside a string.
func canonAppendRune(dst []byte, r rune) []byte {
	const hexDigits = "0123456789abcdef"
	switch r {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\t':
		return append(dst, '\\', 't')
	case '\n':
		return append(dst, '\\', 'n')
	case '\f':
		return append(dst, '\\', 'f')
	case '\r':
		return append(dst, '\\', 'r')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(dst, r)
}

// number reads the number at s.i and writes it as ECMAScript's
// Number.prototype.toString would (RFC 8785 §3.2.2.3), the one spelling
// every JCS implementation agrees on.
func (s *canonScanner) number(dst []byte) ([]byte, error) {
	raw := s.raw
	start, i := s.i, s.i
	if raw[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(raw) && raw[i] == '0':
		i++
	case i < len(raw) && '1' <= raw[i] && raw[i] <= '9':
		for i < len(raw) && '0' <= raw[i] && raw[i] <= '9' {
			i++
		}
	default:
		s.i = i
		return dst, s.errChar("in numeric literal")
	}
	intDigits := i - digits
	integer := true
	if i < len(raw) && raw[i] == '.' {
		integer = false
		i++
		if i >= len(raw) || raw[i] < '0' || raw[i] > '9' {
			s.i = i
			return dst, s.errChar("after decimal point in numeric literal")
		}
		for i < len(raw) && '0' <= raw[i] && raw[i] <= '9' {
			i++
		}
	}
	if i < len(raw) && (raw[i] == 'e' || raw[i] == 'E') {
		integer = false
		i++
		if i < len(raw) && (raw[i] == '+' || raw[i] == '-') {
			i++
		}
		if i >= len(raw) || raw[i] < '0' || raw[i] > '9' {
			s.i = i
			return dst, s.errChar("in exponent of numeric literal")
		}
		for i < len(raw) && '0' <= raw[i] && raw[i] <= '9' {
			i++
		}
	}
	s.i = i
	lit := raw[start:i]
	// An integer of at most 15 digits without a leading zero is below 2^53,
	// so it is a double exactly and distinct from every other integer's
	// double; its shortest round-trip digits are its own (less trailing
	// zeros, which the integer form puts back), so ECMAScript prints it as
	// written. Only -0, which prints as 0, needs the general path.
	if integer && intDigits <= 15 && (raw[digits] != '0' || digits == start) {
		return append(dst, lit...), nil
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return dst, fmt.Errorf("canonicalize: number %s: %v: %w", lit, err, ErrInvalidJSON)
	}
	dst, ok := canonAppendFloat(dst, f)
	if !ok {
		return dst, fmt.Errorf("canonicalize: number %s is not finite: %w", lit, ErrInvalidJSON)
	}
	return dst, nil
}

// canonCheckSurrogates rejects \u escapes that encode half of a surrogate
// pair. Backslashes can only legally occur inside strings, so a flat scan
// that steps over each escape is enough; other malformed escapes are left
// to the scanner. The scanner refuses lone surrogates itself; run calls this
// only once a document failed, to name the fault that ranks first.
func canonCheckSurrogates(raw []byte) error {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+1 >= len(raw) {
			return nil
		}
		if raw[i+1] != 'u' {
			i++ // step over the escaped character, e.g. the second '\' of "\\"
			continue
		}
		r, ok := canonHex4(raw, i+2)
		if !ok {
			i++
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := -1, false
			if i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
				lo, ok = canonHex4(raw, i+8)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return fmt.Errorf("canonicalize: unpaired surrogate escape \\u%04x: %w", r, ErrInvalidJSON)
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return fmt.Errorf("canonicalize: unpaired surrogate escape \\u%04x: %w", r, ErrInvalidJSON)
		default:
			i += 5
		}
	}
	return nil
}

// canonHex4 decodes the four hex digits at raw[at:at+4].
func canonHex4(raw []byte, at int) (int, bool) {
	if at < 0 || at+4 > len(raw) {
		return 0, false
	}
	n := 0
	for _, c := range raw[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		n = n<<4 | int(c)
	}
	return n, true
}

// canonFormatFloat implements ECMAScript Number::toString for finite f;
// ok is false for NaN and ±Inf, which JSON cannot carry.
func canonFormatFloat(f float64) (string, bool) {
	b, ok := canonAppendFloat(nil, f)
	return string(b), ok
}

// canonAppendFloat appends ECMAScript's Number::toString of f to dst; ok
// is false for NaN and ±Inf, which JSON cannot carry.
func canonAppendFloat(dst []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, false
	}
	if f == 0 { // also -0, which ECMAScript prints as "0"
		return append(dst, '0'), true
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	// Shortest round-trip digits d1.d2d3...e±x; in ECMAScript's terms the
	// digit string is digits (k of them) and the decimal exponent n = x+1,
	// so that f = 0.digits × 10^n.
	var eBuf, dBuf [32]byte
	e := strconv.AppendFloat(eBuf[:0], f, 'e', -1, 64)
	digits := append(dBuf[:0], e[0])
	j := 1
	if e[1] == '.' {
		for j = 2; e[j] != 'e'; j++ {
		}
		digits = append(digits, e[2:j]...)
	}
	x := 0
	for _, c := range e[j+2:] { // after 'e' and its sign
		x = x*10 + int(c-'0')
	}
	if e[j+1] == '-' {
		x = -x
	}
	k, n := len(digits), x+1

	switch {
	case k <= n && n <= 21: // integer: digits then zeros
		dst = append(dst, digits...)
		for range n - k {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21: // decimal point inside the digits
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0: // small: "0.000ddd"
		dst = append(dst, '0', '.')
		for range -n {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default: // exponent form: d[.ddd]e±x
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst, true
}
