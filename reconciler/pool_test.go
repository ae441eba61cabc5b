package reconciler

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An operation is in the pool once: submits while it is queued fold into
// it, a submit while it runs makes it run once more afterwards, and a job
// asking to run again later comes back after its delay with its ask count.
func TestPoolKeyedDedup(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		running  = map[string]int{}
		overlap  atomic.Bool
		runs     = map[string]int{}
		asksSeen []int
	)
	release := make(chan struct{})
	started := make(chan string, 16)
	p := newPool(4, func(ctx context.Context, key, _ string, asks int) (int, time.Duration) {
		mu.Lock()
		running[key]++
		if running[key] > 1 {
			overlap.Store(true)
		}
		runs[key]++
		n := runs[key]
		if key == "reask" {
			asksSeen = append(asksSeen, asks)
		}
		mu.Unlock()
		started <- key
		if key == "slow" && n == 1 {
			<-release
		}
		mu.Lock()
		running[key]--
		mu.Unlock()
		if key == "reask" && asks < 2 {
			return asks + 1, time.Millisecond
		}
		return 0, 0
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()

	if _, err := p.submit(ctx, "slow", ""); err != nil {
		t.Fatal(err)
	}
	if k := <-started; k != "slow" {
		t.Fatalf("started %s", k)
	}
	for range 10 { // while it runs: one rerun, not ten, and never concurrently
		if _, err := p.submit(ctx, "slow", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.submit(ctx, "reask", ""); err != nil {
		t.Fatal(err)
	}
	// Other keys are not held up by the slow one.
	for range 3 {
		if k := <-started; k != "reask" {
			t.Fatalf("started %s, want the re-asks of another key first", k)
		}
	}
	close(release)
	if k := <-started; k != "slow" {
		t.Fatalf("started %s, want the rerun of slow", k)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.entries)
		p.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries left in the pool", n)
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["slow"] != 2 || overlap.Load() {
		t.Fatalf("slow ran %d times (overlapping: %v), want twice, never at once", runs["slow"], overlap.Load())
	}
	if len(asksSeen) != 3 || asksSeen[0] != 0 || asksSeen[1] != 1 || asksSeen[2] != 2 {
		t.Fatalf("re-asks saw ask counts %v, want [0 1 2]", asksSeen)
	}
	cancel()
	<-done
}

// Stopping the pool with a re-ask pending returns promptly and leaves no
// timer goroutine behind; submits after the stop fail rather than block.
func TestPoolStopsWithPendingReask(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	p := newPool(1, func(context.Context, string, string, int) (int, time.Duration) {
		calls.Add(1)
		return 1, time.Hour
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	if _, err := p.submit(ctx, "k", ""); err != nil {
		t.Fatal(err)
	}
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the pool did not stop with a re-ask pending")
	}
	if _, err := p.submit(context.Background(), "other", ""); err == nil {
		t.Fatal("submit after stop succeeded")
	}
}
