package store

import (
	"math"
	"time"
)

// DefaultCommitWindow is the committer's Window unless configured.
const DefaultCommitWindow = 4 * time.Millisecond

// pace decides how long the committer's first flusher holds a batch open
// before committing it. Holding pays only when more appends are due within
// the window; otherwise it is pure latency. So it holds only while the
// recent arrival rate promises at least one more append per window, and
// then only until a window has passed since its previous commit began.
//
// The rate is a decayed count of flushed appends: each counts 1 when
// flushed and fades with time constant memory, so count/memory estimates
// appends per second over the last few tens of milliseconds.
type pace struct {
	window time.Duration
	last   time.Time // when the previous flush began
	count  float64   // decayed appends, as of last
}

// memory is how far back the arrival rate looks: long enough to span
// several windows, short enough that a burst's pacing ends soon after it.
const paceMemory = 50 * time.Millisecond

// hold returns how long a flush about to begin at now should wait.
func (p *pace) hold(now time.Time) time.Duration {
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

// flushed records a flush of n appends beginning at now.
func (p *pace) flushed(now time.Time, n int) {
	if !p.last.IsZero() {
		p.count = p.decayed(now.Sub(p.last))
	}
	p.count += float64(n)
	p.last = now
}

func (p *pace) decayed(since time.Duration) float64 {
	return p.count * math.Exp(-float64(since)/float64(paceMemory))
}
