package ops

import (
	"context"
	"time"

	"github.com/effectline/effectline/service"
)

// eventStream yields an operation's events in seq order. sseStream reads
// the API's SSE stream (GET /v1/operations/{key}/events); pollStream, over
// GET /v1/operations/{key}, works against every server, and is what
// sseStream falls back to on a server without the stream.
type eventStream interface {
	// next blocks until the operation has events after seq after, or has
	// settled, and returns those events (in seq order) with the record
	// they fold into.
	next(ctx context.Context, after int64) ([]Event, Operation, error)
}

// Poll pacing: fast at first, since a watch usually starts just after an
// intent and its first steps follow within milliseconds, then slower while
// nothing happens (a retry waiting out its backoff, an escalation waiting
// for a person).
const (
	pollMin = 100 * time.Millisecond
	pollMax = 2 * time.Second
)

// pollStream reads the record and its history again until something new
// shows. The history the API answers is the one that folds into the record
// it answers with, so a settled record's history is complete.
type pollStream struct {
	c     *client
	key   string
	delay time.Duration
}

func (p *pollStream) next(ctx context.Context, after int64) ([]Event, Operation, error) {
	if p.delay == 0 {
		p.delay = pollMin
	}
	for {
		op, _, err := p.c.operation(ctx, p.key)
		if err != nil {
			return nil, Operation{}, err
		}
		var fresh []Event
		for _, e := range op.Events {
			if e.Seq > after {
				fresh = append(fresh, e)
			}
		}
		if len(fresh) > 0 || op.settled() {
			p.delay = pollMin
			return fresh, op, nil
		}
		if !service.Sleep(ctx, p.delay) {
			return nil, Operation{}, ctx.Err()
		}
		p.delay = min(2*p.delay, pollMax)
	}
}

// watch prints each event of the operation as it is journaled, until the
// operation settles, and returns the settled record.
func watch(ctx context.Context, s eventStream, emit func([]Event) error) (Operation, error) {
	var after int64
	for {
		evs, op, err := s.next(ctx, after)
		if err != nil {
			return Operation{}, err
		}
		if len(evs) > 0 {
			if err := emit(evs); err != nil {
				return Operation{}, err
			}
			after = evs[len(evs)-1].Seq
		}
		if op.settled() && after >= op.Seq {
			return op, nil
		}
	}
}
