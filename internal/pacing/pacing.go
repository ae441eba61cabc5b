// Package pacing is how a group commit's flushers take their batches
// (Queue) and how long the first of them holds a batch open (Pace): the
// journal's committer (store.Committer) and the read model's batcher
// (projector) both flush from it, and the outbox relay spaces its cycles
// with a Pace when given a window (outbox.RelayConfig.Window).
package pacing

import (
	"math"
	"time"
)

// Pace decides how long a group commit's first flusher holds a batch open
// before committing it. Holding pays only when more items are due within
// the window; otherwise it is pure latency. So it holds only while the
// recent arrival rate promises at least one more item per window, and
// then only until a window has passed since its previous commit began.
// A Pace is not safe for concurrent use; one flusher owns it.
//
// The rate is a decayed count of flushed items: each counts 1 when
// flushed and fades with time constant memory, so count/memory estimates
// items per second over the last few tens of milliseconds.
type Pace struct {
	window time.Duration
	last   time.Time // when the previous flush began
	count  float64   // decayed items, as of last
}

// New returns a Pace that keeps flushes window apart while items arrive
// steadily; a window of 0 or less never holds.
func New(window time.Duration) Pace { return Pace{window: window} }

// paceMemory is how far back the arrival rate looks: long enough to span
// several windows, short enough that a burst's pacing ends soon after it.
const paceMemory = 50 * time.Millisecond

// Hold returns how long a flush about to begin at now should wait.
func (p *Pace) Hold(now time.Time) time.Duration {
	if p.window <= 0 || p.last.IsZero() {
		return 0
	}
	since := now.Sub(p.last)
	if since >= p.window {
		return 0
	}
	perWindow := p.decayed(since) / float64(paceMemory) * float64(p.window)
	if perWindow < 1 {
		return 0
	}
	return p.window - since
}

// Flushed records a flush of n items beginning at now.
func (p *Pace) Flushed(now time.Time, n int) {
	if !p.last.IsZero() {
		p.count = p.decayed(now.Sub(p.last))
	}
	p.count += float64(n)
	p.last = now
}

func (p *Pace) decayed(since time.Duration) float64 {
	return p.count * math.Exp(-float64(since)/float64(paceMemory))
}
