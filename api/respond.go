package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// Error codes: the "error" member of every error response. Clients branch on
// these, never on "detail", which is for people.
const (
	codeInvalidJSON          = "invalid_json"
	codeInvalidRequest       = "invalid_request"
	codeInvalidArgs          = "invalid_args"
	codeUnauthorized         = "unauthorized"
	codeForbidden            = "forbidden"
	codeNotFound             = "not_found"
	codeUnknownTool          = "unknown_tool"
	codeMethodNotAllowed     = "method_not_allowed"
	codePayloadConflict      = "payload_conflict"
	codeKeyInUse             = "key_in_use"
	codePayloadTooLarge      = "payload_too_large"
	codeUnsupportedMediaType = "unsupported_media_type"
	codeInternal             = "internal"
	codeUnavailable          = "unavailable"
)

// errorBody is every error response. Detail never contains args, results or
// credentials: it names what is wrong, not the value that was.
type errorBody struct {
	Error  string `json:"error"`
	Field  string `json:"field,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// writeJSON writes v as the response. Responses may hold tool results, so
// they are marked uncacheable.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a programming error gets here (every response type
		// marshals); answer something well-formed rather than half a body.
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal","detail":"the response could not be encoded"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, detail string) {
	writeJSON(w, status, errorBody{Error: code, Detail: detail})
}

func writeFieldError(w http.ResponseWriter, status int, code, field, detail string) {
	writeJSON(w, status, errorBody{Error: code, Field: field, Detail: detail})
}

// writeUnavailable answers 503 with a Retry-After, for failures a retry with
// the same request (and so the same operation key) resolves.
func writeUnavailable(w http.ResponseWriter, detail string) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, codeUnavailable, detail)
}

// decodeBody strictly decodes a JSON request body into v, answering the
// request itself when the body is unacceptable. It reports whether v holds a
// body to act on.
//
// Strict means: Content-Type application/json (which, as a non-"simple"
// type, makes a browser preflight a cross-site request, so a web page cannot
// post intents to a dev server running open on localhost), at most
// MaxBodyBytes, no unknown members, one JSON value and nothing after it.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, codeUnsupportedMediaType, "the body must be application/json")
		return false
	}
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge, fmt.Sprintf("the body is over %d bytes", limit))
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge, fmt.Sprintf("the body is over %d bytes", limit))
			return false
		}
		// The client went away or stalled past ReadTimeout mid-body.
		writeError(w, http.StatusBadRequest, codeInvalidJSON, "the body could not be read")
		return false
	}
	if field, reason := strictBody(body); reason != "" {
		writeFieldError(w, http.StatusBadRequest, codeInvalidJSON, field, reason)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeDecodeError(w, err)
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, codeInvalidJSON, "the body must hold one JSON object and nothing after it")
		return false
	}
	return true
}

// writeDecodeError answers a body encoding/json refused. The messages of
// encoding/json quote member names but never values, and only the member
// name is passed on.
func writeDecodeError(w http.ResponseWriter, err error) {
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, typeErr.Field,
			fmt.Sprintf("%s must be a JSON %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String())))
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, codeInvalidRequest, "the body must be a JSON object")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for DisallowUnknownFields.
		field, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, field, "unknown member "+strconv.Quote(field))
	default:
		writeError(w, http.StatusBadRequest, codeInvalidJSON, "the body is not valid JSON")
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	case "bool":
		return "boolean"
	}
	return "value of another type"
}
