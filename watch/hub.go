// Package watch wakes the API's waiting requests when their operations
// change: a request registers a Watch for its operation key, reads the head
// record once, and from then on learns of the operation's events from a
// feed every API process tails on its own (the outcomes topic, read from the
// end outside any consumer group), never by querying the database per
// waiter. A sweep reloads the records of every watched key with one batched
// query every few seconds, in case the feed lags or was down; closing the
// hub releases every waiter at once.
package watch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectline/effectline/events"
)

// Loader reads head records: the event store (store.Store).
type Loader interface {
	Load(ctx context.Context, key string) (events.Operation, error)
	LoadMany(ctx context.Context, keys []string) (map[string]events.Operation, error)
}

// Feed delivers the raw envelope of every journaled event, keyed by its
// operation key, for as long as ctx lasts. Delivery may lag, skip or repeat
// events: waiters fold only the next event of their record and reload on a
// gap, and the sweep covers what never arrives.
type Feed interface {
	Run(ctx context.Context, deliver func(key string, envelope []byte)) error
}

// Config configures a Hub.
type Config struct {
	// Loader reads head records. Required.
	Loader Loader
	// Feed is the event feed; nil leaves waking to the sweep alone.
	Feed Feed
	// SweepInterval is how often every watched record is reloaded (one
	// query per SweepBatch keys). Default 2s.
	SweepInterval time.Duration
	// SweepBatch caps the keys of one sweep query. Default 1000.
	SweepBatch int
	Logger     *slog.Logger
}

// maxBuffered bounds the events a watch holds for its reader; past it the
// watch drops them and asks its reader to reload instead.
const maxBuffered = 64

// Hub maps operation keys to the watches waiting on them.
type Hub struct {
	cfg Config

	// reloads and sweeps count the hub's queries, for the benchmark.
	reloads, sweeps atomic.Int64

	mu      sync.Mutex
	watches map[string]map[*Watch]struct{}
	closed  bool
	done    chan struct{}
}

// New returns a hub; Run starts its feed and sweep.
func New(cfg Config) (*Hub, error) {
	if cfg.Loader == nil {
		return nil, errors.New("watch: Config.Loader is required")
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 2 * time.Second
	}
	if cfg.SweepBatch <= 0 {
		cfg.SweepBatch = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Hub{cfg: cfg, watches: map[string]map[*Watch]struct{}{}, done: make(chan struct{})}, nil
}

// Run tails the feed and sweeps until ctx ends, then releases every watch
// (and every later one at once): a waiter answers with the record it has.
func (h *Hub) Run(ctx context.Context) error {
	defer h.release()
	if h.cfg.Feed != nil {
		go func() {
			if err := h.cfg.Feed.Run(ctx, h.Deliver); err != nil && ctx.Err() == nil {
				h.cfg.Logger.ErrorContext(ctx, "the waiters' event feed stopped; waking by sweep only", slog.Any("error", err))
			}
		}()
	}
	t := time.NewTicker(h.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			h.sweep(ctx)
		}
	}
}

func (h *Hub) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
}

// Watch registers interest in key. Register before reading the head record,
// so an event journaled between the read and the registration is not
// missed. Close the watch when done.
func (h *Hub) Watch(key string) *Watch {
	w := &Watch{hub: h, key: key, c: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return w
	}
	set := h.watches[key]
	if set == nil {
		set = map[*Watch]struct{}{}
		h.watches[key] = set
	}
	set[w] = struct{}{}
	return w
}

// Waiting returns how many watches are registered.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, set := range h.watches {
		n += len(set)
	}
	return n
}

// Queries returns how many head records the hub's waiters reloaded after a
// gap in the feed, and how many sweep queries it ran.
func (h *Hub) Queries() (reloads, sweeps int64) { return h.reloads.Load(), h.sweeps.Load() }

// Deliver hands one journaled event to the watches of key. An event of an
// unwatched key costs a map lookup and is not even decoded.
func (h *Hub) Deliver(key string, envelope []byte) {
	h.mu.Lock()
	n := len(h.watches[key])
	h.mu.Unlock()
	if n == 0 {
		return
	}
	env, err := events.Decode(envelope)
	if err != nil || env.OperationKey != key {
		return // not an event this hub can fold; the sweep covers it
	}
	h.mu.Lock()
	for w := range h.watches[key] {
		w.push(env)
	}
	h.mu.Unlock()
}

// sweep reloads every watched record, SweepBatch keys per query.
func (h *Hub) sweep(ctx context.Context) {
	h.mu.Lock()
	keys := make([]string, 0, len(h.watches))
	for k := range h.watches {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for len(keys) > 0 && ctx.Err() == nil {
		batch := keys[:min(len(keys), h.cfg.SweepBatch)]
		keys = keys[len(batch):]
		qctx, cancel := context.WithTimeout(ctx, h.cfg.SweepInterval)
		h.sweeps.Add(1)
		ops, err := h.cfg.Loader.LoadMany(qctx, batch)
		cancel()
		if err != nil {
			h.cfg.Logger.WarnContext(ctx, "sweeping the waiters' records failed", slog.Int("keys", len(batch)), slog.Any("error", err))
			return
		}
		h.mu.Lock()
		for k, op := range ops {
			for w := range h.watches[k] {
				w.pushRecord(op)
			}
		}
		h.mu.Unlock()
	}
}

// Watch is one waiter's registration.
type Watch struct {
	hub *Hub
	key string
	c   chan struct{}

	// guarded by hub.mu
	evs    []events.Envelope
	record *events.Operation
	stale  bool
}

func (w *Watch) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *Watch) push(e events.Envelope) {
	if len(w.evs) >= maxBuffered {
		w.evs, w.stale = nil, true
	} else {
		w.evs = append(w.evs, e)
	}
	w.signal()
}

func (w *Watch) pushRecord(op events.Operation) {
	if w.record == nil || op.Seq > w.record.Seq {
		w.record = &op
	}
	w.signal()
}

// Changed is signalled when the watch has news to Take.
func (w *Watch) Changed() <-chan struct{} { return w.c }

// Released is closed when the hub shuts down: answer with what you have.
func (w *Watch) Released() <-chan struct{} { return w.hub.done }

// Take returns the news since the last Take: events in feed order, the
// latest swept record (nil if none), and whether events were dropped.
func (w *Watch) Take() (evs []events.Envelope, record *events.Operation, stale bool) {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	evs, record, stale = w.evs, w.record, w.stale
	w.evs, w.record, w.stale = nil, nil, false
	return evs, record, stale
}

// Close unregisters the watch.
func (w *Watch) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if set := h.watches[w.key]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(h.watches, w.key)
		}
	}
}

// Advance brings op up to date with the watch's news: the swept record if
// it is newer, then each next event folded in. A gap, an event that does
// not fold, or dropped events reload the head record (one query, rare).
// applied are the events folded into op, in order; continuous is false when
// op moved by other means (a swept or reloaded record), so that a caller
// streaming events must read the ones it lacks from the journal.
func (w *Watch) Advance(ctx context.Context, op events.Operation) (next events.Operation, applied []events.Envelope, continuous bool, err error) {
	evs, rec, stale := w.Take()
	continuous = !stale
	if rec != nil && rec.Seq > op.Seq {
		op, continuous = *rec, false
	}
	for _, e := range evs {
		if e.Seq <= op.Seq {
			continue
		}
		folded, ferr := events.Apply(op, e)
		if e.Seq != op.Seq+1 || ferr != nil {
			stale = true
			break
		}
		op = folded
		applied = append(applied, e)
	}
	if stale {
		continuous = false
		w.hub.reloads.Add(1)
		fresh, lerr := w.hub.cfg.Loader.Load(ctx, w.key)
		if lerr != nil {
			return op, applied, false, lerr
		}
		if fresh.Seq > op.Seq {
			op = fresh
		}
	}
	return op, applied, continuous, nil
}

// Until waits until settled(op) holds, ctx ends or the hub is released, and
// returns the latest record. op is the head record read after Watch.
func (w *Watch) Until(ctx context.Context, op events.Operation, settled func(events.Operation) bool) events.Operation {
	for !settled(op) {
		select {
		case <-ctx.Done():
			return op
		case <-w.Released():
			return op
		case <-w.c:
			if next, _, _, _ := w.Advance(ctx, op); next.Seq > op.Seq {
				op = next
			}
		}
	}
	return op
}
