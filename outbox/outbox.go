// Package outbox records intents inside an agent service's own PostgreSQL
// transaction and relays them, with every other journaled event, to Kafka.
//
// An agent service calls [Append] with the pgx transaction that also holds
// its business write. The intent (an intent.recorded event, seq 1 of the
// operation) and its outbox rows are written by that transaction, so the
// intent exists if and only if the business write commits: there is no
// window in which one is visible without the other, and no dual write to
// Kafka that could succeed when the transaction rolls back.
//
// The [Relay] drains the outbox to Kafka, at least once and in order per
// operation key (the message key). Consumers deduplicate by
// (operation_key, seq).
package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
)

var (
	// ErrInvalidIntent is wrapped by every *InvalidIntentError.
	ErrInvalidIntent = errors.New("invalid intent")
	// ErrPayloadConflict is wrapped by every *PayloadConflictError.
	ErrPayloadConflict = errors.New("operation key reused with other arguments")
)

// InvalidIntentError says which field of an intent is wrong. Nothing was
// written.
type InvalidIntentError struct {
	Field  string
	Reason string
}

func (e *InvalidIntentError) Error() string {
	return fmt.Sprintf("invalid intent: %s: %s", e.Field, e.Reason)
}

func (e *InvalidIntentError) Unwrap() error { return ErrInvalidIntent }

// PayloadConflictError reports an operation key already recorded for
// another call: other args (the payload hashes differ), or another tool or
// effect class. Nothing was written. It is a bug in the caller's workflow
// layer (two different actions derived the same key), never something to
// retry.
type PayloadConflictError struct {
	OperationKey string
	ExistingHash string
	NewHash      string
	// Reason says what differs when it is not the args.
	Reason string
}

func (e *PayloadConflictError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("operation key %s already recorded for another call: %s", e.OperationKey, e.Reason)
	}
	return fmt.Sprintf("operation key %s already recorded with other arguments (payload hash %s, this call %s)",
		e.OperationKey, e.ExistingHash, e.NewHash)
}

func (e *PayloadConflictError) Unwrap() error { return ErrPayloadConflict }

// IsPayloadConflict reports whether err is a reused key with another call.
func IsPayloadConflict(err error) bool {
	var pc *PayloadConflictError
	return errors.As(err, &pc)
}

// Intent is one intended business effect, as an agent service asks for it.
type Intent struct {
	// OperationKey identifies the effect across every retry. It comes from
	// the caller's deterministic workflow layer (see [OperationKey]), never
	// from a model, a run id, a trace id or a tool-call id: those change on
	// a retry, which is exactly when the key must not.
	OperationKey string
	// Tool is the registered tool name.
	Tool string
	// EffectClass is the class the tool is registered with.
	EffectClass events.EffectClass
	// Args is the tool call's arguments, a JSON object. They are hashed in
	// canonical form (RFC 8785), so reserializing them does not change the
	// hash.
	Args json.RawMessage
	// Principal is who asks; it is authorized again at execution time.
	Principal string
}

// Appended is the result of one Append.
type Appended struct {
	// Operation is the record of the operation: the new one, or the one
	// already recorded under the key.
	Operation events.Operation
	// Created is false when the key was already recorded with the same
	// call: a retry of the agent service's own step, which is not an error.
	Created bool
	// Pruned is true when the key belongs to an operation that settled
	// longer ago than its tool's dedup window and was pruned: Operation then
	// holds only what the tombstone keeps (key, tool, payload hash, final
	// status, when it settled, downstream id), and the intent never runs
	// again.
	Pruned bool
}

// NotifyChannel is the PostgreSQL channel the relay LISTENs on when
// RelayConfig.Listen is set. See [Notify].
const NotifyChannel = "effectline_outbox"

// Writer appends intents for one deployment. The zero value writes to the
// contract's topic names ("effectline." prefix).
type Writer struct {
	// TopicPrefix replaces "effectline." in the names of the topics the
	// intent is published to; it must match the deployment's.
	TopicPrefix string
	// Now returns the time recorded as the intent's occurred_at. Default
	// time.Now.
	Now func() time.Time
}

// Append records in with the zero Writer.
func Append(ctx context.Context, tx pgx.Tx, in Intent) (Appended, error) {
	return Writer{}.Append(ctx, tx, in)
}

// AppendMany records several intents with the zero Writer.
func AppendMany(ctx context.Context, tx pgx.Tx, ins []Intent) ([]Appended, error) {
	return Writer{}.AppendMany(ctx, tx, ins)
}

// Append records in as intent.recorded (seq 1) inside tx, the caller's own
// transaction: the intent exists if and only if tx commits, and the relay
// publishes it only after that.
//
// The W3C trace context of ctx is stored with the intent, so the operation's
// trace continues the agent's.
//
// A key already recorded with the same args (equal payload hash), tool and
// effect class is not an error: Append returns the recorded operation with
// Created false (and Pruned true if only its tombstone is left). A key recorded for another call returns a
// *PayloadConflictError. Neither writes anything, and neither aborts tx: the
// insert is an INSERT … ON CONFLICT DO NOTHING, so the caller may go on and
// commit its business write.
//
// Under READ COMMITTED (the default), an Append racing a concurrent
// transaction that records the same key waits for it; then it sees the
// committed operation, or inserts if that transaction rolled back. Under
// REPEATABLE READ or SERIALIZABLE the same race ends in a serialization
// failure, which the caller retries like any other.
func (w Writer) Append(ctx context.Context, tx pgx.Tx, in Intent) (Appended, error) {
	out, err := w.AppendMany(ctx, tx, []Intent{in})
	if err != nil {
		return Appended{}, err
	}
	return out[0], nil
}

// AppendMany records several intents inside tx, as Append does, with the
// statements pipelined in one round trip. The results are in the order of
// ins. Validation fails before anything is sent; a payload conflict of one
// intent returns its *PayloadConflictError after the others were written,
// and the caller should roll back. One key may appear twice with the same
// call: the second reports Created false.
func (w Writer) AppendMany(ctx context.Context, tx pgx.Tx, ins []Intent) ([]Appended, error) {
	if len(ins) == 0 {
		return nil, nil
	}
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	prefix := w.TopicPrefix
	if prefix == "" {
		prefix = events.DefaultTopicPrefix
	}
	tp := traceparent.FromContext(ctx)

	appends := make([]store.Append, len(ins))
	hashes := make([]string, len(ins))
	for i, in := range ins {
		hash, err := validate(in)
		if err != nil {
			return nil, intentErr(i, len(ins), in, err)
		}
		hashes[i] = hash
		env, err := events.New(events.IntentRecorded, in.OperationKey, 1, in.Tool, in.EffectClass, 0,
			events.IntentData{Args: in.Args, Principal: in.Principal}, now())
		if err != nil {
			return nil, intentErr(i, len(ins), in, err)
		}
		appends[i] = store.Append{Events: []events.Envelope{env}, Traceparent: tp, TopicPrefix: prefix}
	}

	results, err := store.AppendBatchTx(ctx, tx, appends)
	if err != nil {
		return nil, fmt.Errorf("recording %d intents: %w", len(ins), err)
	}
	out := make([]Appended, len(ins))
	var existing []string
	for i, r := range results {
		switch {
		case r.Err == nil:
			out[i] = Appended{Operation: r.Op, Created: true}
		case store.IsConflict(r.Err):
			existing = append(existing, ins[i].OperationKey)
		default:
			// Encoding errors (an envelope over events.MaxEnvelopeBytes).
			return nil, intentErr(i, len(ins), ins[i], r.Err)
		}
	}
	if len(existing) == 0 {
		return out, nil
	}

	// The key exists: committed by an earlier transaction, or written by
	// this one (a key repeated within ins, or an earlier call on tx).
	ops, err := store.LoadManyTx(ctx, tx, existing)
	if err != nil {
		return nil, fmt.Errorf("recording %d intents: %w", len(ins), err)
	}
	tombs, err := prunedAmong(ctx, tx, existing, ops)
	if err != nil {
		return nil, fmt.Errorf("recording %d intents: %w", len(ins), err)
	}
	for i, r := range results {
		if r.Err == nil {
			continue
		}
		in := ins[i]
		op, ok := ops[in.OperationKey]
		if tomb, pruned := tombs[in.OperationKey]; !ok && pruned {
			op, ok = tomb.Operation(), true
			out[i].Pruned = true
		}
		if !ok {
			// Only possible if the operation was deleted in between.
			return nil, intentErr(i, len(ins), in, fmt.Errorf("operation vanished after an append conflict: %w", store.ErrNotFound))
		}
		if err := sameCall(op, in, hashes[i]); err != nil {
			return nil, intentErr(i, len(ins), in, err)
		}
		out[i] = Appended{Operation: op, Created: false, Pruned: out[i].Pruned}
	}
	return out, nil
}

// sameCall reports whether the recorded op is the call in.
func sameCall(op events.Operation, in Intent, hash string) error {
	conflict := &PayloadConflictError{OperationKey: in.OperationKey, ExistingHash: op.PayloadHash, NewHash: hash}
	switch {
	case op.PayloadHash != hash:
	case op.Tool != in.Tool:
		conflict.Reason = fmt.Sprintf("recorded for tool %s, not %s", op.Tool, in.Tool)
	case op.EffectClass != in.EffectClass:
		conflict.Reason = fmt.Sprintf("recorded as %s, not %s", op.EffectClass, in.EffectClass)
	default:
		return nil
	}
	return conflict
}

func intentErr(i, n int, in Intent, err error) error {
	if n == 1 {
		return fmt.Errorf("recording intent %s: %w", in.OperationKey, err)
	}
	return fmt.Errorf("recording intent %d of %d (%s): %w", i+1, n, in.OperationKey, err)
}

// validate checks an intent and returns its payload hash.
func validate(in Intent) (string, error) {
	if err := validKey("operation_key", in.OperationKey); err != nil {
		return "", err
	}
	if in.Tool == "" {
		return "", &InvalidIntentError{Field: "tool", Reason: "missing"}
	}
	if !in.EffectClass.Valid() {
		return "", &InvalidIntentError{Field: "effect_class", Reason: fmt.Sprintf("unknown effect class %q (want idempotent, compensable or irreversible)", in.EffectClass)}
	}
	if in.Principal == "" {
		return "", &InvalidIntentError{Field: "principal", Reason: "missing"}
	}
	args := bytes.TrimSpace(in.Args)
	if len(args) == 0 || args[0] != '{' {
		return "", &InvalidIntentError{Field: "args", Reason: "must be a JSON object"}
	}
	hash, err := events.PayloadHash(args)
	if err != nil {
		return "", &InvalidIntentError{Field: "args", Reason: err.Error()}
	}
	return hash, nil
}

func validKey(field, key string) error {
	if key == "" {
		return &InvalidIntentError{Field: field, Reason: "missing"}
	}
	if err := events.CheckOperationKey(key); err != nil {
		return &InvalidIntentError{Field: field, Reason: strings.TrimPrefix(err.Error(), events.ErrInvalidOperationKey.Error()+": ")}
	}
	return nil
}

// OperationKey derives the operation key of one step of one workflow run:
// "wf:<workflowID>/<step>". The same workflow id and step always give the
// same key, so a retried or replayed step records the same intent again
// and gets Created false instead of a second effect.
//
// Both parts must come from the caller's deterministic workflow layer: the
// id of the business workflow (an order id, a ticket id) and the name of
// the step in it ("reserve", "charge"). Never use a model's output, an
// agent run id, a trace id or a tool-call id: each changes when the step is
// retried, and a key that changes on a retry defeats the deduplication the
// key exists for.
//
// step must not contain '/', so that the last '/' separates the parts and
// two different (workflowID, step) pairs never give the same key.
func OperationKey(workflowID, step string) (string, error) {
	switch {
	case workflowID == "":
		return "", &InvalidIntentError{Field: "workflow_id", Reason: "missing"}
	case step == "":
		return "", &InvalidIntentError{Field: "step", Reason: "missing"}
	case strings.Contains(step, "/"):
		return "", &InvalidIntentError{Field: "step", Reason: fmt.Sprintf("%q contains '/'", step)}
	}
	key := "wf:" + workflowID + "/" + step
	if err := validKey("operation_key", key); err != nil {
		return "", err
	}
	return key, nil
}

// Notify asks relays that LISTEN (RelayConfig.Listen) to look at the outbox
// as soon as tx commits. Without it they find the intent at their next poll
// (RelayConfig.PollInterval, 100ms by default).
//
// It is opt-in, and once per transaction at most, because of what NOTIFY
// costs PostgreSQL: a transaction that notified takes a database-wide lock
// at commit and holds it through its commit record's flush, so concurrent
// notifying transactions commit one at a time and lose group commit.
// BenchmarkAppendNotify measures it; the numbers are in the doc of Relay.
// PostgreSQL folds identical notifications of one transaction into one, so
// calling Notify twice in a transaction costs nothing more.
func Notify(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, NotifyChannel); err != nil {
		return fmt.Errorf("notifying %s: %w", NotifyChannel, err)
	}
	return nil
}
