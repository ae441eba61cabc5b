package executor

import (
	"math/rand/v2"
	"time"
)

// jitterTicker fires about every d, each interval jittered by ±20% so many
// replicas polling the same table drift apart instead of hitting it at once.
type jitterTicker struct {
	C    <-chan time.Time
	stop chan struct{}
}

func newTicker(d time.Duration) *jitterTicker {
	c := make(chan time.Time, 1)
	t := &jitterTicker{C: c, stop: make(chan struct{})}
	go func() {
		for {
			j := time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
			select {
			case <-t.stop:
				return
			case now := <-time.After(j):
				select {
				case c <- now:
				default:
				}
			}
		}
	}()
	return t
}

func (t *jitterTicker) Stop() { close(t.stop) }
