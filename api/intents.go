package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/semconv"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// intentRequest is the body of POST /v1/intents. Pointers tell a missing
// member from an empty one.
type intentRequest struct {
	OperationKey *string         `json:"operation_key"`
	Tool         *string         `json:"tool"`
	Args         json.RawMessage `json:"args"`
}

// acceptedBody answers an intent that is journaled but not completed.
type acceptedBody struct {
	OperationKey string        `json:"operation_key"`
	Status       events.Status `json:"status"`
	Href         string        `json:"href"`
	// Outcome is the record's: pending, since only an operation that has
	// not settled is answered 202.
	Outcome events.OperationOutcome `json:"outcome"`
}

func operationHref(key string) string { return "/v1/operations/" + url.PathEscape(key) }

// postIntent journals intent.recorded, or answers from the operation when
// the key already exists.
func (s *Server) postIntent(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	principal, _ := PrincipalFrom(ctx)

	var req intentRequest
	if !s.decodeBody(w, r, &req) {
		return
	}
	switch {
	case req.OperationKey == nil:
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "operation_key", "operation_key is required")
		return
	case req.Tool == nil || *req.Tool == "":
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "tool", "tool is required")
		return
	case len(req.Args) == 0 || bytes.Equal(req.Args, []byte("null")):
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "args", "args is required (a JSON object; {} for none)")
		return
	}
	key, name := *req.OperationKey, *req.Tool
	if reason := checkOperationKey(key); reason != "" {
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "operation_key", reason)
		return
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(semconv.OperationKey.String(key), semconv.Tool.String(name))

	t, ok := s.tools.Get(name)
	if !ok {
		writeFieldError(w, http.StatusNotFound, codeUnknownTool, "tool", "no tool with this name is registered")
		return
	}
	if t.Spec().Internal {
		// A generated undo tool (<tool>~undo): only the workflow engine
		// records its intents, in the transition that unwinds a run. A
		// caller's own undo would run the compensation outside any run's
		// order, so the tool is as unknown here as it is to MCP.
		writeFieldError(w, http.StatusNotFound, codeUnknownTool, "tool",
			"this tool is internal to the workflow engine (a step's undo) and cannot be submitted")
		return
	}
	if err := t.Spec().Authorize(principal); err != nil {
		writeError(w, http.StatusForbidden, codeForbidden, "this principal may not use this tool")
		return
	}
	if req.Args[0] != '{' {
		writeFieldError(w, http.StatusBadRequest, codeInvalidArgs, "", "args must be a JSON object")
		return
	}
	if err := t.Spec().ValidateArgs(req.Args); err != nil {
		var ae *tool.ArgsError
		if errors.As(err, &ae) {
			writeFieldError(w, http.StatusBadRequest, codeInvalidArgs, ae.Field, scrubReason(ae.Reason, req.Args))
			return
		}
		s.log.ErrorContext(ctx, "validating args failed", slog.String("tool", name), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, codeInternal, "the tool's args schema could not be applied")
		return
	}
	// The hash is what tells a retry from a different request under the
	// same key. Hashing here, before journaling, also turns args that cannot
	// be canonicalized (duplicate members, invalid UTF-8, numbers beyond a
	// double) into a 400 rather than a failed append.
	hash, err := events.PayloadHash(req.Args)
	if err != nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidArgs, "",
			"args must be canonicalizable JSON: no duplicate members, valid UTF-8, numbers within an IEEE-754 double")
		return
	}
	var args bytes.Buffer
	if err := json.Compact(&args, req.Args); err != nil {
		writeFieldError(w, http.StatusBadRequest, codeInvalidArgs, "", "args are not valid JSON")
		return
	}
	// The event store caps one event (events.MaxEnvelopeBytes); args that
	// cannot fit are refused here as too large, rather than as a failed
	// append. The margin covers the envelope's other members.
	if size := args.Len() + len(key) + len(name) + len(principal) + envelopeOverhead; size > events.MaxEnvelopeBytes {
		writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge,
			fmt.Sprintf("the args do not fit in one event (%d bytes at most)", events.MaxEnvelopeBytes))
		return
	}
	effect := t.Spec().Effect
	span.SetAttributes(semconv.EffectClass.String(string(effect)))

	// The wait is registered before the intent is journaled, so no event
	// of the operation can slip past it.
	var wt *waiter
	if d, ok := preferWait(r); ok {
		wt = s.startWait(w, key, d)
		defer wt.close()
	}

	ev, err := events.New(events.IntentRecorded, key, 1, name, effect, 0,
		events.IntentData{Args: args.Bytes(), Principal: principal}, time.Now())
	if err != nil {
		s.fail(ctx, w, "building the intent", key, err)
		return
	}
	op, err := s.committer.Append(ctx, store.Append{
		Events: []events.Envelope{ev},
		// The span of this request is a child of the caller's traceparent
		// (if any), so storing it makes the executor's attempts continue the
		// caller's trace (contract §8).
		Traceparent: traceparent.FromContext(ctx),
		TopicPrefix: s.cfg.TopicPrefix,
	})
	switch {
	case err == nil:
		s.tel.intent(ctx, name, "recorded")
		s.log.InfoContext(ctx, "intent recorded", slog.String("operation_key", key), slog.String("tool", name),
			slog.String("principal", principal), slog.String("status", string(op.Status)))
		if wt != nil {
			s.answerWaited(ctx, w, wt, op, t)
			return
		}
		s.writeAccepted(w, op)
	case store.IsConflict(err):
		s.answerExisting(ctx, w, t, key, name, hash, principal, wt)
	default:
		var de *events.DecodeError
		switch {
		case errors.As(err, &de) && de.Field == "":
			// The encoded envelope is over the event size cap after all
			// (encoding/json escapes <, > and & in args, which the estimate
			// above does not count).
			writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge,
				fmt.Sprintf("the args do not fit in one event (%d bytes at most)", events.MaxEnvelopeBytes))
			return
		case errors.As(err, &de):
			// The envelope breaks a rule of the event format the checks
			// above do not repeat.
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, de.Field, de.Reason)
			return
		}
		s.fail(ctx, w, "journaling the intent", key, err)
	}
}

// answerExisting answers an intent whose key is taken. The insert lost to a
// committed operation, so the head record is there to read; the answer
// depends only on it, never on which request came first.
func (s *Server) answerExisting(ctx context.Context, w http.ResponseWriter, t tool.Tool, key, name, hash, principal string, wt *waiter) {
	op, err := s.store.Load(ctx, key)
	tomb, pruned := store.AsPruned(err)
	if err != nil && !pruned {
		s.fail(ctx, w, "loading the existing operation", key, err)
		return
	}
	owner := op.Principal
	if pruned {
		owner = tomb.Principal // a tombstone is scoped like the live record
	}
	if owner != principal {
		// Another principal's key: neither its record nor its result, nor
		// whether its args match, is this caller's to learn.
		s.tel.intent(ctx, name, "key_in_use")
		s.log.WarnContext(ctx, "intent rejected: operation key in use by another principal",
			slog.String("operation_key", key), slog.String("tool", name), slog.String("principal", principal))
		writeError(w, http.StatusConflict, codeKeyInUse, "this operation_key is in use by another principal")
		return
	}
	if pruned {
		s.answerTombstone(ctx, w, tomb, name, hash, principal)
		return
	}
	trace.SpanFromContext(ctx).SetAttributes(semconv.Status.String(string(op.Status)))
	if op.Tool != name || op.PayloadHash != hash {
		s.tel.intent(ctx, name, "conflict")
		s.log.WarnContext(ctx, "intent rejected: operation key reused with other args",
			slog.String("operation_key", key), slog.String("tool", name), slog.String("principal", principal))
		writeError(w, http.StatusConflict, codePayloadConflict,
			"this operation_key was already used with another tool or other args")
		return
	}
	// Any settled operation, failed and unknown as much as completed,
	// answers 200: its record is the answer, and a 202 would tell the
	// caller it is still in flight.
	if events.OutcomeOf(op).State.Settled() {
		result := "settled"
		if op.Status == events.StatusCompleted {
			result = "completed"
		}
		s.tel.intent(ctx, name, result)
		writeJSON(w, http.StatusOK, renderOperation(op, t))
		return
	}
	s.tel.intent(ctx, name, "duplicate")
	if wt != nil {
		s.answerWaited(ctx, w, wt, op, t)
		return
	}
	s.writeAccepted(w, op)
}

func (s *Server) writeAccepted(w http.ResponseWriter, op events.Operation) {
	href := operationHref(op.Key)
	w.Header().Set("Location", href)
	writeJSON(w, http.StatusAccepted, acceptedBody{OperationKey: op.Key, Status: op.Status, Href: href,
		Outcome: events.OutcomeOf(op)})
}

// fail answers a failure of the server or its dependencies. A deadline or a
// stopping committer is answered 503: retrying with the same operation key
// is always safe, as the intent is journaled at most once.
func (s *Server) fail(ctx context.Context, w http.ResponseWriter, what, key string, err error) {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, store.ErrCommitterStopped):
		s.log.WarnContext(ctx, what+" did not finish", slog.String("operation_key", key), slog.Any("error", err))
		writeUnavailable(w, fmt.Sprintf("%s did not finish; retry with the same operation_key", what))
	default:
		s.log.ErrorContext(ctx, what+" failed", slog.String("operation_key", key), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, codeInternal, what+" failed")
	}
}

// envelopeOverhead bounds what an intent.recorded envelope holds besides
// its args, key, tool and principal: member names, an event id, a time.
const envelopeOverhead = 512

// scrubReason returns a schema validator's reason unless it quotes a string
// value of the args: some validators say what they got ("'4111…' does not
// match pattern …"), and args may be secret. The field still says where.
func scrubReason(reason string, args json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "the value does not match the tool's args schema"
	}
	// A value is taken as quoted when it appears in the validator's
	// quotes, or anywhere once it is long enough not to be a word of the
	// message itself.
	quotes := func(s string) bool {
		return s != "" && (strings.Contains(reason, "'"+s+"'") || len(s) >= 6 && strings.Contains(reason, s))
	}
	leaks := false
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for _, e := range t {
				walk(e)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		case string:
			leaks = leaks || quotes(t)
		case json.Number:
			leaks = leaks || quotes(t.String())
		}
	}
	walk(v)
	if leaks {
		return "the value does not match the tool's args schema"
	}
	return reason
}

// checkOperationKey returns why key is unacceptable, or "": the one key
// rule of events.CheckOperationKey, worded for the API's answers.
func checkOperationKey(key string) string {
	if err := events.CheckOperationKey(key); err != nil {
		return "operation_key: " + strings.TrimPrefix(err.Error(), events.ErrInvalidOperationKey.Error()+": ")
	}
	return ""
}
