package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/semconv"
)

// WebhookHandler verifies and applies one inbound callback from a tool
// (contract §7); *reconciler.Webhooks is one. The API declares what it needs
// rather than importing the reconciler.
//
// Handle must return a nil error only after everything the delivery did is
// committed: the API answers 2xx exactly then, and a sender that got no 2xx
// redelivers. Its errors must be classifiable with errors.Is:
//   - events.ErrUnknownSource: no tool by that name accepts callbacks (404);
//   - events.ErrBadSignature, events.ErrStaleTimestamp: the Standard
//     Webhooks signature does not verify, or its timestamp is too far from
//     now (401);
//   - events.ErrInvalidPayload: the verified body is not a callback (400).
//
// Anything else is the server's fault (500): nothing was recorded, so the
// redelivery is processed.
type WebhookHandler interface {
	Handle(ctx context.Context, source string, h http.Header, body []byte, now time.Time) (events.WebhookResult, error)
}

// WebhookHandlerFunc adapts a function to WebhookHandler.
type WebhookHandlerFunc func(ctx context.Context, source string, h http.Header, body []byte, now time.Time) (events.WebhookResult, error)

// Handle implements WebhookHandler.
func (f WebhookHandlerFunc) Handle(ctx context.Context, source string, h http.Header, body []byte, now time.Time) (events.WebhookResult, error) {
	return f(ctx, source, h, body, now)
}

// Error codes of webhooks.
const (
	codeUnknownSource    = "unknown_source"
	codeInvalidSignature = "invalid_signature"
	codeInvalidPayload   = "invalid_payload"
)

// Webhook results: the "status" member of a 200.
const (
	webhookApplied   = "applied"
	webhookDuplicate = "duplicate"
	webhookIgnored   = "ignored"
)

// maxSourceBytes bounds the {source} path segment. Sources are tool names,
// which are short; a longer one cannot exist and is not worth a lookup.
const maxSourceBytes = 256

func (s *Server) webhookRoutes() {
	// Public to the bearer check: a tool authenticates with the signature
	// of its delivery, which Handle verifies before anything else.
	s.HandleFunc("POST /v1/webhooks/{source}", s.postWebhook, Public)
}

// webhookBody answers a committed delivery.
type webhookBody struct {
	Status          string        `json:"status"`
	OperationKey    string        `json:"operation_key,omitempty"`
	OperationStatus events.Status `json:"operation_status,omitempty"`
	Reason          string        `json:"reason,omitempty"`
}

// postWebhook reads the raw body (the signature covers its exact bytes, so
// it is not decoded here), hands it to the WebhookHandler and answers 2xx
// only once that returned, which is after the commit.
//
// The Content-Type is not checked: the signature, not the media type,
// keeps a browser's cross-site form from being accepted, and a sender with
// a sloppy header would otherwise retry a callback forever.
func (s *Server) postWebhook(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	source := r.PathValue("source")
	if source == "" || len(source) > maxSourceBytes {
		writeError(w, http.StatusNotFound, codeUnknownSource, "no webhook source with this name")
		return
	}
	if s.webhooks == nil {
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, "this process accepts no webhooks (no WebhookHandler is configured)")
		return
	}
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge, fmt.Sprintf("the body is over %d bytes", limit))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge, fmt.Sprintf("the body is over %d bytes", limit))
			return
		}
		writeError(w, http.StatusBadRequest, codeInvalidPayload, "the body could not be read")
		return
	}

	res, err := s.webhooks.Handle(ctx, source, r.Header, body, time.Now())
	switch {
	case err == nil:
	case errors.Is(err, events.ErrUnknownSource):
		writeError(w, http.StatusNotFound, codeUnknownSource, "no webhook source with this name")
		return
	case errors.Is(err, events.ErrStaleTimestamp):
		// Logged without the error: it holds nothing the sender lacks, and
		// unauthenticated callers could fill the log with it at Warn.
		s.log.InfoContext(ctx, "webhook refused: stale timestamp", slog.String("source", source))
		writeError(w, http.StatusUnauthorized, codeInvalidSignature,
			"webhook-timestamp is too far from the server's clock (a replay, or a skewed clock)")
		return
	case errors.Is(err, events.ErrBadSignature):
		s.log.InfoContext(ctx, "webhook refused: invalid signature", slog.String("source", source))
		writeError(w, http.StatusUnauthorized, codeInvalidSignature,
			"the webhook-id, webhook-timestamp and webhook-signature headers must carry a valid signature of the body")
		return
	case errors.Is(err, events.ErrInvalidPayload):
		writeError(w, http.StatusBadRequest, codeInvalidPayload,
			"the body is not a callback: a JSON object with type and idempotency_key or downstream_id")
		return
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// Rolled back with the delivery id, so the redelivery is processed.
		s.log.WarnContext(ctx, "webhook did not finish", slog.String("source", source), slog.Any("error", err))
		writeUnavailable(w, "processing the webhook did not finish; redeliver it")
		return
	default:
		s.log.ErrorContext(ctx, "webhook failed", slog.String("source", source), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, codeInternal, "processing the webhook failed; redeliver it")
		return
	}

	out := webhookBody{OperationKey: res.OperationKey, OperationStatus: res.Status}
	switch {
	case res.Duplicate:
		out = webhookBody{Status: webhookDuplicate}
	case res.Applied:
		out.Status = webhookApplied
	default:
		out.Status, out.Reason = webhookIgnored, res.Ignored
	}
	trace.SpanFromContext(ctx).SetAttributes(semconv.WebhookSource.String(source),
		attribute.String("effectline.webhook_result", out.Status))
	if res.OperationKey != "" {
		trace.SpanFromContext(ctx).SetAttributes(semconv.OperationKey.String(res.OperationKey))
	}
	writeJSON(w, http.StatusOK, out)
}
