package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/watch"
)

// MaxWait is the longest a request may wait for its operation to settle
// (Prefer: wait=N, ?wait=Ns): long enough for any retry budget worth
// waiting out, short enough that proxies and clients keep the connection.
const MaxWait = 60 * time.Second

// maxStream bounds one event stream; a client resumes with Last-Event-ID.
const maxStream = 10 * time.Minute

// settled reports whether op's outcome is an answer (succeeded, failed or
// unknown) rather than pending.
func settled(op events.Operation) bool { return events.OutcomeOf(op).State.Settled() }

// preferWait returns the wait=N preference of r (RFC 7240), capped at
// MaxWait, and whether one was given. Other preferences are ignored, as
// the RFC asks of preferences a server does not support.
func preferWait(r *http.Request) (time.Duration, bool) {
	for _, h := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(h, ",") {
			token, _, _ := strings.Cut(pref, ";")
			name, value, ok := strings.Cut(strings.TrimSpace(token), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(value), `"`))
			if err != nil || n < 0 {
				continue
			}
			return min(time.Duration(n)*time.Second, MaxWait), true
		}
	}
	return 0, false
}

// queryWait returns the ?wait= of r: a Go duration ("10s", "1.5s") or whole
// seconds ("10"), capped at MaxWait. ok is false for a malformed value.
func queryWait(r *http.Request) (d time.Duration, given, ok bool) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, false, true
	}
	if n, err := strconv.Atoi(v); err == nil {
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, true, false
	}
	if d < 0 {
		return 0, true, false
	}
	return min(d, MaxWait), true, true
}

// timeoutFor is the context deadline of one request: the request timeout,
// plus the wait the request asked for, or the stream bound.
func (s *Server) timeoutFor(route string, r *http.Request) time.Duration {
	switch route {
	case "/v1/operations/{key}/events":
		return maxStream
	case "/mcp":
		return s.cfg.RequestTimeout + MaxWait
	case "/v1/intents":
		if d, ok := preferWait(r); ok {
			return s.cfg.RequestTimeout + d
		}
	case "/v1/operations/{key}", "/v1/workflows/{id}":
		if d, given, ok := queryWait(r); given && ok {
			return s.cfg.RequestTimeout + d
		}
	}
	return s.cfg.RequestTimeout
}

// waiter is one request's wait for its operation. A nil *waiter waits for
// nothing, so handlers call its methods unconditionally.
type waiter struct {
	watch *watch.Watch
	d     time.Duration
}

// startWait registers a wait of d for key before the handler reads or
// writes the operation, so no event in between is missed. It returns nil
// when the server has no hub (the wait is then not applied).
func (s *Server) startWait(w http.ResponseWriter, key string, d time.Duration) *waiter {
	if s.waits == nil {
		return nil
	}
	// The server's write timeout is shorter than the longest wait.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + s.cfg.WriteTimeout))
	return &waiter{watch: s.waits.Watch(key), d: d}
}

func (wt *waiter) close() {
	if wt != nil {
		wt.watch.Close()
	}
}

// until returns op once it settled, the wait ran out, the request ended or
// the server began shutting down: always the newest record it has. It
// says in w's headers that the wait was applied.
func (wt *waiter) until(ctx context.Context, w http.ResponseWriter, op events.Operation) events.Operation {
	if wt == nil {
		return op
	}
	w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wt.d/time.Second)))
	ctx, cancel := context.WithTimeout(ctx, wt.d)
	defer cancel()
	return wt.watch.Until(ctx, op, settled)
}

// answerWaited answers an intent after its wait: 200 with the record once
// settled, else 202 with the record so far.
func (s *Server) answerWaited(ctx context.Context, w http.ResponseWriter, wt *waiter, op events.Operation, t tool.Tool) {
	op = wt.until(ctx, w, op)
	if settled(op) {
		writeJSON(w, http.StatusOK, renderOperation(op, t))
		return
	}
	w.Header().Set("Location", operationHref(op.Key))
	writeJSON(w, http.StatusAccepted, renderOperation(op, t))
}

// streamEvents answers GET /v1/operations/{key}/events: the operation's
// events as server-sent events, id = seq, from after Last-Event-ID, live as
// they are journaled, ending once the operation settled and every event of
// its settled record was sent.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.PathValue("key")
	if checkOperationKey(key) != "" {
		writeNoOperation(w)
		return
	}
	var sent int64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeFieldError(w, http.StatusBadRequest, codeInvalidRequest, "Last-Event-ID", "Last-Event-ID must be an event's seq")
			return
		}
		sent = n
	}
	var wt *watch.Watch
	if s.waits != nil {
		wt = s.waits.Watch(key)
		defer wt.Close()
	}
	// Another principal's stream is as absent as its record (and a pruned
	// operation has no events left to stream).
	op, err := s.store.Load(ctx, key)
	if !s.answerUnreadable(ctx, w, key, op, err) {
		return
	}
	t, _ := s.tools.Get(op.Tool)
	args := op.Args
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	// send writes events after sent, in order; the head record op folds
	// every one it did not hold yet.
	send := func(evs []events.Envelope) bool {
		for _, e := range evs {
			if e.Seq <= sent {
				continue
			}
			raw, err := renderEvent(e, t, args)
			if err != nil {
				return false
			}
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, raw); err != nil {
				return false
			}
			sent = e.Seq
			if e.Seq == op.Seq+1 {
				if next, err := events.Apply(op, e); err == nil {
					op = next
				}
			}
		}
		return rc.Flush() == nil
	}
	fromJournal := func() bool {
		stored, err := s.store.Events(ctx, key, sent)
		if err != nil {
			return false
		}
		evs := make([]events.Envelope, len(stored))
		for i, e := range stored {
			evs[i] = e.Envelope
		}
		return send(evs)
	}
	if !fromJournal() {
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	var poll <-chan time.Time
	var changed, released <-chan struct{}
	if wt != nil {
		changed, released = wt.Changed(), wt.Released()
	} else {
		// No hub: the journal is polled, which is what the hub exists to
		// avoid, so only a server built without one does it.
		p := time.NewTicker(time.Second)
		defer p.Stop()
		poll = p.C
	}
	for !(settled(op) && sent >= op.Seq) {
		select {
		case <-ctx.Done():
			return
		case <-released:
			return
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-poll:
			if !fromJournal() {
				return
			}
		case <-changed:
			next, applied, continuous, err := wt.Advance(ctx, op)
			if err != nil {
				return
			}
			if continuous {
				if !send(applied) {
					return
				}
				continue
			}
			if next.Seq > op.Seq {
				op = next
			}
			if !fromJournal() {
				return
			}
		}
	}
}
