package service

import (
	"context"
	"log/slog"
	"time"
)

// Loop runs RunOnce at start and then about every Interval until its
// context ends. RunOnce reports what it did as [Counts]; the loop logs a
// round only when a count is not zero, and a failure only at the first of
// a streak and when the streak ends, so a quiet loop is quiet and an
// outage is two lines, not one per round.
//
// After a failure the next round waits a backoff instead of Interval,
// doubling from Backoff.Base up to Backoff.Max with equal jitter (half
// fixed, half random: the fixed half bounds the attempt rate, the random
// half keeps replicas that failed together from retrying together). Wake
// is not served during a backoff: during an outage every wake-up would
// otherwise be an attempt.
type Loop struct {
	// Name starts the loop's log messages: "<Name> failed; retrying with
	// backoff" and "<Name> again".
	Name string
	// Did is the message of a round that did something, logged at
	// DidLevel with the counts as attributes.
	Did      string
	DidLevel slog.Level
	// Interval is the time between rounds; Jitter spreads each wait
	// uniformly over Interval × (1 ± Jitter), so replicas started together
	// drift apart. Zero Jitter is an exact ticker.
	Interval time.Duration
	Jitter   float64
	// Backoff is the wait after consecutive failures. Zero fields default
	// to Interval.
	Backoff Backoff
	// Wake, when not nil, starts a round at once when it receives.
	Wake <-chan struct{}
	// RunOnce is one round.
	RunOnce func(ctx context.Context) (Counts, error)
	// OnError, when not nil, is told of every failed round (to count it).
	OnError func(error)
	// Base gives the logger, the clock and the randomness.
	Base Base
}

// Backoff bounds the wait after failures: Base after the first, doubling
// per failure up to Max.
type Backoff struct {
	Base, Max time.Duration
}

// Count is one thing a round did, by name ("published", "leases_expired").
type Count struct {
	Name string
	N    int
}

// Counts is what one round did, in the order it is logged.
type Counts []Count

// Zero reports whether nothing happened.
func (cs Counts) Zero() bool {
	for _, c := range cs {
		if c.N != 0 {
			return false
		}
	}
	return true
}

// Run runs the loop until ctx ends. It returns nothing: a failing round is
// retried, never fatal.
func (l Loop) Run(ctx context.Context) {
	b := l.Base.WithDefaults()
	log := b.Logger
	if l.Backoff.Base <= 0 {
		l.Backoff.Base = l.Interval
	}
	if l.Backoff.Max <= 0 {
		l.Backoff.Max = max(l.Interval, l.Backoff.Base)
	}
	var failures int
	var since time.Time
	var timer *time.Timer
	wait := func(d time.Duration, wake <-chan struct{}) bool {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		case <-wake:
			timer.Stop()
		}
		return true
	}
	for {
		counts, err := l.RunOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if l.OnError != nil {
				l.OnError(err)
			}
			if failures == 0 {
				since = b.Now()
				log.ErrorContext(ctx, l.Name+" failed; retrying with backoff", "error", err)
			}
			failures++
			if !wait(l.backoff(failures, b.Rand), nil) {
				return
			}
			continue
		}
		if failures > 0 {
			log.InfoContext(ctx, l.Name+" again",
				"failed_attempts", failures, "outage", b.Now().Sub(since).Round(time.Millisecond))
			failures = 0
		}
		if !counts.Zero() && log.Enabled(ctx, l.DidLevel) {
			attrs := make([]any, 0, 2*len(counts))
			for _, c := range counts {
				attrs = append(attrs, c.Name, c.N)
			}
			log.Log(ctx, l.DidLevel, l.Did, attrs...)
		}
		if !wait(l.interval(b.Rand), l.Wake) {
			return
		}
	}
}

// interval is the wait between successful rounds.
func (l Loop) interval(rnd func() float64) time.Duration {
	if l.Jitter <= 0 {
		return l.Interval
	}
	return time.Duration(float64(l.Interval) * (1 - l.Jitter + 2*l.Jitter*rnd()))
}

// backoff is the wait after the nth consecutive failure.
func (l Loop) backoff(n int, rnd func() float64) time.Duration { return l.Backoff.After(n, rnd) }

// After returns the wait after the nth consecutive failure: Base doubled
// n-1 times, capped at Max, with equal jitter (half fixed, half drawn from
// rnd, a uniform float in [0, 1)).
func (b Backoff) After(n int, rnd func() float64) time.Duration {
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + time.Duration(rnd()*float64(half))
}

// Sleep waits d or until ctx is done, reporting whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
