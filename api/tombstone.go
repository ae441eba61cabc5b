package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/store"
)

// tombstoneBody answers for a pruned operation: the record's shape, filled
// with what the tombstone keeps (no args, result or history), marked
// pruned.
type tombstoneBody struct {
	operationBody
	Pruned    bool      `json:"pruned"`
	SettledAt time.Time `json:"settled_at"`
}

func renderTombstone(tomb store.Tombstone) tombstoneBody {
	return tombstoneBody{operationBody: summarizeOperation(tomb.Operation()), Pruned: true, SettledAt: tomb.SettledAt}
}

// answerTombstone answers an intent whose key belongs to a pruned
// operation: the same call gets the tombstone (200, it settled long ago and
// never runs again), another call under the key is the conflict it always
// was.
func (s *Server) answerTombstone(ctx context.Context, w http.ResponseWriter, tomb store.Tombstone, name, hash, principal string) {
	trace.SpanFromContext(ctx).SetAttributes(semconv.Status.String(string(tomb.Status)))
	if tomb.Tool != name || tomb.PayloadHash != hash {
		s.tel.intent(ctx, name, "conflict")
		s.log.WarnContext(ctx, "intent rejected: operation key of a pruned operation reused with other args",
			slog.String("operation_key", tomb.OperationKey), slog.String("tool", name), slog.String("principal", principal))
		writeError(w, http.StatusConflict, codePayloadConflict,
			"this operation_key was already used with another tool or other args")
		return
	}
	s.tel.intent(ctx, name, "pruned")
	writeJSON(w, http.StatusOK, renderTombstone(tomb))
}
