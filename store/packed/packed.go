// Package packed is how the journals store an event's envelope: the same
// bytes, compressed against a dictionary of typical envelopes.
//
// An envelope is a few hundred bytes of JSON, most of it the same in every
// event (the field names, the event types, the tool and class names, the
// shape of a timestamp). A general-purpose compressor gains little on so
// short an input, and PostgreSQL compresses nothing in a row under about
// 2 KB. Compressed against a dictionary that already holds those parts,
// what is left is mostly what is new in this event: its id, its key, its
// time and its data. On the bench's envelopes that is 357 bytes down to
// 156 on average, for under a microsecond of CPU to pack and a seventh of
// one to unpack (docs/benchmarks.md, "Session 14").
//
// The format is S2's block format with a dictionary (github.com/klauspost/
// compress/s2), behind a one-byte tag that names the dictionary. Stored
// values that start with '{' are envelopes written before packing, or ones
// packing would not have made smaller: both are returned as they are, so
// old rows need no migration.
//
// A dictionary is frozen once rows may have been packed with it: changing
// a single byte would make every such row unreadable. A new dictionary gets
// a new tag and file, and Unpack keeps reading the old ones
// (TestDictionariesAreFrozen).
package packed

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/klauspost/compress/s2"
)

// tagV1 starts a value packed with dictionary-v1.jsonl. It cannot start
// JSON text, whose first byte is '{' here.
const tagV1 = 0x01

// MaxUnpacked bounds what Unpack will allocate for one value: a packed
// value's header states its length, and a damaged header must not make a
// reader allocate gigabytes. It is well above events.MaxEnvelopeBytes.
const MaxUnpacked = 16 << 20

//go:embed dictionary-v1.jsonl
var dictionaryV1 []byte

// v1 is built once; an s2.Dict is safe for concurrent use. The repeat
// offset starts at the last envelope's opening, where every envelope
// begins the same way.
var v1 = s2.MakeDict(dictionaryV1, []byte(`{"event_id":"`))

// ErrCorrupt reports a stored value that is neither plain JSON nor a
// packed envelope that decodes.
var ErrCorrupt = errors.New("packed: not a stored envelope")

// Pack returns env as the journal stores it. A JSON object that packing
// would not shrink, or too long to unpack, is stored as it is; anything
// else is packed whatever its size, so that Unpack reads every value Pack
// returns.
func Pack(env []byte) []byte {
	plain := len(env) > 0 && env[0] == '{'
	if len(env) == 0 || (plain && len(env) > MaxUnpacked) {
		return env
	}
	buf := make([]byte, 1+s2.MaxEncodedLen(len(env)))
	buf[0] = tagV1
	// Encode writes into buf[1:], which is long enough for any output.
	n := len(v1.Encode(buf[1:], env))
	if plain && 1+n >= len(env) {
		return env
	}
	return buf[:1+n]
}

// Unpack returns the envelope a stored value holds. A plain value is
// returned as it is, not copied.
func Unpack(stored []byte) ([]byte, error) {
	if len(stored) == 0 || stored[0] == '{' {
		return stored, nil
	}
	if stored[0] != tagV1 {
		return nil, fmt.Errorf("%w: unknown tag %#x", ErrCorrupt, stored[0])
	}
	n, err := s2.DecodedLen(stored[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if n > MaxUnpacked {
		return nil, fmt.Errorf("%w: states %d bytes, more than %d", ErrCorrupt, n, MaxUnpacked)
	}
	out, err := v1.Decode(nil, stored[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return out, nil
}
