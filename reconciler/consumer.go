package reconciler

import (
	"context"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/traceparent"
)

// handleOutcomes handles the messages of one partition of the outcomes
// topic. It hands the operations that need an answer from the downstream to
// the worker pool and returns at once, so no ask ever holds the partition.
// A message is only a trigger: the worker decides from the record it loads,
// so a redelivered, reordered or stale message changes nothing, and a lost
// one is found by the sweep of unresolved operations.
//
// It returns an error (leaving the batch to be handed over again) only when
// the reconciler is stopping before an operation was handed over.
func (r *Reconciler) handleOutcomes(ctx context.Context, msgs []*kafka.Message) error {
	for _, msg := range msgs {
		// Most outcome events need no answer; the CloudEvents type header
		// says so without decoding the payload. A message without it is
		// decoded.
		switch t := events.Type(msg.Headers.Get(kafka.HeaderType)); t {
		case "", events.AttemptUnknown, events.CompensationFailed:
		default:
			if t.Valid() {
				continue
			}
		}
		env, ok := msg.Event()
		if !ok || !needsAnswer(env) {
			continue
		}
		if _, err := r.work.submit(ctx, env.OperationKey, traceparent.FromContext(msg.Context(ctx))); err != nil {
			return err
		}
	}
	return nil
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
