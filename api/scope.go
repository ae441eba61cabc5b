package api

import (
	"context"

	"github.com/effectline/effectline/events"
)

// Who may read what. A principal reads the operations it submitted;
// approvers and the principals of Config.Readers read every operation.
// Another principal's operation is answered as if it did not exist (404 on
// GET, absent from lists), so a key's existence does not leak either, and
// an intent under another principal's key is refused with key_in_use, with
// neither the record nor its result (see answerExisting). The JSON API and
// the UI apply the same rule, through reader.

// reader is who reads: a request's principal, or a UI session's.
type reader struct {
	name     string
	approver bool
}

// readerOf returns the principal of an authenticated request.
func readerOf(ctx context.Context) reader {
	name, _ := PrincipalFrom(ctx)
	return reader{name: name, approver: IsApprover(ctx)}
}

// readsAll reports whether r may read every operation.
func (s *Server) readsAll(r reader) bool {
	return r.name != "" && (r.approver || s.auth.readers[r.name])
}

// mayRead reports whether r may read op.
func (s *Server) mayRead(r reader, op events.Operation) bool {
	return s.readsAll(r) || r.name != "" && r.name == op.Principal
}

// listScope is the principal a list must be narrowed to, "" for a reader
// of all. ok is false for a reader without a name (routes that list are
// authenticated, so only a wiring mistake gets there): it lists nothing
// rather than everything.
func (s *Server) listScope(r reader) (principal string, ok bool) {
	if s.readsAll(r) {
		return "", true
	}
	return r.name, r.name != ""
}
