package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/reconciler"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// operationsFrom serves the API's operation list from the projector's read
// model. The API declares what it needs; cmd joins the two.
func operationsFrom(r *projector.Reader) api.OperationsFunc {
	return func(ctx context.Context, f api.ListFilter) (api.ListPage, error) {
		page, err := r.List(ctx, projector.Filter{Status: f.Status, Tool: f.Tool, Limit: f.Limit, Cursor: f.Cursor})
		if err != nil {
			if projector.IsInvalidFilter(err) {
				return api.ListPage{}, fmt.Errorf("%w: %w", api.ErrInvalidCursor, err)
			}
			return api.ListPage{}, err
		}
		out := api.ListPage{NextCursor: page.NextCursor, Items: make([]events.Operation, len(page.Items))}
		for i, s := range page.Items {
			out.Items[i] = events.Operation{
				Key: s.OperationKey, Tool: s.Tool, EffectClass: s.EffectClass, PayloadHash: s.PayloadHash,
				Principal: s.Principal, Status: s.Status, Phase: s.Phase, Attempt: s.Attempt,
				LeaseUntil: s.LeaseUntil, Result: s.Result, DownstreamID: s.DownstreamID, UndoRef: s.UndoRef,
				Compensations: s.Compensations, LastErrorClass: s.LastErrorClass, Evidence: s.Evidence,
				Escalation: s.Escalation, Seq: s.LastSeq, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
			}
		}
		return out, nil
	}
}

// decider records approvers' decisions through the reconciler, translating
// its refusals into the API's.
type decider struct {
	store  *store.Store
	prefix string
	// tools gives decisions the tools' approval rules and the decision-time
	// re-check of the downstream.
	tools *tool.Registry
	tp    trace.TracerProvider
	mp    metric.MeterProvider
}

func (d decider) Decide(ctx context.Context, key string, action events.Action, note, approver string) (events.Operation, error) {
	return d.DecideSeen(ctx, key, action, note, approver, api.Seen{})
}

func (d decider) DecideSeen(ctx context.Context, key string, action events.Action, note, approver string, seen api.Seen) (events.Operation, error) {
	opts := []reconciler.DecideOption{reconciler.WithTopicPrefix(d.prefix), reconciler.WithTelemetry(d.tp, d.mp),
		reconciler.WithSeenDownstream(seen.DownstreamID, seen.Result)}
	if d.tools != nil {
		opts = append(opts, reconciler.WithTools(d.tools))
	}
	op, err := reconciler.Decide(ctx, d.store, key, action, note, approver, time.Now(), opts...)
	switch {
	case errors.Is(err, reconciler.ErrRequesterCannotDecide):
		err = fmt.Errorf("%w: %w", api.ErrRequesterCannotDecide, err)
	case errors.Is(err, reconciler.ErrEffectFound):
		err = fmt.Errorf("%w: %w", api.ErrEffectFound, err)
	case errors.Is(err, reconciler.ErrNotWaiting):
		err = fmt.Errorf("%w: %w", api.ErrNotWaiting, err)
	case errors.Is(err, reconciler.ErrInvalidDecision):
		err = fmt.Errorf("%w: %w", api.ErrInvalidDecision, err)
	}
	return op, err
}

// webhookAdapter applies inbound callbacks through the reconciler.
type webhookAdapter struct{ w *reconciler.Webhooks }

func (a webhookAdapter) Handle(ctx context.Context, source string, h http.Header, body []byte, now time.Time) (api.WebhookOutcome, error) {
	res, err := a.w.Handle(ctx, source, h, body, now)
	if err != nil {
		for _, m := range [...]struct{ from, to error }{
			{reconciler.ErrUnknownSource, api.ErrUnknownSource},
			{reconciler.ErrBadSignature, api.ErrBadSignature},
			{reconciler.ErrStaleTimestamp, api.ErrStaleTimestamp},
			{reconciler.ErrInvalidPayload, api.ErrInvalidPayload},
		} {
			if errors.Is(err, m.from) {
				return api.WebhookOutcome{}, fmt.Errorf("%w: %w", m.to, err)
			}
		}
		return api.WebhookOutcome{}, err
	}
	return api.WebhookOutcome{Duplicate: res.Duplicate, Applied: res.Applied,
		OperationKey: res.OperationKey, Status: res.Status, Ignored: res.Ignored}, nil
}
