package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/metrics"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// webhookTolerance is how far a signed timestamp may be from now: the
// Standard Webhooks default (its Verify uses the same five minutes).
const webhookTolerance = 5 * time.Minute

// maxWebhookID caps a delivery id; ids are stored for deduplication.
const maxWebhookID = 256

// Callback types a tool may send.
const (
	CallbackSucceeded = "effect.succeeded"
	CallbackFailed    = "effect.failed"
)

// SourceWebhookPrefix prefixes ReconciliationResolvedData.Source for a
// verified callback: "webhook:<source>".
const SourceWebhookPrefix = "webhook:"

// WebhookConfig configures Webhooks.
type WebhookConfig struct {
	// Secrets returns the signing secret (whsec_…) of a source. When nil, or
	// when it reports false, the tool's own secret is used if the tool
	// exposes one (a SigningSecret() string method). A source without a
	// secret accepts no callbacks: an unauthenticated callback could mark
	// any operation of the tool done.
	Secrets func(source string) (string, bool)
	// TopicPrefix must match the deployment's kafka.Config.TopicPrefix.
	// Default "effectline.".
	TopicPrefix string

	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Webhooks applies inbound callbacks from tools (contract §7). It is safe for
// concurrent use.
type Webhooks struct {
	cfg   WebhookConfig
	store *store.Store
	tools Tools
	log   *slog.Logger
	tel   *telemetry
}

// NewWebhooks returns the callback handler. It does no I/O.
func NewWebhooks(st *store.Store, tools Tools, cfg WebhookConfig) (*Webhooks, error) {
	if st == nil || tools == nil {
		return nil, errors.New("reconciler: webhooks need a store and a tools registry")
	}
	if cfg.TopicPrefix == "" {
		cfg.TopicPrefix = events.DefaultTopicPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	tel, err := newTelemetry(service.Base{TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider})
	if err != nil {
		return nil, fmt.Errorf("reconciler: %w", err)
	}
	return &Webhooks{cfg: cfg, store: st, tools: tools, log: cfg.Logger.With("component", "webhooks"), tel: tel}, nil
}

// callback is the body a tool posts (contract §7). Fields beyond these are
// allowed: a tool may send more than effectline reads.
type callback struct {
	Type           string          `json:"type"`
	IdempotencyKey string          `json:"idempotency_key"`
	DownstreamID   string          `json:"downstream_id"`
	Result         json.RawMessage `json:"result"`
}

// Handle verifies and applies one delivery to POST /v1/webhooks/{source}.
//
// Order of checks: the source must be a registered tool with a signing
// secret (events.ErrUnknownSource); the Standard Webhooks signature must match the
// body (events.ErrBadSignature); the signed timestamp must be within five minutes
// of now (events.ErrStaleTimestamp). Then, in ONE transaction:
//
//  1. the webhook id is inserted into webhook_deliveries first — a conflict
//     means a duplicate delivery, answered with Duplicate and no effect;
//  2. the business logic runs: the operation is found by the callback's
//     idempotency key (its downstream key; a "~c<N>" suffix names the retry
//     after an undo) or by the tool's downstream id, its row locked, and a
//     success for an operation whose outcome is open is appended as
//     reconciliation.resolved{found, source "webhook:<source>"} with
//     store.AppendTx;
//  3. commit.
//
// A failure in step 2 rolls back step 1 too, so the sender's retry is
// processed rather than swallowed as a duplicate. A callback for an
// unknown operation is recorded and ignored (the sender must stop
// retrying), and one for a completed operation changes nothing.
func (w *Webhooks) Handle(ctx context.Context, source string, headers http.Header, body []byte, now time.Time) (events.WebhookResult, error) {
	t, ok := w.tools.Get(source)
	if !ok {
		return events.WebhookResult{}, fmt.Errorf("%w: %q", events.ErrUnknownSource, source)
	}
	secret, ok := w.secret(source, t)
	if !ok {
		return events.WebhookResult{}, fmt.Errorf("%w: tool %q has no signing secret", events.ErrUnknownSource, source)
	}
	if len(body) > events.MaxEnvelopeBytes {
		return events.WebhookResult{}, fmt.Errorf("%w: body over %d bytes", events.ErrInvalidPayload, events.MaxEnvelopeBytes)
	}
	if err := verifySignature(secret, headers, body, now); err != nil {
		w.count(ctx, source, "rejected")
		return events.WebhookResult{}, err
	}
	id := headers.Get(standardwebhooks.HeaderWebhookID)
	if len(id) > maxWebhookID {
		return events.WebhookResult{}, fmt.Errorf("%w: webhook-id longer than %d bytes", events.ErrInvalidPayload, maxWebhookID)
	}

	ctx, span := w.tel.tracer.Start(ctx, "webhook", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(semconv.WebhookSource.String(source)))
	var (
		res events.WebhookResult
		// settled is the operation after an applied callback, for the
		// end-to-end latency once the transaction has committed.
		settled events.Operation
		// journaled is the applied step, for the waiters in this process.
		journaled store.Append
	)
	err := pgx.BeginFunc(ctx, w.store.Pool(), func(tx pgx.Tx) error {
		res = events.WebhookResult{}
		tag, err := tx.Exec(ctx, sqlRecordDelivery, source, id, now.UTC())
		if err != nil {
			return fmt.Errorf("recording webhook %s/%s: %w", source, id, err)
		}
		if tag.RowsAffected() == 0 {
			res.Duplicate = true
			return nil
		}
		res, err = w.apply(ctx, tx, source, t, id, body, now, &settled, &journaled)
		return err
	})
	endSpan(span, err)
	if err != nil {
		w.count(ctx, source, "error")
		return events.WebhookResult{}, err
	}
	switch {
	case res.Duplicate:
		w.count(ctx, source, "duplicate")
	case res.Applied:
		w.store.NotifyCommitted(journaled)
		w.count(ctx, source, "applied")
		metrics.RecordSettled(ctx, w.tel.e2e, settled)
	default:
		w.count(ctx, source, "ignored")
	}
	return res, nil
}

func (w *Webhooks) secret(source string, t tool.Tool) (string, bool) {
	if w.cfg.Secrets != nil {
		if s, ok := w.cfg.Secrets(source); ok && s != "" {
			return s, true
		}
	}
	if s, ok := t.(interface{ SigningSecret() string }); ok {
		if secret := s.SigningSecret(); secret != "" {
			return secret, true
		}
	}
	return "", false
}

// verifySignature checks the Standard Webhooks signature, then the
// timestamp against now. The library's Verify would check the timestamp
// against the wall clock; checking the signature alone and the timestamp
// here keeps the caller's now authoritative (and testable) with the same
// five-minute tolerance. The signature is checked first so a forged request
// is always reported as such, whatever its timestamp.
func verifySignature(secret string, h http.Header, body []byte, now time.Time) error {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return errors.New("reconciler: the webhook signing secret is not whsec_ followed by base64")
	}
	if err := wh.VerifyIgnoringTimestamp(body, h); err != nil {
		return fmt.Errorf("%w: %w", events.ErrBadSignature, err)
	}
	sec, err := strconv.ParseInt(h.Get(standardwebhooks.HeaderWebhookTimestamp), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: unreadable webhook-timestamp", events.ErrBadSignature)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > webhookTolerance || d < -webhookTolerance {
		return fmt.Errorf("%w: signed %s from now", events.ErrStaleTimestamp, d.Round(time.Second))
	}
	return nil
}

// apply is the business logic of one delivery, inside its transaction. An
// applied callback leaves the record it produced in settled and the step
// it journaled in journaled.
func (w *Webhooks) apply(ctx context.Context, tx pgx.Tx, source string, t tool.Tool, id string, body []byte, now time.Time, settled *events.Operation, journaled *store.Append) (events.WebhookResult, error) {
	var cb callback
	if err := json.Unmarshal(body, &cb); err != nil {
		return events.WebhookResult{}, fmt.Errorf("%w: %v", events.ErrInvalidPayload, err)
	}
	if cb.IdempotencyKey == "" && cb.DownstreamID == "" {
		return events.WebhookResult{}, fmt.Errorf("%w: neither idempotency_key nor downstream_id", events.ErrInvalidPayload)
	}
	if len(cb.Result) > 0 && !json.Valid(cb.Result) {
		return events.WebhookResult{}, fmt.Errorf("%w: result is not JSON", events.ErrInvalidPayload)
	}
	logAttrs := []any{"source", source, "webhook_id", id, "callback_type", cb.Type}
	if cb.Type != CallbackSucceeded && cb.Type != CallbackFailed {
		// A type this version does not know: recorded, so the sender stops.
		w.log.InfoContext(ctx, "webhook of an unknown type ignored", logAttrs...)
		return events.WebhookResult{Ignored: "unknown_type"}, nil
	}

	op, found, ignored, err := w.findLocked(ctx, tx, source, cb)
	if err != nil {
		return events.WebhookResult{}, err
	}
	if !found {
		w.log.InfoContext(ctx, "webhook for no pending operation ignored",
			append(logAttrs, "idempotency_key", cb.IdempotencyKey, "downstream_id", cb.DownstreamID, "why", ignored)...)
		return events.WebhookResult{Ignored: ignored}, nil
	}
	res := events.WebhookResult{OperationKey: op.Key, Status: op.Status}
	logAttrs = append(logAttrs, "operation_key", op.Key)

	var specs []events.Spec
	var esc *events.EscalationData
	switch cb.Type {
	case CallbackSucceeded:
		switch {
		case op.Status == events.StatusCompleted:
			res.Ignored = "already_completed"
		case !successSettles(op):
			res.Ignored = "not_pending"
		default:
			specs = []events.Spec{{Type: events.ReconciliationResolved, Data: &events.ReconciliationResolvedData{
				Found: true, Result: downstreamBody(op, t.Spec(), cb.Result), DownstreamID: firstNonEmpty(cb.DownstreamID, op.DownstreamID),
				Source: SourceWebhookPrefix + source,
			}}}
		}
	case CallbackFailed:
		// A failure report is the downstream saying the effect is absent.
		// It is applied only where an answer is awaited (the attempt's
		// outcome is unknown); elsewhere the executor's own classification
		// of the response stands, and a failure report must not undo a
		// completed effect or race a running attempt.
		if op.Status != events.StatusNeedsReconciliation || op.Phase != events.PhaseAttempt {
			res.Ignored = "not_awaiting_answer"
			break
		}
		v := planAttempt(op, t.Spec(), tool.Reconciliation{Answer: tool.Absent, Body: cb.Result,
			DownstreamID: cb.DownstreamID}, 0, now)
		for _, s := range v.specs {
			if d, ok := s.Data.(*events.ReconciliationResolvedData); ok {
				d.Source = SourceWebhookPrefix + source
			}
		}
		specs, esc = v.specs, v.escalation
	}
	if len(specs) == 0 {
		w.log.InfoContext(ctx, "webhook changed nothing", append(logAttrs, "status", op.Status, "why", res.Ignored)...)
		return res, nil
	}

	tp, err := store.TraceparentTx(ctx, tx, op.Key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return events.WebhookResult{}, err
	}
	// The resolution belongs to the operation's trace; the delivery's own
	// span (the HTTP request's trace) is linked to it.
	opCtx, span := w.tel.tracer.Start(traceparent.ContextWith(context.WithoutCancel(ctx), tp), "reconciliation",
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(trace.LinkFromContext(ctx)),
		trace.WithAttributes(append(opAttrs(op), semconv.WebhookSource.String(source), semconv.ReconcileAnswer.String(cb.Type))...))
	if esc != nil {
		var escSpan trace.Span
		opCtx, escSpan = w.tel.startEscalation(opCtx, op, esc)
		defer escSpan.End()
	}
	evs, err := events.Following(op, now, specs...)
	if err == nil {
		var next events.Operation
		a := store.Append{
			Base: op, Events: evs, Traceparent: traceparent.FromContext(opCtx), TopicPrefix: w.cfg.TopicPrefix,
		}
		next, err = store.AppendTx(ctx, tx, a)
		res.Status = next.Status
		*settled, *journaled = next, a
	}
	endSpan(span, err)
	if err != nil {
		// The row is locked, so a conflict here is a bug, not a race; either
		// way the transaction rolls back, the delivery id with it.
		return events.WebhookResult{}, fmt.Errorf("applying webhook %s/%s to %s: %w", source, id, op.Key, err)
	}
	res.Applied = true
	if esc != nil {
		w.tel.escalated(ctx, op, esc)
	}
	w.log.InfoContext(ctx, "webhook applied", append(logAttrs, "status", res.Status)...)
	return res, nil
}

// successSettles reports whether a verified success callback settles op:
// its outcome is open and the callback can only be about the attempt now in
// question (the caller matched the downstream key). Not during an undo: a
// compensation pending or running may release the effect the callback
// reports, and the undo's outcome decides (a failed undo is reconciled).
//
// Nor after the attempt was undone: compensation.succeeded leaves the
// record's downstream key at the undone attempt's key until the retry
// starts under the next one, so a delayed success for the undone key would
// otherwise match and complete the operation with nothing in place.
func successSettles(op events.Operation) bool {
	if op.Phase != events.PhaseAttempt || op.Attempt == 0 {
		return false
	}
	if op.DownstreamKey != events.DownstreamKeyFor(op.Key, op.Compensations) {
		return false
	}
	switch op.Status {
	case events.StatusInProgress, events.StatusNeedsReconciliation, events.StatusEscalated, events.StatusPending:
		return true
	}
	return false
}

// compensatedKey matches the downstream key of a retry after an undo.
var compensatedKey = regexp.MustCompile(`^(.+)~c[1-9][0-9]*$`)

// findLocked finds the operation a callback is about and locks its row for
// the rest of the transaction, so no other writer can move it between the
// load and the append. found is false (with the reason) when there is none
// to act on.
//
// By idempotency key: the key is a downstream key, so the operation key is
// the key itself or, for "K~c2", K. Both candidates are tried (an operation
// key may itself end in "~c1"), and a candidate matches only if its current
// downstream key is the callback's key: a success reported for a key that
// was since compensated and replaced speaks of an effect that was undone,
// and must not complete the retry.
//
// By downstream id: the tool's own id, unique per tool.
//
// Either way the operation must belong to the source: one tool's callbacks
// never settle another tool's operations.
func (w *Webhooks) findLocked(ctx context.Context, tx pgx.Tx, source string, cb callback) (events.Operation, bool, string, error) {
	ignored := "unknown_operation"
	if cb.IdempotencyKey != "" {
		candidates := []string{cb.IdempotencyKey}
		if m := compensatedKey.FindStringSubmatch(cb.IdempotencyKey); m != nil {
			candidates = append(candidates, m[1])
		}
		keys, err := store.LockToolKeysTx(ctx, tx, source, candidates)
		if err != nil {
			return events.Operation{}, false, "", err
		}
		for _, k := range keys {
			op, err := store.LoadTx(ctx, tx, k)
			if err != nil {
				return events.Operation{}, false, "", err
			}
			if op.DownstreamKey == cb.IdempotencyKey {
				return op, true, "", nil
			}
			ignored = "superseded_key"
		}
		if len(keys) > 0 || cb.DownstreamID == "" {
			return events.Operation{}, false, ignored, nil
		}
	}
	keys, err := store.LockByDownstreamIDTx(ctx, tx, source, cb.DownstreamID)
	if err != nil {
		return events.Operation{}, false, "", err
	}
	switch len(keys) {
	case 0:
		return events.Operation{}, false, ignored, nil
	case 1:
		op, err := store.LoadTx(ctx, tx, keys[0])
		return op, err == nil, "", err
	}
	return events.Operation{}, false, "ambiguous_downstream_id", nil
}

func (w *Webhooks) count(ctx context.Context, source, result string) {
	w.tel.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("source", source), attribute.String("result", result)))
}
