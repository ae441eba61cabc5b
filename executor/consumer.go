package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
)

// handleIntent handles one message of the intents topic. The intents of a
// partition fetched together are handled concurrently (kafka.Concurrently),
// so their claims share the committer's group commits, and the batch's
// offsets are committed once every one of them is safe to leave behind: its
// first step claimed, or its intent at least journaled. An error hands the
// batch over again, which is harmless: a claimed operation is found moved on
// and skipped.
//
// The operation
// usually stands exactly at the intent this message carries (the outbox or
// the API journaled it, the relay published it), so the first step is
// decided from the message alone and claimed on condition that the
// journaled intent is this very event: one write, no read. Anything else (a
// redelivery of an operation already under way, an intent produced straight
// to Kafka and not yet journaled, another payload under the same key) makes
// that claim conflict, and the slow path reads the head and decides from
// what is journaled. An error leaves the batch uncommitted, to be handed
// over again: that happens only when the store is unreachable.
func (e *Executor) handleIntent(ctx context.Context, msg *kafka.Message) error {
	env, ok := msg.Event()
	if !ok {
		return nil // rejected: the consumer dead-letters it
	}
	if env.Type != events.IntentRecorded {
		msg.Reject(RejectNotAnIntent, fmt.Errorf("a %s event on the intents topic", env.Type))
		return nil
	}
	if string(msg.Key) != env.OperationKey {
		// The key picks the partition, and one operation's messages must
		// share one or their order is lost.
		msg.Reject(RejectKeyMismatch, fmt.Errorf("message key %q is not the operation key %q",
			truncateKey(string(msg.Key)), env.OperationKey))
		return nil
	}
	ctx = msg.Context(ctx)
	tp := traceparent.FromContext(ctx)
	if op, err := events.Apply(events.Operation{}, env); err == nil {
		// Until the claim commits it is unknown whether the intent is
		// journaled at all, so any error but the conflict keeps the message.
		if err := e.advance(ctx, op, advanceFromIntent(env.EventID)); !errors.Is(err, errNotThisIntent) {
			return err
		}
	}
	op, fresh, err := e.ensureIntent(ctx, msg, env, tp)
	if err != nil || !fresh {
		return err
	}
	return e.advanceError(ctx, env.OperationKey, e.advance(ctx, op, advanceImmediate))
}

// Reasons the executor dead-letters a message of the intents topic, beside
// kafka.RejectNotJSON and kafka.RejectInvalidEnvelope. Each is the value of
// the dead letter's effectline_error header.
const (
	// RejectNotAnIntent: a valid event, but not intent.recorded.
	RejectNotAnIntent = "not_an_intent"
	// RejectKeyMismatch: the message key is not the envelope's operation key.
	RejectKeyMismatch = "key_mismatch"
	// RejectUnknownTool: a direct intent names a tool that is not registered.
	RejectUnknownTool = "unknown_tool"
	// RejectPrincipalNotAllowed: a direct intent names a principal outside
	// Config.KafkaPrincipals.
	RejectPrincipalNotAllowed = "principal_not_allowed"
)

func truncateKey(k string) string {
	if len(k) > events.MaxOperationKeyBytes {
		return k[:events.MaxOperationKeyBytes] + "…"
	}
	return k
}

// refuseDirect says why a direct intent (one produced straight to Kafka,
// that no journaled intent of its principal vouches for) may not become an
// operation, or "". Only a direct intent is checked here: an intent the
// outbox or the API journaled was accepted there, and its redeliveries are
// what they were.
func (e *Executor) refuseDirect(env events.Envelope, intent *events.IntentData, journaled bool) (string, error) {
	if len(e.cfg.KafkaPrincipals) > 0 && !slices.Contains(e.cfg.KafkaPrincipals, intent.Principal) {
		return RejectPrincipalNotAllowed, fmt.Errorf("principal %q may not produce intents to Kafka", intent.Principal)
	}
	if journaled {
		return "", nil
	}
	if _, known := e.tools.Get(env.Tool); !known {
		return RejectUnknownTool, fmt.Errorf("tool %q is not registered", env.Tool)
	}
	return "", nil
}

// advanceError turns a failure to advance a journaled intent into a log
// line: the intent is durable, so the message is done with, and the poller
// takes the operation up after its pickup grace. Only a failure to tell
// whether the intent is journaled at all keeps the message.
func (e *Executor) advanceError(ctx context.Context, key string, err error) error {
	if err != nil && ctx.Err() == nil {
		e.log.WarnContext(ctx, "advancing an intent failed; the poller retries it", "operation_key", key, "error", err)
	}
	return nil
}

// ensureIntent journals an intent that came straight from a producer, or
// finds the one the outbox journaled. fresh is false when the message is not
// this operation's intent (another payload under the same key): that
// message becomes an intent.rejected event, never an execution.
//
// A direct intent that refuseDirect refuses is rejected instead: nothing is
// journaled for it, and fresh is false.
func (e *Executor) ensureIntent(ctx context.Context, msg *kafka.Message, env events.Envelope, traceparent string) (op events.Operation, fresh bool, err error) {
	d, err := env.DecodeData()
	if err != nil {
		return op, false, err
	}
	intent := d.(*events.IntentData)
	hash, err := events.PayloadHash(intent.Args)
	if err != nil {
		return op, false, err
	}
	for range maxConflicts {
		op, err = e.store.Load(ctx, env.OperationKey)
		if tomb, ok := store.AsPruned(err); ok {
			// The operation settled long ago and was pruned (the claim
			// above conflicted with its tombstone): never run it again.
			e.prunedIntent(ctx, tomb, hash)
			return op, false, nil
		}
		notFound := errors.Is(err, store.ErrNotFound)
		if notFound || err == nil && op.Principal != intent.Principal {
			if reason, why := e.refuseDirect(env, intent, !notFound); reason != "" {
				msg.Reject(reason, why)
				return op, false, nil
			}
		}
		switch {
		case notFound:
			op, err = e.committer.Append(ctx, store.Append{
				Events: []events.Envelope{env}, Traceparent: traceparent, TopicPrefix: e.cfg.Kafka.TopicPrefix,
			})
			if store.IsConflict(err) {
				continue
			}
			if err != nil {
				return op, false, fmt.Errorf("journaling the intent of %s: %w", env.OperationKey, err)
			}
			e.tel.intentJournaled(ctx)
			return op, true, nil
		case err != nil:
			return op, false, err
		}
		if op.PayloadHash == hash {
			return op, true, nil
		}
		evs, err := events.Following(op, e.cfg.Now(), events.Spec{Type: events.IntentRejected, Data: &events.IntentRejectedData{
			Reason: "payload_conflict", PayloadHash: hash, Principal: intent.Principal, EventID: env.EventID,
		}})
		if err != nil {
			return op, false, err
		}
		_, err = e.committer.Append(ctx, store.Append{
			Base: op, Events: evs, Traceparent: traceparent, TopicPrefix: e.cfg.Kafka.TopicPrefix,
		})
		if store.IsConflict(err) {
			continue
		}
		if err != nil {
			return op, false, fmt.Errorf("journaling a rejected intent of %s: %w", env.OperationKey, err)
		}
		e.log.WarnContext(ctx, "rejected an intent reusing a key with other args", "operation_key", env.OperationKey)
		return op, false, nil
	}
	return op, false, fmt.Errorf("journaling the intent of %s: %w", env.OperationKey, errTooManyConflicts)
}
