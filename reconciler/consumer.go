package reconciler

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
)

// handleOutcome handles one message of the outcomes topic. It hands the
// operations that need an answer from the downstream to the worker pool and
// acknowledges at once, so no ask ever holds the partition. The message is
// only a trigger: the worker decides from the record it loads, so a
// redelivered, reordered or stale message changes nothing, and a lost one is
// found by the sweep of unresolved operations.
//
// It returns an error (leaving the message to be redelivered) only when the
// reconciler is stopping before the operation was handed over.
func (r *Reconciler) handleOutcome(msg *message.Message) error {
	ctx := msg.Context()
	// Most outcome events need no answer; the CloudEvents type header says
	// so without decoding the payload. A message without it is decoded.
	switch t := events.Type(msg.Metadata.Get(kafka.HeaderType)); t {
	case "", events.AttemptUnknown, events.CompensationFailed:
	default:
		if t.Valid() {
			return nil
		}
	}
	env, err := events.Decode(msg.Payload)
	if err != nil {
		// A malformed message never becomes valid: count it, log it without
		// its payload (it may hold tool arguments), and move on.
		r.tel.malformed(ctx)
		r.log.WarnContext(ctx, "ignored a malformed message on the outcomes topic",
			"kafka_key", msg.Metadata.Get(kafka.MetadataKey), "error", err)
		return nil
	}
	if !needsAnswer(env) {
		return nil
	}
	_, err = r.work.submit(ctx, env.OperationKey, kafka.TraceparentOf(msg))
	return err
}

// needsAnswer reports whether an event leaves its operation waiting for the
// downstream's answer: an unknown attempt the executor handed to
// reconciliation, or an undo that failed or whose outcome is unknown.
func needsAnswer(env events.Envelope) bool {
	switch env.Type {
	case events.AttemptUnknown:
		d, err := env.DecodeData()
		if err != nil {
			return false
		}
		return d.(*events.AttemptUnknownData).Next == events.NextReconcile
	case events.CompensationFailed:
		return true
	}
	return false
}
