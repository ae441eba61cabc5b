package service

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log sink the loop's goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), "msg=\""+msg+"\"") + strings.Count(s.b.String(), "msg="+msg+" ")
}

// TestLoop runs a scripted loop: the first round runs at start, rounds
// that did nothing log nothing, a failure streak logs once when it begins
// and once when it ends, and Wake starts a round early.
func TestLoop(t *testing.T) {
	logs := &syncBuffer{}
	script := []error{nil, nil, errors.New("down"), errors.New("down"), errors.New("down"), nil, nil}
	var mu sync.Mutex
	rounds, failures := 0, 0
	done := make(chan struct{})
	wake := make(chan struct{}, 1)
	l := Loop{
		Name: "testing", Did: "tested", DidLevel: slog.LevelInfo,
		Interval: time.Hour, // only the start, the backoffs and Wake start rounds
		Backoff:  Backoff{Base: time.Millisecond, Max: 4 * time.Millisecond},
		Wake:     wake,
		OnError:  func(error) { failures++ },
		Base:     Base{Logger: slog.New(slog.NewTextHandler(logs, nil))},
		RunOnce: func(ctx context.Context) (Counts, error) {
			mu.Lock()
			defer mu.Unlock()
			i := rounds
			rounds++
			if i == len(script)-1 {
				close(done)
			}
			if i >= len(script) {
				return nil, nil
			}
			return Counts{{"things", i % 2}}, script[i]
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); l.Run(ctx) }()
	deadline := time.After(time.Minute)
	for {
		select {
		case wake <- struct{}{}:
		default:
		}
		select {
		case <-done:
		case <-time.After(10 * time.Millisecond):
			continue
		case <-deadline:
			t.Fatal("the loop did not run its rounds")
		}
		break
	}
	cancel()
	<-stopped
	if failures != 3 {
		t.Errorf("OnError told of %d failures, want 3", failures)
	}
	if n := logs.count("testing failed; retrying with backoff"); n != 1 {
		t.Errorf("%d failure lines, want 1 for the streak", n)
	}
	if n := logs.count("testing again"); n != 1 {
		t.Errorf("%d recovery lines, want 1", n)
	}
	// Rounds 1 and 5 did one thing each (round 3 failed); 0 and 6 nothing.
	if n := logs.count("tested"); n < 2 {
		t.Errorf("%d lines for rounds that did something, want at least 2:\n%s", n, logs.b.String())
	}
	if strings.Contains(logs.b.String(), "things=0") {
		t.Errorf("a round that did nothing was logged:\n%s", logs.b.String())
	}
}

// TestLoopWaits: the jittered interval stays within Interval × (1 ± Jitter)
// and the backoff doubles from Base to Max with equal jitter.
func TestLoopWaits(t *testing.T) {
	l := Loop{Interval: time.Second, Jitter: 0.2, Backoff: Backoff{Base: 100 * time.Millisecond, Max: time.Second}}
	for _, r := range []float64{0, 0.5, 0.999999} {
		rnd := func() float64 { return r }
		if d := l.interval(rnd); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Errorf("interval at rand %v = %v", r, d)
		}
		for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 5: time.Second, 20: time.Second} {
			if d := l.backoff(n, rnd); d < want/2 || d > want {
				t.Errorf("backoff %d at rand %v = %v, want within [%v, %v]", n, r, d, want/2, want)
			}
		}
	}
}
