package store

import (
	"sync/atomic"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store/packed"
)

// RowFormat is how a process writes the journals' envelopes and the head's
// record. Readers read both formats whatever the setting.
type RowFormat int32

const (
	// Compact packs envelopes (store/packed) and leaves out of the head's
	// record what its columns hold (events.MarshalOperationBody).
	Compact RowFormat = iota
	// Plain writes rows as binaries from before 2026-12-04 wrote them and
	// read them: envelopes as JSON, the whole fold in the head's record.
	Plain
)

// rowFormat is process-wide: every writer of a process, the agent's
// outbox.Append as well as the components, writes one format.
var rowFormat atomic.Int32

// SetRowFormat sets how this process writes rows. A rolling upgrade from a
// binary older than the compact rows runs every new process with Plain
// until no older one is left (older binaries cannot read compact rows),
// then restarts them with Compact, the default.
func SetRowFormat(f RowFormat) { rowFormat.Store(int32(f)) }

// StoredEnvelope returns env as this process stores it in a journal.
func StoredEnvelope(env []byte) []byte {
	if RowFormat(rowFormat.Load()) == Plain {
		return env
	}
	return packed.Pack(env)
}

// storedRecord returns op as this process stores it in the head's record.
func storedRecord(op events.Operation) ([]byte, error) {
	if RowFormat(rowFormat.Load()) == Plain {
		return events.MarshalOperation(op)
	}
	// The record leaves out what the row's columns hold (Head.Operation).
	return events.MarshalOperationBody(op)
}
