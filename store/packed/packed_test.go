package packed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var sampleEnvelopes = []string{
	`{"event_id":"8c037b65-977a-4d82-bc48-3bd5a2413542","type":"intent.recorded","operation_key":"history/05844f7bfc8b89f0512de7c545ad502c","seq":1,"occurred_at":"2026-12-04T22:40:07.159274681Z","tool":"bench.charge","effect_class":"irreversible","data":{"args":{"amount":269,"currency":"EUR"},"principal":"bench-agent"}}`,
	`{"event_id":"49cd3bd2-c2d3-46c2-8bd1-f4cf1d0b5bd6","type":"attempt.started","operation_key":"history/05844f7bfc8b89f0512de7c545ad502c","seq":2,"occurred_at":"2026-12-04T22:40:07.161208522Z","tool":"bench.charge","effect_class":"irreversible","attempt":1,"data":{"downstream_key":"history/05844f7bfc8b89f0512de7c545ad502c","worker":"vm-8377-f8a0","lease_until":"2026-12-04T22:40:37.161208522Z"}}`,
	`{"event_id":"7bcd8f24-9c7b-4675-af8e-28c13e832660","type":"attempt.succeeded","operation_key":"history/05844f7bfc8b89f0512de7c545ad502c","seq":3,"occurred_at":"2026-12-04T22:40:07.164872943Z","tool":"bench.charge","effect_class":"irreversible","attempt":1,"data":{"status_code":200,"result":{"id":"hist_92569","status":"succeeded"},"downstream_id":"hist_92569"}}`,
}

// sampleKey is the operation key of sampleEnvelopes and sampleHead.
const sampleKey = "history/05844f7bfc8b89f0512de7c545ad502c"

func TestPackedEnvelopesUnpackToTheSameBytes(t *testing.T) {
	for _, env := range sampleEnvelopes {
		stored := Pack([]byte(env), sampleKey)
		if stored[0] != tagV2Keyed {
			t.Fatalf("a typical envelope was stored plain or with its key: %q", stored)
		}
		if unkeyed := Pack([]byte(env), ""); len(stored)*2 > len(env) || len(stored)+len(sampleKey)/2 > len(unkeyed) {
			t.Errorf("packed %d bytes into %d (%d with the key): the dictionary no longer fits the envelopes, or the key stayed in", len(env), len(stored), len(unkeyed))
		}
		got, err := Unpack(stored, sampleKey)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != env {
			t.Fatalf("unpacked\n%s\nwant\n%s", got, env)
		}
		if _, err := Unpack(stored, ""); !errors.Is(err, ErrCorrupt) {
			t.Errorf("a value packed without its key unpacked without it: %v", err)
		}
		if got, _ := Unpack(stored, "other"); string(got) == env {
			t.Error("a value unpacked the same under another key: its key was not left out")
		}
	}
}

// TestLeavingTheKeyOutIsExact: whatever the value and the key, Unpack
// gives back what Pack was given.
func TestLeavingTheKeyOutIsExact(t *testing.T) {
	for _, c := range []struct{ v, key string }{
		{`{"a":"k","b":"k"}`, "k"},
		{`{"a":"k"k"}`, "k"},                  // occurrences sharing a quote
		{`["a","b"]`, ","},                    // a key that matches across strings
		{"{\"a\":\"k\",\"n\":\"\x00\"}", "k"}, // a raw NUL: not marked
		{`{"a":"k"}`, `"`},
		{`{"a":"x"}`, "k"}, // no occurrence
		{sampleHead, sampleKey},
	} {
		stored := Pack([]byte(c.v), c.key)
		if got, err := Unpack(stored, c.key); err != nil || string(got) != c.v {
			t.Errorf("Pack(%q, %q) unpacked to %q, %v", c.v, c.key, got, err)
		}
	}
}

// sampleHead is a head record as events.MarshalOperationBody writes it, of
// a tool the dictionaries were not made from.
const sampleHead = `{"principal":"bench-agent","args":{"amount":158,"currency":"EUR"},"phase":"attempt","attempt":1,"lease_until":null,"result":{"id":"hist_54258","status":"succeeded"},"downstream_id":"hist_54258","undo_ref":"","downstream_key":"history/05844f7bfc8b89f0512de7c545ad502c","compensations":0,"last_error_class":"","first_attempt_at":"2026-12-05T01:16:13.653529448Z","last_attempt_at":"2026-12-05T01:16:13.653529448Z","last_outcome_at":"2026-12-05T01:16:13.696278768Z","created_at":"2026-12-05T01:16:13.621459506Z","updated_at":"2026-12-05T01:16:13.696278768Z"}`

func TestPackedHeadRecordsUnpackToTheSameBytes(t *testing.T) {
	stored := Pack([]byte(sampleHead), sampleKey)
	if stored[0] != tagV2Keyed || len(stored)*3 > len(sampleHead) {
		t.Errorf("packed a %d-byte head record into %d: the dictionary no longer fits head records", len(sampleHead), len(stored))
	}
	if got, err := Unpack(stored, sampleKey); err != nil || string(got) != sampleHead {
		t.Fatalf("unpacked %q, %v", got, err)
	}
}

// TestValuesPackedWithAnOlderDictionaryStillUnpack: rows written before
// dictionary v2 hold v1 values.
func TestValuesPackedWithAnOlderDictionaryStillUnpack(t *testing.T) {
	for _, env := range append(sampleEnvelopes, sampleHead) {
		stored := append([]byte{tagV1}, v1.Encode(nil, []byte(env))...)
		if got, err := Unpack(stored, ""); err != nil || string(got) != env {
			t.Fatalf("a v1 value unpacked to %q, %v", got, err)
		}
	}
}

func TestPlainValuesAreReadAsTheyAre(t *testing.T) {
	// Rows written before packing, and values packing would not shrink.
	for _, v := range []string{sampleEnvelopes[0], `{}`, ``} {
		got, err := Unpack([]byte(v), "")
		if err != nil || string(got) != v {
			t.Fatalf("Unpack(%q) = %q, %v", v, got, err)
		}
	}
	if got := Pack([]byte(`{}`), ""); string(got) != `{}` {
		t.Fatalf("a value packing cannot shrink was changed: %q", got)
	}
}

func TestDamagedValuesAreErrorsNotPanics(t *testing.T) {
	good := Pack([]byte(sampleEnvelopes[1]), "")
	for name, v := range map[string][]byte{
		"unknown tag":   append([]byte{0x7f}, good[1:]...),
		"truncated":     good[:len(good)/2],
		"tag only":      {tagV1},
		"huge length":   {tagV1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"flipped bytes": flip(good, 5),
	} {
		if _, err := Unpack(v, ""); !errors.Is(err, ErrCorrupt) {
			// A flipped literal byte can decode to other JSON; what
			// matters is that nothing panics and damage is not silent
			// where the format can see it.
			if name == "flipped bytes" {
				continue
			}
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

// TestDictionariesAreFrozen fails when a dictionary file changes. Rows
// packed with it would no longer unpack: add a new dictionary with a new
// tag instead, and keep reading this one.
func TestDictionariesAreFrozen(t *testing.T) {
	frozen := map[string]string{
		"dictionary-v1.jsonl": "f134f0631beb0c36192adc5ce2884d9710052e0c52c076e35adb8e0e71612da9",
		"dictionary-v2.jsonl": "e8e84f1419997d560d4731d397e5f3757f23f8f59aed6c9e7a9769a82a82b187",
	}
	files, err := filepath.Glob("dictionary-*.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		want, ok := frozen[f]
		if !ok {
			t.Errorf("%s is not listed as frozen here", f)
			continue
		}
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s changed (sha256 %s, frozen as %s): envelopes packed with it could no longer be read", f, got, want)
		}
	}
	if !strings.Contains(string(dictionaryV1), `"type":"intent.recorded"`) || bytes.Contains(dictionaryV1, []byte(`"last_outcome_at"`)) {
		t.Error("the embedded dictionary v1 is not dictionary-v1.jsonl")
	}
	if !bytes.HasSuffix(dictionaryV2, dictionaryV1) || !bytes.Contains(dictionaryV2, []byte(`"last_outcome_at"`)) {
		t.Error("the embedded dictionary v2 is not dictionary-v2.jsonl")
	}
}

func FuzzUnpack(f *testing.F) {
	for _, env := range append(sampleEnvelopes, sampleHead) {
		f.Add(Pack([]byte(env), ""))
		f.Add(Pack([]byte(env), sampleKey))
		f.Add([]byte(env))
		f.Add(append([]byte{tagV1}, v1.Encode(nil, []byte(env))...))
	}
	f.Fuzz(func(t *testing.T, stored []byte) {
		for _, key := range []string{"", sampleKey} {
			out, err := Unpack(stored, key)
			if err != nil {
				continue
			}
			if len(out) > MaxUnpacked {
				t.Fatalf("unpacked %d bytes", len(out))
			}
			// What unpacks, packs again to something that unpacks the
			// same, with or without a key.
			for _, k := range []string{"", key, "k"} {
				again, err := Unpack(Pack(out, k), k)
				if err != nil || !bytes.Equal(again, out) {
					t.Fatalf("round trip of %q under key %q: %q, %v", out, k, again, err)
				}
			}
		}
	})
}

func BenchmarkPack(b *testing.B) {
	env := []byte(sampleEnvelopes[2])
	b.SetBytes(int64(len(env)))
	for b.Loop() {
		Pack(env, sampleKey)
	}
}

func BenchmarkUnpack(b *testing.B) {
	stored := Pack([]byte(sampleEnvelopes[2]), sampleKey)
	b.SetBytes(int64(len(sampleEnvelopes[2])))
	for b.Loop() {
		if _, err := Unpack(stored, sampleKey); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzPack: every value Pack returns, under any key, unpacks under that
// key to the value it was given.
func FuzzPack(f *testing.F) {
	f.Add([]byte(sampleHead), sampleKey)
	f.Add([]byte(`{"a":"k"k"}`), "k")
	f.Add([]byte("\x00\"k\""), "k")
	f.Fuzz(func(t *testing.T, v []byte, key string) {
		if len(v) > 1<<16 {
			return
		}
		got, err := Unpack(Pack(v, key), key)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("Pack(%q, %q) unpacked to %q, %v", v, key, got, err)
		}
	})
}
