package pacing

import (
	"testing"
	"time"
)

func TestPaceHoldsOnlyWhileAppendsArriveSteadily(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// steady feeds p 100ms of 1,000 appends/s, two every 2ms as at 500
	// operations/s, and returns when the last flush began.
	steady := func(p *Pace) time.Time {
		for i := range 50 {
			p.Flushed(at(time.Duration(i)*2*time.Millisecond), 2)
		}
		return at(98 * time.Millisecond)
	}

	t.Run("the first flush is never held", func(t *testing.T) {
		p := Pace{window: 4 * time.Millisecond}
		if got := p.Hold(t0); got != 0 {
			t.Fatalf("hold = %v, want 0", got)
		}
	})

	t.Run("a lone operation's second append is not held", func(t *testing.T) {
		// Its claim committed alone 1.5ms ago: one append in the last
		// 50ms promises nobody to wait for.
		p := Pace{window: 4 * time.Millisecond}
		p.Flushed(t0, 1)
		if got := p.Hold(at(1500 * time.Microsecond)); got != 0 {
			t.Fatalf("hold = %v, want 0", got)
		}
	})

	t.Run("a steady stream is held until a window after the previous flush", func(t *testing.T) {
		p := Pace{window: 4 * time.Millisecond}
		last := steady(&p)
		if got, want := p.Hold(last.Add(time.Millisecond)), 3*time.Millisecond; got != want {
			t.Fatalf("hold 1ms after a flush = %v, want %v", got, want)
		}
		if got := p.Hold(last.Add(4 * time.Millisecond)); got != 0 {
			t.Fatalf("hold a whole window after a flush = %v, want 0", got)
		}
	})

	t.Run("pacing ends when the stream does", func(t *testing.T) {
		p := Pace{window: 4 * time.Millisecond}
		steady(&p)
		// A quiet 300ms, then one operation: its claim goes at once (a
		// window has passed) and its outcome, 1.5ms later, is not held
		// either, because the stream's count has faded.
		claim := at(400 * time.Millisecond)
		if got := p.Hold(claim); got != 0 {
			t.Fatalf("claim held %v, want 0", got)
		}
		p.Flushed(claim, 1)
		if got := p.Hold(claim.Add(1500 * time.Microsecond)); got != 0 {
			t.Fatalf("outcome held %v, want 0", got)
		}
	})

	t.Run("a window of zero or less never holds", func(t *testing.T) {
		for _, w := range []time.Duration{0, -time.Millisecond} {
			p := Pace{window: w}
			last := steady(&p)
			if got := p.Hold(last.Add(time.Millisecond)); got != 0 {
				t.Fatalf("window %v: hold = %v, want 0", w, got)
			}
		}
	})
}
