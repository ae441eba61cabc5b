// Package packed is how the store keeps an event's envelope in the
// journals and an operation's record in its head row: the same bytes,
// compressed against a dictionary of typical ones.
//
// An envelope is a few hundred bytes of JSON, most of it the same in every
// event (the field names, the event types, the tool and class names, the
// shape of a timestamp). A general-purpose compressor gains little on so
// short an input, and PostgreSQL compresses nothing in a row under about
// 2 KB. Compressed against a dictionary that already holds those parts,
// what is left is mostly what is new in this event: its id, its key, its
// time and its data. On the bench's envelopes that is 357 bytes down to
// 156 on average, for under a microsecond of CPU to pack and a seventh of
// one to unpack (docs/benchmarks.md, "Session 14"); a head record, 553
// bytes of JSON (637 as jsonb), down to 177 ("Session 15").
//
// A dictionary cannot hold what is new in every row, but one thing new in
// a row is known to its reader: the row's key, which its envelope names
// (operation_key) and its record too (downstream_key). Pack leaves each
// occurrence of the key, as a JSON string, out of the value, and Unpack,
// given the same key, puts it back: about 38 bytes less per envelope and
// record for a 40-character key.
//
// The format is S2's block format with a dictionary (github.com/klauspost/
// compress/s2), behind a one-byte tag that names the dictionary (and
// whether the key was left out). Stored
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
	"bytes"
	_ "embed"
	"errors"
	"fmt"

	"github.com/klauspost/compress/s2"
)

// tagV1 and tagV2 start a value packed with dictionary-v1.jsonl and
// dictionary-v2.jsonl. No tag can start JSON text, whose first byte is '{'
// here.
const (
	tagV1 = 0x01
	tagV2 = 0x02
	// tagV2Keyed is tagV2 for a value whose row's key was left out of it
	// (Pack).
	tagV2Keyed = 0x03
)

// MaxUnpacked bounds what Unpack will allocate for one value: a packed
// value's header states its length, and a damaged header must not make a
// reader allocate gigabytes. It is well above events.MaxEnvelopeBytes.
const MaxUnpacked = 16 << 20

// dictionaryV1 is a dozen envelopes of both journals from a `dev --demo`
// run. Values packed with it are still read; new ones use v2.
//
//go:embed dictionary-v1.jsonl
var dictionaryV1 []byte

// dictionaryV2 is the head records of a `dev --demo` run (the bodies
// events.MarshalOperationBody writes, a card number replaced), then v1's
// envelopes. Envelopes pack as small as with v1 (S2 finds matches anywhere
// in the dictionary); head records pack to about a third instead of about
// a half, because their member names are in it.
//
//go:embed dictionary-v2.jsonl
var dictionaryV2 []byte

// The dictionaries are built once; an s2.Dict is safe for concurrent use.
// The repeat offset starts at an envelope's opening, where every envelope
// begins the same way.
var (
	v1 = s2.MakeDict(dictionaryV1, []byte(`{"event_id":"`))
	v2 = s2.MakeDict(dictionaryV2, []byte(`{"event_id":"`))
)

// ErrCorrupt reports a stored value that is neither plain JSON nor a
// packed envelope that decodes.
var ErrCorrupt = errors.New("packed: not a stored envelope")

// keyMark stands, in a value packed with tagV2Keyed, for its row's key
// as a JSON string (the key between double quotes). JSON text never holds
// a raw NUL (a string must escape it), and a value that does is not
// marked, so the mark is unambiguous.
const keyMark = 0x00

// Pack returns v (an envelope or a record) as the store keeps it in the
// row of key, packed with the newest dictionary. Each occurrence of the
// key as a JSON string is left out (every envelope names its operation,
// and a record its downstream key, and a dictionary cannot hold a key it
// has never seen); Unpack with the same key puts it back. key "" packs
// the value as it is. A JSON object that packing would not shrink, or too
// long to unpack, is stored as it is; anything else is packed whatever its
// size, so that Unpack reads every value Pack returns.
func Pack(v []byte, key string) []byte {
	plain := len(v) > 0 && v[0] == '{'
	if len(v) == 0 || (plain && len(v) > MaxUnpacked) {
		return v
	}
	tag, src := byte(tagV2), v
	if key != "" && bytes.IndexByte(v, keyMark) < 0 {
		if q := quoted(key); bytes.Contains(v, q) {
			// Replacing left to right and expanding every mark again gives
			// back exactly v, however the occurrences sit.
			tag, src = tagV2Keyed, bytes.ReplaceAll(v, q, []byte{keyMark})
		}
	}
	buf := make([]byte, 1+s2.MaxEncodedLen(len(src)))
	buf[0] = tag
	// Encode writes into buf[1:], which is long enough for any output.
	n := len(v2.Encode(buf[1:], src))
	if plain && 1+n >= len(v) {
		return v
	}
	return buf[:1+n]
}

func quoted(key string) []byte { return []byte(`"` + key + `"`) }

// Unpack returns the value a stored one holds, whichever dictionary packed
// it; key is the key of the row it was stored in, as given to Pack. A
// plain value is returned as it is, not copied.
func Unpack(stored []byte, key string) ([]byte, error) {
	if len(stored) == 0 || stored[0] == '{' {
		return stored, nil
	}
	var dict *s2.Dict
	switch stored[0] {
	case tagV1:
		dict = v1
	case tagV2, tagV2Keyed:
		dict = v2
	default:
		return nil, fmt.Errorf("%w: unknown tag %#x", ErrCorrupt, stored[0])
	}
	n, err := s2.DecodedLen(stored[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if n > MaxUnpacked {
		return nil, fmt.Errorf("%w: states %d bytes, more than %d", ErrCorrupt, n, MaxUnpacked)
	}
	out, err := dict.Decode(nil, stored[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if stored[0] != tagV2Keyed {
		return out, nil
	}
	if key == "" {
		return nil, fmt.Errorf("%w: a value packed without its key needs the key of its row", ErrCorrupt)
	}
	marks := bytes.Count(out, []byte{keyMark})
	if n+marks*(len(key)+1) > MaxUnpacked {
		return nil, fmt.Errorf("%w: holds more than %d bytes with its key", ErrCorrupt, MaxUnpacked)
	}
	return bytes.ReplaceAll(out, []byte{keyMark}, quoted(key)), nil
}
