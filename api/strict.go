package api

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// strictBody reports why a request body is ambiguous, or "" when it is not.
// encoding/json accepts, and other parsers read differently, a top-level
// member given twice (Go keeps the last, others the first: an intent with
// two operation_key members would mean one key to this server and another
// to a proxy that logged it), bytes that are not UTF-8, and escapes of half
// a surrogate pair; the last two it turns into U+FFFD, so an operation key
// holding them would be recorded as another key than the one sent.
func strictBody(body []byte) (field, reason string) {
	if !utf8.Valid(body) {
		return "", "the body must be UTF-8"
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return "", "" // not an object: the decoder's own error says so
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", ""
		}
		name, _ := tok.(string)
		if seen[name] {
			return name, "member " + strconv.Quote(name) + " is given twice"
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", ""
		}
		if len(raw) > 0 && raw[0] == '"' && loneSurrogate(raw) {
			return name, name + " holds the escape of half a surrogate pair, which is no character"
		}
	}
	return "", ""
}

// loneSurrogate reports whether a JSON string literal holds a \u escape
// of a surrogate that is not half of a pair.
func loneSurrogate(lit []byte) bool {
	for i := 0; i+5 < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		if lit[i+1] != 'u' {
			i++ // skip the escaped character, which may be a backslash
			continue
		}
		r, ok := hex4(lit[i+2:])
		if !ok {
			return false // not valid JSON; the decoder refuses it
		}
		switch {
		case utf16.IsSurrogate(rune(r)) && r < 0xDC00:
			if i+7 < len(lit) && lit[i+6] == '\\' && lit[i+7] == 'u' {
				if lo, ok := hex4(lit[i+8:]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
			}
			return true
		case utf16.IsSurrogate(rune(r)):
			return true
		}
		i += 5
	}
	return false
}

func hex4(b []byte) (uint16, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return uint16(n), err == nil
}
