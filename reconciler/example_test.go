package reconciler_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
)

// The HTTP API's POST /v1/webhooks/{source}: 2xx only once Handle returned
// without an error, which is after the delivery committed.
func ExampleWebhooks_Handle() {
	var hooks *reconciler.Webhooks // reconciler.NewWebhooks(st, registry, cfg)
	handler := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, events.MaxEnvelopeBytes))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		res, err := hooks.Handle(r.Context(), r.PathValue("source"), r.Header, body, time.Now())
		switch {
		case errors.Is(err, events.ErrUnknownSource):
			http.Error(w, "unknown source", http.StatusNotFound)
		case errors.Is(err, events.ErrBadSignature), errors.Is(err, events.ErrStaleTimestamp):
			http.Error(w, "signature", http.StatusUnauthorized)
		case errors.Is(err, events.ErrInvalidPayload):
			http.Error(w, "payload", http.StatusBadRequest)
		case err != nil:
			http.Error(w, "try again", http.StatusInternalServerError) // rolled back: the retry is processed
		default:
			_ = json.NewEncoder(w).Encode(res)
		}
	}
	_ = handler
}

// The HTTP API's POST /v1/operations/{key}/decisions, for an approver.
func ExampleDecide() {
	var st *store.Store
	handler := func(w http.ResponseWriter, r *http.Request, approver string) {
		var req struct{ Action, Note string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		op, err := reconciler.Decide(r.Context(), st, r.PathValue("key"), events.Action(req.Action), req.Note, approver, time.Now())
		switch {
		case errors.Is(err, store.ErrNotFound):
			http.Error(w, "not found", http.StatusNotFound)
		case errors.Is(err, events.ErrNotWaiting):
			http.Error(w, "not waiting for a decision", http.StatusConflict)
		case errors.Is(err, events.ErrInvalidDecision):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil:
			http.Error(w, "try again", http.StatusInternalServerError)
		default:
			_ = json.NewEncoder(w).Encode(op)
		}
	}
	_ = handler
}
