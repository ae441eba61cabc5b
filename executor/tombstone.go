package executor

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/store"
)

// prunedIntent handles an intent message for a key whose operation was
// pruned to a tombstone: a redelivery, or a producer repeating itself after
// the tool's dedup window. Nothing is journaled (the operation's journal is
// gone) and nothing runs; other args under the key are the payload
// conflict they always were, logged, and the message is done with either
// way.
func (e *Executor) prunedIntent(ctx context.Context, tomb store.Tombstone, hash string) {
	if tomb.PayloadHash != hash {
		e.tel.prunedIntent(ctx, "payload_conflict")
		e.log.WarnContext(ctx, "rejected an intent reusing the key of a pruned operation with other args",
			"operation_key", tomb.OperationKey, "tool", tomb.Tool)
		return
	}
	e.tel.prunedIntent(ctx, "duplicate")
	e.log.InfoContext(ctx, "ignored a duplicate intent of a pruned operation",
		"operation_key", tomb.OperationKey, "tool", tomb.Tool, "status", tomb.Status)
}

func (t *telemetry) prunedIntent(ctx context.Context, result string) {
	t.pruned.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
}
