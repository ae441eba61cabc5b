package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// Access is what a route requires of the caller.
type Access int

const (
	// Public routes need no token: health, readiness, metrics, the OpenAPI
	// document. They must not reveal operations.
	Public Access = iota
	// Authenticated routes need a known bearer token (any principal).
	Authenticated
	// ApproverOnly routes need a principal holding the approver role.
	ApproverOnly
)

func (a Access) String() string {
	switch a {
	case Public:
		return "public"
	case Authenticated:
		return "authenticated"
	case ApproverOnly:
		return "approver"
	}
	return "unknown"
}

type principalKey struct{}

type principal struct {
	name     string
	approver bool
}

// ContextWithPrincipal returns ctx carrying an authenticated principal. The
// server does this for every authenticated request; tests of handlers use it
// directly.
func ContextWithPrincipal(ctx context.Context, name string, approver bool) context.Context {
	return context.WithValue(ctx, principalKey{}, principal{name: name, approver: approver})
}

// PrincipalFrom returns the authenticated principal of a request's context.
func PrincipalFrom(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(principal)
	return p.name, ok
}

// IsApprover reports whether the request's principal holds the approver role.
func IsApprover(ctx context.Context) bool {
	p, ok := ctx.Value(principalKey{}).(principal)
	return ok && p.approver
}

// authenticator maps bearer tokens to principals.
type authenticator struct {
	open bool
	// tokens holds SHA-256 digests, not tokens: comparing fixed-length
	// digests keeps the comparison constant-time whatever the lengths, and
	// the server keeps no token it does not need.
	tokens    []tokenEntry
	approvers map[string]bool
	// readers read every operation without holding the approver role.
	readers map[string]bool
}

type tokenEntry struct {
	digest    [sha256.Size]byte
	principal string
}

func newAuthenticator(cfg Config) *authenticator {
	a := &authenticator{open: cfg.Open, approvers: map[string]bool{}, readers: map[string]bool{}}
	for _, name := range cfg.Readers {
		a.readers[name] = true
	}
	for token, name := range cfg.Tokens {
		a.tokens = append(a.tokens, tokenEntry{digest: sha256.Sum256([]byte(token)), principal: name})
	}
	for _, name := range cfg.Approvers {
		a.approvers[name] = true
	}
	return a
}

// authenticate returns the request's principal, or false when it has none.
func (a *authenticator) authenticate(r *http.Request) (principal, bool) {
	if token, ok := bearerToken(r.Header.Get("Authorization")); ok {
		digest := sha256.Sum256([]byte(token))
		var found string
		// Every entry is compared, with no early exit, so the time taken
		// says nothing about which token (or how much of one) matched.
		for _, e := range a.tokens {
			if subtle.ConstantTimeCompare(digest[:], e.digest[:]) == 1 {
				found = e.principal
			}
		}
		if found != "" {
			return principal{name: found, approver: a.approvers[found]}, true
		}
	}
	if a.open {
		return principal{name: DevPrincipal, approver: true}, true
	}
	return principal{}, false
}

// bearerToken extracts the token of an "Authorization: Bearer <token>"
// header (RFC 6750; the scheme is case-insensitive).
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// guard enforces access on a route.
func (s *Server) guard(access Access, next http.Handler) http.Handler {
	if access == Public {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.auth.authenticate(r)
		if !ok {
			// Never log the header: it may be a real token sent to the
			// wrong server, or a near miss of one.
			w.Header().Set("WWW-Authenticate", `Bearer realm="effectline"`)
			writeError(w, http.StatusUnauthorized, codeUnauthorized, "a valid bearer token is required")
			return
		}
		if access == ApproverOnly && !p.approver {
			writeError(w, http.StatusForbidden, codeForbidden, "the approver role is required")
			return
		}
		setSpanPrincipal(r.Context(), p.name)
		next.ServeHTTP(w, r.WithContext(ContextWithPrincipal(r.Context(), p.name, p.approver)))
	})
}
