package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// CheckFunc is a Go tool's check hook: business rules a schema cannot
// express ("the order belongs to this principal", "the refund is not above
// what was paid"), run at execution time before every attempt with the
// principal that asked and the args. Return nil to let the attempt go out.
// Any other error rejects the call for good (nothing was sent) and its
// message becomes the reason the agent and the approver see, so it must not
// quote secrets. Wrap an error with Retryable when the rule could not be
// checked (its database was down): the attempt then fails retryably within
// the caps, again with nothing sent.
type CheckFunc func(ctx context.Context, principal string, args json.RawMessage) error

// WithCheck gives a Go tool a check hook.
func WithCheck(f CheckFunc) GoToolOption {
	return func(g *GoTool) { g.check = f }
}

var _ Checker = (*GoTool)(nil)

// Check runs the tool's check hook under the spec's timeout. A panic is a
// check that could not be made: nothing was sent, and the caps bound how
// often it is tried again.
func (g *GoTool) Check(ctx context.Context, c Call) (chk Check, ok bool) {
	if g.check == nil {
		return Check{}, false
	}
	defer func() {
		if p := recover(); p != nil {
			chk = g.checkAnswer(c, Check{Verdict: Unchecked, ErrorClass: "check_panicked",
				Reason: fmt.Sprintf("tool %q: the check panicked: %v", g.spec.Name, p)})
			ok = true
		}
	}()
	ctx, cancel := g.withTimeout(ctx)
	defer cancel()
	err := g.check(ctx, c.Principal, c.Args)
	var re *RetryableError
	switch {
	case err == nil:
		chk = Check{Verdict: Passed}
	case errors.As(err, &re):
		chk = Check{Verdict: Unchecked, ErrorClass: "check_unavailable", Reason: re.Err.Error(), RetryAfter: re.After}
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		chk = Check{Verdict: Unchecked, ErrorClass: "check_timeout", Reason: "the check did not finish in time"}
	default:
		chk = Check{Verdict: Rejected, ErrorClass: ClassCheckRejected, Reason: err.Error()}
	}
	return g.checkAnswer(c, chk), true
}

func (g *GoTool) checkAnswer(c Call, chk Check) Check {
	chk.Evidence = CheckEvidence("check", &g.spec, c, "", "", chk, nil)
	return chk
}
