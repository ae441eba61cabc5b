package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
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
func (e *Executor) handleIntent(ctx context.Context, msg *sarama.ConsumerMessage) error {
	env, err := events.Decode(msg.Value)
	if err != nil {
		// A malformed message can never become valid: record it and move
		// on, so it does not block the partition. Its payload is not logged.
		e.tel.malformed(ctx)
		e.log.WarnContext(ctx, "rejected a malformed intent message",
			"kafka_key", string(msg.Key), "partition", msg.Partition, "offset", msg.Offset, "error", err)
		return nil
	}
	if env.Type != events.IntentRecorded {
		e.tel.malformed(ctx)
		e.log.WarnContext(ctx, "ignored a non-intent event on the intents topic",
			"operation_key", env.OperationKey, "event_type", env.Type)
		return nil
	}
	traceparent := kafka.HeaderValue(msg.Headers, kafka.HeaderTraceparent)
	ctx = kafka.ContextWithTraceparent(ctx, traceparent)
	if op, err := events.Apply(events.Operation{}, env); err == nil {
		// Until the claim commits it is unknown whether the intent is
		// journaled at all, so any error but the conflict keeps the message.
		if err := e.advance(ctx, op, advanceFromIntent(env.EventID)); !errors.Is(err, errNotThisIntent) {
			return err
		}
	}
	op, fresh, err := e.ensureIntent(ctx, env, traceparent)
	if err != nil || !fresh {
		return err
	}
	return e.advanceError(ctx, env.OperationKey, e.advance(ctx, op, advanceImmediate))
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
func (e *Executor) ensureIntent(ctx context.Context, env events.Envelope, traceparent string) (op events.Operation, fresh bool, err error) {
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
		switch {
		case errors.Is(err, store.ErrNotFound):
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
		evs, err := e.build(op, e.cfg.Now(), eventSpec{typ: events.IntentRejected, data: &events.IntentRejectedData{
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
