package policy

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	got := Caps{}.WithDefaults()
	want := Caps{MaxAttempts: 4, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Deadline: 30 * time.Second}
	if got != want {
		t.Fatalf("WithDefaults() = %+v, want %+v", got, want)
	}
	kept := Caps{MaxAttempts: 9, Deadline: time.Minute}.WithDefaults()
	if kept.MaxAttempts != 9 || kept.Deadline != time.Minute || kept.BaseDelay != DefaultBaseDelay {
		t.Fatalf("WithDefaults overrode a set field: %+v", kept)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := Caps{}.WithDefaults()
	tests := []struct {
		name  string
		caps  Caps
		field string
	}{
		{"zero attempts", Caps{MaxAttempts: 0, BaseDelay: ok.BaseDelay, MaxDelay: ok.MaxDelay, Deadline: ok.Deadline}, "max_attempts"},
		{"negative base", Caps{MaxAttempts: 1, BaseDelay: -1, MaxDelay: ok.MaxDelay, Deadline: ok.Deadline}, "base_delay"},
		{"zero max", Caps{MaxAttempts: 1, BaseDelay: ok.BaseDelay, MaxDelay: 0, Deadline: ok.Deadline}, "max_delay"},
		{"max below base", Caps{MaxAttempts: 1, BaseDelay: time.Second, MaxDelay: time.Millisecond, Deadline: ok.Deadline}, "max_delay"},
		{"zero deadline", Caps{MaxAttempts: 1, BaseDelay: ok.BaseDelay, MaxDelay: ok.MaxDelay}, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.caps.Validate()
			var ce *CapsError
			if !errors.As(err, &ce) || ce.Field != tt.field || !errors.Is(err, ErrInvalidCaps) {
				t.Fatalf("Validate() = %v, want a CapsError on %s", err, tt.field)
			}
		})
	}
}

func TestBackoffCeiling(t *testing.T) {
	t.Parallel()
	c := Caps{MaxAttempts: 10, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, Deadline: time.Hour}
	one := func() float64 { return math.Nextafter(1, 0) }
	tests := []struct {
		attempt int
		ceiling time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond},
		{5, time.Second},
		{64, time.Second},
		{1 << 40, time.Second},
		{math.MaxInt, time.Second},
	}
	for _, tt := range tests {
		got := c.Backoff(tt.attempt, one)
		// The top draw is the ceiling less float rounding.
		if got > tt.ceiling || got < tt.ceiling-time.Microsecond {
			t.Errorf("Backoff(%d, ~1) = %v, want ~%v", tt.attempt, got, tt.ceiling)
		}
		if z := c.Backoff(tt.attempt, func() float64 { return 0 }); z != 0 {
			t.Errorf("Backoff(%d, 0) = %v, want 0", tt.attempt, z)
		}
	}
	// Huge delays must not overflow while doubling.
	huge := Caps{MaxAttempts: 2, BaseDelay: time.Duration(math.MaxInt64 / 3), MaxDelay: time.Duration(math.MaxInt64), Deadline: time.Hour}
	if got := huge.Backoff(100, one); got <= 0 {
		t.Fatalf("Backoff overflowed: %v", got)
	}
	// A broken random source never yields a negative or oversized wait.
	for _, r := range []float64{-1, 2, math.NaN(), math.Inf(1)} {
		if got := c.Backoff(3, func() float64 { return r }); got < 0 || got > 400*time.Millisecond {
			t.Errorf("Backoff with rnd=%v = %v, out of [0, 400ms]", r, got)
		}
	}
}

func TestBackoffFullJitterStatistics(t *testing.T) {
	t.Parallel()
	c := Caps{MaxAttempts: 10, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Deadline: time.Minute}
	src := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		attempt int
		ceiling time.Duration
	}{{1, 200 * time.Millisecond}, {3, 800 * time.Millisecond}, {9, 5 * time.Second}} {
		const n = 10000
		var sum float64
		var low, high int
		for range n {
			d := c.Backoff(tc.attempt, src.Float64)
			if d < 0 || d > tc.ceiling {
				t.Fatalf("attempt %d: Backoff = %v, outside [0, %v]", tc.attempt, d, tc.ceiling)
			}
			sum += float64(d)
			if d < tc.ceiling/4 {
				low++
			}
			if d > tc.ceiling*3/4 {
				high++
			}
		}
		mean := sum / n / float64(tc.ceiling)
		if mean < 0.47 || mean > 0.53 {
			t.Errorf("attempt %d: mean = %.3f of the ceiling, want ~0.5", tc.attempt, mean)
		}
		// Full jitter: the bottom and top quarters are as likely as each other.
		if low < n/5 || high < n/5 {
			t.Errorf("attempt %d: %d draws in the bottom quarter and %d in the top, want ~%d each", tc.attempt, low, high, n/4)
		}
	}
	if got := c.Backoff(1, nil); got < 0 || got > c.BaseDelay {
		t.Fatalf("Backoff with the default source = %v", got)
	}
}

func TestNextRetry(t *testing.T) {
	t.Parallel()
	c := Caps{MaxAttempts: 4, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Deadline: 30 * time.Second}
	first := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	half := func() float64 { return 0.5 }
	tests := []struct {
		name       string
		attempt    int
		now        time.Time
		retryAfter time.Duration
		ok         bool
		due        time.Time
	}{
		{"first retry: half of base", 1, first.Add(time.Second), 0, true, first.Add(time.Second + 100*time.Millisecond)},
		{"third attempt: half of 4×base", 3, first.Add(time.Second), 0, true, first.Add(time.Second + 400*time.Millisecond)},
		{"attempts spent", 4, first.Add(time.Second), 0, false, time.Time{}},
		{"beyond attempts", 7, first.Add(time.Second), 0, false, time.Time{}},
		{"retry-after honored", 1, first.Add(time.Second), 2 * time.Second, true, first.Add(3 * time.Second)},
		{"retry-after below backoff", 3, first.Add(time.Second), 50 * time.Millisecond, true, first.Add(time.Second + 400*time.Millisecond)},
		{"retry-after at max delay", 1, first.Add(time.Second), 5 * time.Second, true, first.Add(6 * time.Second)},
		{"retry-after above max delay", 1, first.Add(time.Second), 5*time.Second + 1, false, time.Time{}},
		{"retry-after past deadline", 1, first.Add(27 * time.Second), 4 * time.Second, false, time.Time{}},
		{"due exactly at deadline", 1, first.Add(30*time.Second - 100*time.Millisecond), 0, true, first.Add(30 * time.Second)},
		{"backoff past deadline", 1, first.Add(30*time.Second - 99*time.Millisecond), 0, false, time.Time{}},
		{"deadline already passed", 1, first.Add(31 * time.Second), 0, false, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			due, ok := c.NextRetry(tt.attempt, first, tt.now, tt.retryAfter, half)
			if ok != tt.ok || !due.Equal(tt.due) {
				t.Fatalf("NextRetry = (%v, %v), want (%v, %v)", due, ok, tt.due, tt.ok)
			}
		})
	}
	t.Run("zero first attempt counts from now", func(t *testing.T) {
		t.Parallel()
		now := first
		due, ok := c.NextRetry(1, time.Time{}, now, 0, half)
		if !ok || !due.Equal(now.Add(100*time.Millisecond)) {
			t.Fatalf("NextRetry = (%v, %v)", due, ok)
		}
	})
}
