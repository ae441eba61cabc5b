package events

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// ErrInvalidOperationKey is wrapped by every error CheckOperationKey returns.
var ErrInvalidOperationKey = errors.New("invalid operation key")

// CheckOperationKey is the one rule for operation keys, applied wherever a
// key enters: the HTTP API, outbox.Append and the envelope decoder. A key is
// non-empty, valid UTF-8, at most MaxOperationKeyBytes bytes and free of
// control characters (C0, DEL, C1).
//
// Keys become primary keys, Kafka message keys, URL path segments and log
// attributes. A rule enforced in one door but not another lets a key in that
// the other doors then cannot name: a key with a newline recorded through the
// outbox could not be read over HTTP, and invalid UTF-8 that a JSON decoder
// silently turns into U+FFFD makes two different keys collide and leaves
// the caller unable to find its own.
//
// The error says what is wrong without quoting the key.
func CheckOperationKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidOperationKey)
	case len(key) > MaxOperationKeyBytes:
		return fmt.Errorf("%w: %d bytes, over the %d byte limit", ErrInvalidOperationKey, len(key), MaxOperationKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidOperationKey)
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character U+%04X at byte %d", ErrInvalidOperationKey, r, i)
		}
	}
	return nil
}

// operationKeyReason is CheckOperationKey's verdict without the sentinel's
// prefix, for errors that name the field themselves.
func operationKeyReason(err error) string {
	s := err.Error()
	if p := ErrInvalidOperationKey.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
