// Package policy is the rule of contract §1–§2 as pure functions: given how an
// attempt ended and the tool's effect class and caps, it says whether and
// when the operation is tried again, undone, or handed to reconciliation.
//
// It does no I/O and reads no clock of its own: the executor passes "now"
// and a random source, so every decision is reproducible in a test and the
// same inputs always give the same answer. That matters because the decision
// is written into an event (retry_at, next) and must never depend on which
// worker computed it.
package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults for Caps, matching the example of contract §6.
const (
	DefaultMaxAttempts = 4
	DefaultBaseDelay   = 200 * time.Millisecond
	DefaultMaxDelay    = 5 * time.Second
	DefaultDeadline    = 30 * time.Second
)

// ErrInvalidCaps is wrapped by every *CapsError.
var ErrInvalidCaps = errors.New("invalid retry caps")

// CapsError names the cap that is out of range. Field uses the names of the
// tools file (max_attempts, base_delay, max_delay, deadline) so the registry
// can point at the offending key.
type CapsError struct {
	Field  string
	Reason string
}

func (e *CapsError) Error() string { return e.Field + ": " + e.Reason }

func (e *CapsError) Unwrap() error { return ErrInvalidCaps }

// Caps bound the automatic retries of one operation: how many attempts in
// all, how long to wait between them (exponential backoff with full jitter
// between BaseDelay and MaxDelay), and a Deadline, counted from the first
// attempt, after which no new attempt starts.
type Caps struct {
	MaxAttempts int
	BaseDelay   time.Duration
	MaxDelay    time.Duration
	Deadline    time.Duration
}

// WithDefaults returns c with every zero field set to its default. A zero cap
// is never meaningful (Validate rejects it), so filling it in cannot override
// a choice anybody made.
func (c Caps) WithDefaults() Caps {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BaseDelay == 0 {
		c.BaseDelay = DefaultBaseDelay
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.Deadline == 0 {
		c.Deadline = DefaultDeadline
	}
	return c
}

// Validate reports the first cap that is out of range, as a *CapsError.
func (c Caps) Validate() error {
	switch {
	case c.MaxAttempts < 1:
		return &CapsError{Field: "max_attempts", Reason: fmt.Sprintf("must be at least 1, got %d", c.MaxAttempts)}
	case c.BaseDelay <= 0:
		return &CapsError{Field: "base_delay", Reason: fmt.Sprintf("must be positive, got %v", c.BaseDelay)}
	case c.MaxDelay <= 0:
		return &CapsError{Field: "max_delay", Reason: fmt.Sprintf("must be positive, got %v", c.MaxDelay)}
	case c.MaxDelay < c.BaseDelay:
		return &CapsError{Field: "max_delay", Reason: fmt.Sprintf("%v is below base_delay %v", c.MaxDelay, c.BaseDelay)}
	case c.Deadline <= 0:
		return &CapsError{Field: "deadline", Reason: fmt.Sprintf("must be positive, got %v", c.Deadline)}
	}
	return nil
}

// Backoff is the wait after attempt number attempt (1 for the first) before
// the next one: uniform in [0, min(MaxDelay, BaseDelay·2^(attempt-1))].
//
// Full jitter (rather than "ceiling ± a little") is what spreads a crowd of
// operations that failed together — one downstream outage fails thousands at
// once — evenly over the window, so they do not come back as a second wave.
// The ceiling is computed by doubling until it reaches MaxDelay, so a huge
// attempt number neither overflows nor loops long.
//
// rnd returns a value in [0, 1); nil means math/rand/v2. Zero caps take their
// defaults.
func (c Caps) Backoff(attempt int, rnd func() float64) time.Duration {
	c = c.WithDefaults()
	ceiling := c.BaseDelay
	if ceiling > c.MaxDelay {
		ceiling = c.MaxDelay
	}
	for i := 1; i < attempt && ceiling < c.MaxDelay; i++ {
		if ceiling > c.MaxDelay/2 {
			ceiling = c.MaxDelay
			break
		}
		ceiling *= 2
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	r := rnd()
	switch {
	case r < 0 || math.IsNaN(r): // a broken source: no wait
		r = 0
	case r > 1:
		r = 1
	}
	d := time.Duration(r * float64(ceiling))
	if d > ceiling { // float rounding near the top
		d = ceiling
	}
	return d
}

// NextRetry says when the attempt after attempt (the number of attempts
// started so far) is due, or false when the caps are spent.
//
// The caps are spent when attempt ≥ MaxAttempts, or when the due time would
// fall after firstAttemptAt+Deadline: the deadline bounds when an attempt may
// start, and a jitter draw that lands past it forfeits the retry rather than
// stretching the deadline.
//
// A server's Retry-After is honored: the wait is at least retryAfter. It
// never extends past the caps: a Retry-After larger than MaxDelay, or one
// that lands past the deadline, means no retry (the caps are exhausted).
// Waiting longer than the tool's own worst case would hold the operation
// open beyond what its owner agreed to, and retrying sooner than the server
// asked would only earn another 429.
//
// A zero firstAttemptAt counts the deadline from now.
func (c Caps) NextRetry(attempt int, firstAttemptAt, now time.Time, retryAfter time.Duration, rnd func() float64) (time.Time, bool) {
	c = c.WithDefaults()
	if attempt >= c.MaxAttempts {
		return time.Time{}, false
	}
	if retryAfter > c.MaxDelay {
		return time.Time{}, false
	}
	wait := c.Backoff(attempt, rnd)
	if retryAfter > wait {
		wait = retryAfter
	}
	if firstAttemptAt.IsZero() {
		firstAttemptAt = now
	}
	due := now.Add(wait)
	if due.After(firstAttemptAt.Add(c.Deadline)) {
		return time.Time{}, false
	}
	return due, true
}
