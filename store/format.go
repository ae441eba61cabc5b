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
	// Compact packs envelopes and the head's record (store/packed); the
	// record leaves out what the row's columns hold
	// (events.MarshalOperationBody) and goes to body, not record.
	Compact RowFormat = iota
	// Plain writes rows as binaries from before 2026-12-04 wrote them and
	// read them: envelopes as JSON, the whole fold in the head's record,
	// body, principal and downstream_id NULL.
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

// StoredEnvelope returns env as this process stores it in a journal row
// of key (packed.Pack; the workflow journal passes "").
func StoredEnvelope(env []byte, key string) []byte {
	if RowFormat(rowFormat.Load()) == Plain {
		return env
	}
	return packed.Pack(env, key)
}

// StoredEventType is what events.type holds for an event of type t as
// this process writes it: the type (Plain, as older binaries wrote and
// read it) or "" (Compact), ~16 bytes less per event. The type is in every
// envelope and no SQL of effectline's reads the column. "" rather than
// NULL keeps the column NOT NULL, so a compact writer needs no migration
// first (an agent service that embeds outbox.Append may be upgraded
// before effectline's processes migrate the database).
func StoredEventType(t events.Type) string {
	if RowFormat(rowFormat.Load()) == Plain {
		return string(t)
	}
	return ""
}

// StoredJSON returns a JSON record as this process stores it in a table
// with a jsonb record column and a bytea body column (the read model's
// operation_state): in record (Plain), or packed in body (Compact). The
// other is nil, written as NULL.
func StoredJSON(record []byte, key string) (jsonb, body []byte) {
	if RowFormat(rowFormat.Load()) == Plain {
		return record, nil
	}
	return nil, packed.Pack(record, key)
}

// LoadedJSON returns the JSON record the row of key holds in such a
// table: body unpacked when it is set, else record.
func LoadedJSON(record, body []byte, key string) ([]byte, error) {
	if body == nil {
		return record, nil
	}
	return packed.Unpack(body, key)
}

// headColumns are a head row's record columns as this process writes them;
// a nil member is written as NULL.
type headColumns struct {
	// record is the whole fold as jsonb (Plain), or nil.
	record any
	// body is the record packed (Compact), or nil.
	body any
	// principal and downstreamID are the members SQL reads (the tombstone,
	// callbacks by the downstream's id), in columns of their own because
	// SQL cannot read body; nil in Plain rows, as older binaries left them,
	// and downstreamID while the downstream has given none.
	principal, downstreamID any
}

func storedHead(op events.Operation) (headColumns, error) {
	if RowFormat(rowFormat.Load()) == Plain {
		b, err := events.MarshalOperation(op)
		if err != nil {
			return headColumns{}, err
		}
		return headColumns{record: JSONBSafe(b)}, nil
	}
	// The record leaves out what the row's columns hold (Head.Operation).
	b, err := events.MarshalOperationBody(op)
	if err != nil {
		return headColumns{}, err
	}
	h := headColumns{body: packed.Pack(b, op.Key), principal: op.Principal}
	if op.DownstreamID != "" {
		h.downstreamID = op.DownstreamID
	}
	return h, nil
}
