package reconciler

import (
	"context"
	"sync"
	"time"
)

// jobFunc reconciles one operation. asks is how many times the downstream
// has already answered "cannot tell" for it in this process; the function
// returns the new count and, when it wants to run again later (a re-ask
// after "cannot tell", or a transient error), how long to wait. again == 0
// means the operation is settled as far as this process is concerned.
type jobFunc func(ctx context.Context, key, traceparent string, asks int) (nextAsks int, again time.Duration)

// pool runs jobs keyed by operation on a fixed number of workers.
//
// Why not reconcile in the Kafka handler: an ask may take as long as the
// tool's timeout, and a re-ask waits seconds more. Done inline, that would
// hold every later message of the partition (watermill#271), so one slow
// downstream would stall the operations of every other tool behind it. The
// handler only hands the key over and acknowledges.
//
// Keyed: an operation is in the pool at most once — queued, running, or
// waiting for its re-ask — so a redelivered message, a sweep and a fresh
// outcome for the same operation never ask the downstream twice at the same
// time. A submit for an operation that is running marks it to run once more
// when it finishes: the running job may have loaded the record before the
// event that caused the submit.
//
// Bounded: at most workers jobs run at once, and at most limit operations
// are tracked; beyond that submit blocks (back-pressure on the consumer,
// only under a flood far beyond what the workers can drain).
type pool struct {
	workers int
	fn      jobFunc

	mu      sync.Mutex
	entries map[string]*entry
	ready   []string // FIFO of queued keys
	stopped bool

	wake   chan struct{} // capacity 1: "ready is not empty"
	room   chan struct{} // one token per tracked key
	done   chan struct{} // closed when the pool stops
	timers sync.WaitGroup
}

type entryState int

const (
	stateQueued entryState = iota
	stateRunning
	stateWaiting
)

type entry struct {
	state       entryState
	rerun       bool
	asks        int
	traceparent string
	timer       *time.Timer
}

// maxTracked bounds the operations one pool tracks at once.
const maxTracked = 100_000

func newPool(workers int, fn jobFunc) *pool {
	return &pool{
		workers: workers,
		fn:      fn,
		entries: map[string]*entry{},
		wake:    make(chan struct{}, 1),
		room:    make(chan struct{}, maxTracked),
		done:    make(chan struct{}),
	}
}

// submit schedules key and reports whether it was newly queued (false: it
// was folded into the entry already there). It returns at once unless the
// pool is full, and fails only when ctx ends or the pool has stopped first.
func (p *pool) submit(ctx context.Context, key, traceparent string) (bool, error) {
	if p.merge(key, traceparent) {
		return false, nil
	}
	select {
	case p.room <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-p.done:
		return false, errPoolStopped
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		<-p.room
		return false, errPoolStopped
	}
	if _, ok := p.entries[key]; ok {
		// Another submit of the same key got in between merge and here.
		p.mu.Unlock()
		<-p.room
		p.merge(key, traceparent)
		return false, nil
	}
	p.entries[key] = &entry{state: stateQueued, traceparent: traceparent}
	p.ready = append(p.ready, key)
	p.mu.Unlock()
	p.signal()
	return true, nil
}

// merge folds a submit into the entry of key, if there is one.
func (p *pool) merge(key, traceparent string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	if !ok {
		return false
	}
	if e.state == stateRunning {
		e.rerun = true
	}
	if e.traceparent == "" {
		e.traceparent = traceparent
	}
	return true
}

func (p *pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run starts the workers and blocks until ctx ends and every worker and
// timer goroutine has finished.
func (p *pool) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.worker(ctx)
		}()
	}
	wg.Wait()

	p.mu.Lock()
	p.stopped = true
	close(p.done)
	for _, e := range p.entries {
		// A timer stopped before it fired never runs its function, so its
		// share of the wait group is released here; one that fired already
		// releases it itself (and finds the pool stopped).
		if e.timer != nil && e.timer.Stop() {
			p.timers.Done()
		}
	}
	p.mu.Unlock()
	p.timers.Wait()
}

func (p *pool) worker(ctx context.Context) {
	for {
		key, e, ok := p.next(ctx)
		if !ok {
			return
		}
		for {
			asks, again := p.fn(ctx, key, e.traceparent, e.asks)
			p.mu.Lock()
			e.asks = asks
			if again > 0 && ctx.Err() == nil {
				// The re-ask supersedes a rerun: it loads the record afresh.
				e.state, e.rerun = stateWaiting, false
				p.timers.Add(1)
				e.timer = time.AfterFunc(again, func() {
					defer p.timers.Done()
					p.requeue(key)
				})
				p.mu.Unlock()
				break
			}
			if e.rerun && ctx.Err() == nil {
				e.rerun = false
				p.mu.Unlock()
				continue
			}
			delete(p.entries, key)
			p.mu.Unlock()
			<-p.room
			break
		}
	}
}

// next takes the oldest queued key, or reports false when ctx ends.
func (p *pool) next(ctx context.Context) (string, *entry, bool) {
	for {
		p.mu.Lock()
		if len(p.ready) > 0 {
			key := p.ready[0]
			p.ready[0] = ""
			p.ready = p.ready[1:]
			e := p.entries[key]
			e.state = stateRunning
			more := len(p.ready) > 0
			p.mu.Unlock()
			if more {
				p.signal() // another worker may take the next one
			}
			return key, e, true
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-ctx.Done():
			return "", nil, false
		}
	}
}

func (p *pool) requeue(key string) {
	p.mu.Lock()
	e, ok := p.entries[key]
	if p.stopped || !ok {
		p.mu.Unlock()
		return
	}
	e.state, e.timer = stateQueued, nil
	p.ready = append(p.ready, key)
	p.mu.Unlock()
	p.signal()
}

type poolError string

func (e poolError) Error() string { return string(e) }

const errPoolStopped = poolError("reconciler: stopped")
