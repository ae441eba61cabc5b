package loadgen

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestHistogramQuantiles checks the soak's fixed-size histogram against
// the exact percentiles of the same samples: within the 2 % of a bucket.
func TestHistogramQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h histogram
	var all []time.Duration
	for range 100000 {
		// Log-normal around 10ms, with a tail into seconds.
		d := time.Duration(float64(10*time.Millisecond) * r.ExpFloat64() * r.ExpFloat64())
		h.add(d)
		all = append(all, d)
	}
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := all[int(q*float64(len(all)))-1]
		got := h.quantile(q)
		if diff := float64(got-want) / float64(want); diff < -0.02 || diff > 0.02 {
			t.Errorf("p%g: histogram says %s, the samples %s", q*100, got, want)
		}
	}
	if h.quantile(1) != all[len(all)-1] {
		t.Errorf("p100 = %s, want the maximum %s", h.quantile(1), all[len(all)-1])
	}
	var empty histogram
	if empty.quantile(0.99) != 0 {
		t.Error("an empty histogram has a p99")
	}
	var tiny histogram
	tiny.add(time.Microsecond)
	tiny.add(time.Microsecond)
	if got := tiny.quantile(0.5); got != time.Microsecond {
		t.Errorf("samples below the first bucket read back as %s, want %s", got, time.Microsecond)
	}
}

// TestBenchToolDuplicates checks the bit-per-key duplicate count.
func TestBenchToolDuplicates(t *testing.T) {
	bt := &benchTool{seen: map[string][]uint64{}, other: map[string]int{}}
	for _, k := range []string{benchKey(0), benchKey(63), benchKey(64), benchKey(100000), warmupKey(0), "other", ""} {
		bt.called(k)
	}
	if bt.duplicates() != 0 {
		t.Fatalf("%d duplicates among distinct keys", bt.duplicates())
	}
	for _, k := range []string{benchKey(64), benchKey(100000), warmupKey(0), "other"} {
		bt.called(k)
	}
	if bt.duplicates() != 4 {
		t.Fatalf("%d duplicates, want 4", bt.duplicates())
	}
}

// TestInFlight checks the soak's bookkeeping: a completion counts once,
// an outcome seen before the commit time is recorded still counts, and
// an operation in flight longer than soakLostAfter counts as lost.
func TestInFlight(t *testing.T) {
	f := newInFlight()
	now := time.Now()
	f.begin([]string{"a", "b", "c"})
	f.complete("a", now) // before its commit time was recorded
	f.committed([]string{"a", "b", "c"}, now.Add(-2*soakLostAfter))
	f.complete("b", now)
	f.complete("b", now) // relayed twice
	done, h, total, pending, lost := f.window(now)
	if done != 2 || total != 2 || pending != 1 || lost != 1 || h.n != 1 || f.repeats != 1 {
		t.Fatalf("done=%d total=%d pending=%d lost=%d samples=%d repeats=%d", done, total, pending, lost, h.n, f.repeats)
	}
	if done, _, total, _, _ := f.window(now); done != 0 || total != 2 {
		t.Fatalf("the next window starts with done=%d, total=%d", done, total)
	}
}
