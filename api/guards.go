package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/effectline/effectline/events"
)

// Error codes of the execution-time guards.
const (
	codeRequesterCannotDecide = "requester_cannot_decide"
	codeEffectFound           = "effect_found"
)

// Seen is what an approver saw downstream, sent with record_success: the
// effect's downstream id and its record, either may be empty.
type Seen struct {
	DownstreamID string
	Result       json.RawMessage
}

// SeenDecider is a Decider that also records what the approver saw
// downstream with a record_success. A Decider that does not implement it
// refuses a decision that carries downstream_id or result (400), rather
// than drop them.
type SeenDecider interface {
	DecideSeen(ctx context.Context, key string, action events.Action, note, approver, downstreamID string, result json.RawMessage) (events.Operation, error)
}

// describeGuardError answers the guards' refusals; ok is false for any
// other error.
func describeGuardError(err error) (decisionError, bool) {
	switch {
	case errors.Is(err, events.ErrRequesterCannotDecide):
		return decisionError{status: http.StatusForbidden, code: codeRequesterCannotDecide,
			detail: "the principal that submitted this intent may not decide on it; another approver must"}, true
	case errors.Is(err, events.ErrEffectFound):
		return decisionError{status: http.StatusConflict, code: codeEffectFound,
			detail: "asked again just now, the downstream shows the effect: the operation is recorded completed and the decision was not carried out"}, true
	}
	return decisionError{}, false
}

// callDecider calls the Decider, with what the approver saw when there is
// any.
func (s *Server) callDecider(ctx context.Context, key string, action events.Action, note, approver string, seen Seen) (events.Operation, error) {
	if seen.DownstreamID == "" && len(seen.Result) == 0 {
		return s.decider.Decide(ctx, key, action, note, approver)
	}
	d, ok := s.decider.(SeenDecider)
	if !ok {
		return events.Operation{}, fmt.Errorf("%w: this server does not record downstream_id or result with a decision", events.ErrInvalidDecision)
	}
	return d.DecideSeen(ctx, key, action, note, approver, seen.DownstreamID, seen.Result)
}
