package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/store"
)

// handleIntent handles one message of the intents topic. It returns (and so
// acknowledges the message) once the intent is known to be journaled; the
// claim and the call run on, off the partition. watermill-kafka hands over
// one message per partition at a time, so waiting here for the claim's
// commit would make every partition a serial queue of commits. Acking
// before the claim is safe because the intent is durable: if this process
// dies first, the due-time poller runs the intent after IntentPickupGrace.
// An error leaves the message unacknowledged, to be redelivered: that
// happens only when the store is unreachable, when nothing could progress
// anyway.
func (e *Executor) handleIntent(msg *message.Message) error {
	ctx := msg.Context()
	env, err := events.Decode(msg.Payload)
	if err != nil {
		// A malformed message can never become valid: record it and move
		// on, so it does not block the partition. Its payload is not logged.
		e.tel.malformed(ctx)
		e.log.WarnContext(ctx, "rejected a malformed intent message",
			"kafka_key", msg.Metadata.Get(kafka.MetadataKey), "error", err)
		return nil
	}
	if env.Type != events.IntentRecorded {
		e.tel.malformed(ctx)
		e.log.WarnContext(ctx, "ignored a non-intent event on the intents topic",
			"operation_key", env.OperationKey, "event_type", env.Type)
		return nil
	}
	ctx = kafka.ContextWithTraceparent(ctx, kafka.TraceparentOf(msg))
	op, fresh, err := e.ensureIntent(ctx, env, kafka.TraceparentOf(msg))
	if err != nil {
		return err
	}
	if !fresh {
		return nil
	}
	e.dispatch(kafka.ContextWithTraceparent(e.callCtx, kafka.TraceparentOf(msg)), op)
	return nil
}

// dispatch advances op in the background. It blocks while Concurrency
// advances are already waiting, which holds back the consumer instead of
// queueing without bound.
func (e *Executor) dispatch(ctx context.Context, op events.Operation) {
	select {
	case e.pending <- struct{}{}:
	case <-ctx.Done():
		return
	}
	e.calls.Add(1)
	go func() {
		defer e.calls.Done()
		defer func() { <-e.pending }()
		if err := e.advance(ctx, op, true); err != nil && ctx.Err() == nil {
			e.log.WarnContext(ctx, "advancing an intent failed; the poller retries it", "operation_key", op.Key, "error", err)
		}
	}()
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

// poll runs due steps: retries whose backoff ended, compensations, intents
// whose message never arrived, approvals. It also serves kicks, the
// in-process shortcut for steps due within a poll or two.
func (e *Executor) poll(ctx context.Context) {
	t := newTicker(e.cfg.PollInterval)
	defer t.Stop()
	for {
		e.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case key := <-e.kicks:
			go func() {
				if err := e.advanceKey(ctx, key); err != nil && ctx.Err() == nil {
					e.log.WarnContext(ctx, "advancing a kicked operation failed", "operation_key", key, "error", err)
				}
			}()
		}
	}
}

func (e *Executor) pollOnce(ctx context.Context) int {
	keys, err := e.store.DueOperations(ctx, e.cfg.Now(), e.cfg.PollBatch)
	if err != nil {
		if ctx.Err() == nil {
			e.log.WarnContext(ctx, "polling due operations failed", "error", err)
		}
		return 0
	}
	done := make(chan struct{}, len(keys))
	for _, key := range keys {
		go func() {
			defer func() { done <- struct{}{} }()
			if err := e.advanceKey(ctx, key); err != nil && ctx.Err() == nil {
				e.log.WarnContext(ctx, "advancing a due operation failed", "operation_key", key, "error", err)
			}
		}()
	}
	for range keys {
		<-done
	}
	return len(keys)
}
