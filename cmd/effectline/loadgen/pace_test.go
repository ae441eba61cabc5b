package loadgen

import (
	"context"
	"testing"
	"time"
)

// fakeClock advances only when slept on or when a test moves it.
type fakeClock struct{ t time.Time }

func (f *fakeClock) clock() clock {
	return clock{
		now: func() time.Time { return f.t },
		sleep: func(ctx context.Context, d time.Duration) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			f.t = f.t.Add(d)
			return nil
		},
	}
}

// TestPacedCatchesUpAfterAStall: a fire that takes five periods (a stall of
// the machine) is followed by the calls that came due meanwhile, at once,
// so over the run the count is the rate times the time, as asked.
func TestPacedCatchesUpAfterAStall(t *testing.T) {
	fc := &fakeClock{t: time.Unix(1000, 0)}
	start := fc.t
	const period = 4 * time.Millisecond
	var fired []time.Time
	err := paced(context.Background(), fc.clock(), period, func() bool {
		fired = append(fired, fc.t)
		if len(fired) == 10 {
			fc.t = fc.t.Add(5 * period) // this call stalls
		}
		return len(fired) < 100
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fired) != 100 {
		t.Fatalf("fired %d times, want 100", len(fired))
	}
	// The 100th call is due at start+99 periods, and is not later.
	if got, want := fired[99].Sub(start), 99*period; got != want {
		t.Fatalf("last call at %v, want %v: the stall was not caught up", got, want)
	}
	// The calls due during the stall fired at once, at its end.
	for i := 10; i < 15; i++ {
		if got := fired[i].Sub(start); got != 14*period {
			t.Fatalf("call %d at %v, want at the stall's end %v", i, got, 14*period)
		}
	}
	// No call fires before it is due.
	for i, at := range fired {
		if at.Before(start.Add(time.Duration(i) * period)) {
			t.Fatalf("call %d at %v, before it was due", i, at.Sub(start))
		}
	}
}

func TestPacedStopsWithItsContext(t *testing.T) {
	fc := &fakeClock{t: time.Unix(1000, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := paced(ctx, fc.clock(), time.Millisecond, func() bool {
		n++
		if n == 3 {
			cancel()
		}
		return true
	})
	if err != context.Canceled || n != 3 {
		t.Fatalf("err %v after %d calls, want context.Canceled after 3", err, n)
	}
}
