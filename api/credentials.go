package api

import (
	"errors"
	"fmt"
	"slices"
)

// MinTokenLength is the shortest API token the server accepts. A bearer
// token is the whole of a principal's credential; 16 characters of
// `openssl rand -hex 16` (which makes 32) is a floor against guessing, not
// a target.
const MinTokenLength = 16

// CheckCredentials is what New checks of c's tokens and approvers, for a
// caller that wants to refuse a bad configuration before doing anything
// else (cmd checks it before connecting to Kafka).
func (c Config) CheckCredentials() error { return checkCredentials(c) }

// checkCredentials refuses tokens and approvers that would leave the API
// weaker than it looks: a token short enough to guess, and an approver with
// no token, whom nobody can sign in as, so escalations wait for a decision
// nobody can make. Errors name the principal, never the token.
func checkCredentials(c Config) error {
	holders := map[string]bool{}
	var errs []error
	for token, principal := range c.Tokens {
		if token == "" || principal == "" {
			return errors.New("api tokens: every token needs a non-empty token and principal")
		}
		holders[principal] = true
		if n := len([]rune(token)); n < MinTokenLength {
			errs = append(errs, fmt.Errorf("EFFECTLINE_API_TOKENS: the token of %s is %d characters; at least %d are required (`openssl rand -hex 16` makes one)",
				principal, n, MinTokenLength))
		}
	}
	// In open mode a request without a known token is DevPrincipal, who
	// holds the approver role, so someone can always decide.
	if !c.Open {
		approvers := slices.Clone(c.Approvers)
		slices.Sort(approvers)
		for _, name := range slices.Compact(approvers) {
			if !holders[name] {
				errs = append(errs, fmt.Errorf("EFFECTLINE_APPROVERS names %s, who has no token in EFFECTLINE_API_TOKENS: nobody could sign in to decide as %s",
					name, name))
			}
		}
	}
	// Sorted, so the message is the same at every start.
	slices.SortFunc(errs, func(a, b error) int {
		switch {
		case a.Error() < b.Error():
			return -1
		case a.Error() > b.Error():
			return 1
		}
		return 0
	})
	return errors.Join(errs...)
}
