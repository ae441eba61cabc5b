package events

// This file keeps the Canonicalize of commit 2f6e093, built on
// json.Decoder.Token and an interface{} tree, as the reference the
// single-pass scanner in canonical.go is checked against
// (canonical_diff_test.go). It is test code only: do not call it from the
// package.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

func refCanonicalize(raw []byte) ([]byte, error) {
	// encoding/json quietly replaces invalid UTF-8 and unpaired surrogate
	// escapes with U+FFFD, which would make distinct inputs hash alike, so
	// both are rejected before the decoder can paper over them.
	if !utf8.Valid(raw) {
		return nil, fmt.Errorf("canonicalize: input is not valid UTF-8: %w", ErrInvalidJSON)
	}
	if err := refCanonCheckSurrogates(raw); err != nil {
		return nil, err
	}

	dec := json.NewDecoder(bytes.NewReader(raw))
	// Numbers are kept as their source text so they are parsed exactly once,
	// by strconv, with range errors visible to us.
	dec.UseNumber()

	tok, err := refCanonToken(dec)
	if err != nil {
		return nil, err
	}
	v, err := refCanonParse(dec, tok, 0)
	if err != nil {
		return nil, err
	}
	// Two documents glued together must not hash like the first one alone.
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return nil, fmt.Errorf("canonicalize: trailing data after top-level value: %w", ErrInvalidJSON)
		}
		return nil, fmt.Errorf("canonicalize: trailing data after top-level value: %v: %w", err, ErrInvalidJSON)
	}

	var buf bytes.Buffer
	buf.Grow(len(raw))
	refCanonWrite(&buf, v)
	return buf.Bytes(), nil
}

// refCanonNumber is a number already rendered in its canonical spelling.
type refCanonNumber string

// refCanonMember is one object member; key16 is the key's UTF-16 code units,
// which RFC 8785 §3.2.3 mandates as the sort key so that ordering matches
// JavaScript's string comparison rather than any one language's byte order.
type refCanonMember struct {
	key   string
	key16 []uint16
	value any
}

// refCanonObject is an object whose members are already in canonical order.
type refCanonObject []refCanonMember

// refCanonToken reads one token, classifying any decoder failure as
// ErrInvalidJSON (including a document that ends early).
func refCanonToken(dec *json.Decoder) (json.Token, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("canonicalize: unexpected end of input: %w", ErrInvalidJSON)
		}
		return nil, fmt.Errorf("canonicalize: %v: %w", err, ErrInvalidJSON)
	}
	return tok, nil
}

// refCanonParse turns the value starting at tok into its canonical tree:
// strings, refCanonNumber, bool, nil, []any and refCanonObject.
func refCanonParse(dec *json.Decoder, tok json.Token, depth int) (any, error) {
	switch t := tok.(type) {
	case json.Delim:
		if t != '{' && t != '[' {
			return nil, fmt.Errorf("canonicalize: unexpected %q: %w", rune(t), ErrInvalidJSON)
		}
		depth++
		if depth > canonMaxDepth {
			return nil, fmt.Errorf("canonicalize: nesting deeper than %d: %w", canonMaxDepth, ErrInvalidJSON)
		}
		if t == '[' {
			return refCanonParseArray(dec, depth)
		}
		return refCanonParseObject(dec, depth)
	case string:
		return t, nil
	case json.Number:
		s, err := refCanonFormatNumber(string(t))
		if err != nil {
			return nil, err
		}
		return refCanonNumber(s), nil
	case bool, nil:
		return t, nil
	default:
		return nil, fmt.Errorf("canonicalize: unexpected token %v: %w", tok, ErrInvalidJSON)
	}
}

func refCanonParseArray(dec *json.Decoder, depth int) (any, error) {
	elems := []any{}
	for dec.More() {
		tok, err := refCanonToken(dec)
		if err != nil {
			return nil, err
		}
		v, err := refCanonParse(dec, tok, depth)
		if err != nil {
			return nil, err
		}
		elems = append(elems, v)
	}
	if _, err := refCanonToken(dec); err != nil { // the closing ']'
		return nil, err
	}
	return elems, nil
}

func refCanonParseObject(dec *json.Decoder, depth int) (any, error) {
	var members refCanonObject
	seen := map[string]struct{}{}
	for dec.More() {
		tok, err := refCanonToken(dec)
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("canonicalize: object key is not a string: %w", ErrInvalidJSON)
		}
		// Keys are compared after unescaping, so "a" and "\u0061" collide:
		// parsers disagree on which duplicate wins, so none may.
		if _, dup := seen[key]; dup {
			return nil, fmt.Errorf("canonicalize: duplicate object key %q: %w", key, ErrInvalidJSON)
		}
		seen[key] = struct{}{}
		tok, err = refCanonToken(dec)
		if err != nil {
			return nil, err
		}
		v, err := refCanonParse(dec, tok, depth)
		if err != nil {
			return nil, err
		}
		members = append(members, refCanonMember{key: key, key16: utf16.Encode([]rune(key)), value: v})
	}
	if _, err := refCanonToken(dec); err != nil { // the closing '}'
		return nil, err
	}
	slices.SortFunc(members, func(a, b refCanonMember) int { return slices.Compare(a.key16, b.key16) })
	return members, nil
}

// refCanonCheckSurrogates rejects \u escapes that encode half of a surrogate
// pair. Backslashes can only legally occur inside strings, so a flat scan
// that steps over each escape is enough; other malformed escapes are left
// for the decoder to report.
func refCanonCheckSurrogates(raw []byte) error {
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
		r, ok := refCanonHex4(raw, i+2)
		if !ok {
			i++
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := -1, false
			if i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
				lo, ok = refCanonHex4(raw, i+8)
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

// refCanonHex4 decodes the four hex digits at raw[at:at+4].
func refCanonHex4(raw []byte, at int) (int, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(raw[at:at+4]), 16, 16)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// refCanonFormatNumber parses a JSON number literal as an IEEE-754 double and
// renders it as ECMAScript's Number.prototype.toString would (RFC 8785
// §3.2.2.3), the one spelling every JCS implementation agrees on.
func refCanonFormatNumber(lit string) (string, error) {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return "", fmt.Errorf("canonicalize: number %s: %v: %w", lit, err, ErrInvalidJSON)
	}
	s, ok := refCanonFormatFloat(f)
	if !ok {
		return "", fmt.Errorf("canonicalize: number %s is not finite: %w", lit, ErrInvalidJSON)
	}
	return s, nil
}

// refCanonFormatFloat implements ECMAScript Number::toString for finite f;
// ok is false for NaN and ±Inf, which JSON cannot carry.
func refCanonFormatFloat(f float64) (string, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", false
	}
	if f == 0 { // also -0, which ECMAScript prints as "0"
		return "0", true
	}
	var sb strings.Builder
	if f < 0 {
		sb.WriteByte('-')
		f = -f
	}
	// Shortest round-trip digits d1.d2d3...e±x; in ECMAScript's terms the
	// digit string is s (k digits) and the decimal exponent n = x+1, so that
	// f = 0.s × 10^n.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(expStr)
	k, n := len(digits), x+1

	switch {
	case k <= n && n <= 21: // integer: digits then zeros
		sb.WriteString(digits)
		sb.WriteString(strings.Repeat("0", n-k))
	case 0 < n && n <= 21: // decimal point inside the digits
		sb.WriteString(digits[:n])
		sb.WriteByte('.')
		sb.WriteString(digits[n:])
	case -6 < n && n <= 0: // small: "0.000ddd"
		sb.WriteString("0.")
		sb.WriteString(strings.Repeat("0", -n))
		sb.WriteString(digits)
	default: // exponent form: d[.ddd]e±x
		sb.WriteByte(digits[0])
		if k > 1 {
			sb.WriteByte('.')
			sb.WriteString(digits[1:])
		}
		sb.WriteByte('e')
		if n-1 >= 0 {
			sb.WriteByte('+')
		}
		sb.WriteString(strconv.Itoa(n - 1))
	}
	return sb.String(), true
}

// refCanonWrite serializes a canonical tree with no insignificant whitespace.
func refCanonWrite(buf *bytes.Buffer, v any) {
	switch t := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case refCanonNumber:
		buf.WriteString(string(t))
	case string:
		refCanonWriteString(buf, t)
	case []any:
		buf.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			refCanonWrite(buf, e)
		}
		buf.WriteByte(']')
	case refCanonObject:
		buf.WriteByte('{')
		for i, m := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			refCanonWriteString(buf, m.key)
			buf.WriteByte(':')
			refCanonWrite(buf, m.value)
		}
		buf.WriteByte('}')
	}
}

// refCanonWriteString escapes exactly what RFC 8785 §3.2.2.2 (and
// JSON.stringify) escapes: '"', '\' and the C0 controls. Everything else,
// including '<', '>', '&', DEL and U+2028/U+2029, is written verbatim as
// UTF-8 — json.Marshal's HTML-safe escaping would change the hash.
func refCanonWriteString(buf *bytes.Buffer, s string) {
	const hexDigits = "0123456789abcdef"
	buf.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf.WriteString(s[start:i])
		switch c {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\t':
			buf.WriteString(`\t`)
		case '\n':
			buf.WriteString(`\n`)
		case '\f':
			buf.WriteString(`\f`)
		case '\r':
			buf.WriteString(`\r`)
		default:
			buf.WriteString(`\u00`)
			buf.WriteByte(hexDigits[c>>4])
			buf.WriteByte(hexDigits[c&0xF])
		}
		start = i + 1
	}
	buf.WriteString(s[start:])
	buf.WriteByte('"')
}
