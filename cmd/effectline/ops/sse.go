package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/effectline/effectline/service"
)

// sseIdle is how long a stream may stay silent before it is taken for
// dropped and reopened: the server sends a comment every 15 s.
const sseIdle = 45 * time.Second

// sseRetries bounds how many times in a row a dropped stream is reopened
// without an event in between, with sseBackoff doubling up to sseBackoffMax
// between tries: long enough to ride out an API replica restarting.
const (
	sseRetries    = 8
	sseBackoff    = 250 * time.Millisecond
	sseBackoffMax = 5 * time.Second
)

// sseStream reads GET /v1/operations/{key}/events, the API's server-sent
// event stream: each event as soon as it is journaled, with no polling. A
// dropped connection is reopened with Last-Event-ID, so no event is missed
// or shown twice. The server ends the stream once the operation settled;
// the record is then read once for the settled state. A server without
// the stream route (404, or 406 for the media type) is polled instead.
type sseStream struct {
	c   *client
	key string

	body   io.Closer
	rd     *bufio.Reader
	cancel context.CancelFunc
	idle   *time.Timer
	// opened is set once a stream was open; drops counts reopenings
	// since the last event.
	opened bool
	drops  int
	// poll is set once the server turned out to have no stream.
	poll *pollStream
}

// errBadEvent is a stream whose event cannot be read: reopening would
// only bring it again.
var errBadEvent = errors.New("not an event envelope")

func (s *sseStream) path() string { return "/v1/operations/" + pathKey(s.key) + "/events" }

func (s *sseStream) next(ctx context.Context, after int64) ([]Event, Operation, error) {
	for {
		if s.poll != nil {
			return s.poll.next(ctx, after)
		}
		if s.rd == nil {
			err := s.open(ctx, after)
			switch {
			case IsStatus(err, http.StatusNotFound) || IsStatus(err, http.StatusNotAcceptable):
				// No stream route, or no stream of this key (then the
				// poll's read of the record answers the API's 404).
				s.poll = &pollStream{c: s.c, key: s.key}
				continue
			case err != nil:
				// A server that answered before and is away now may be
				// restarting; one never reached is reported at once.
				var unreachable *UnreachableError
				if s.opened && errors.As(err, &unreachable) && s.backoff(ctx) {
					continue
				}
				return nil, Operation{}, err
			}
		}
		ev, err := s.read()
		if err == nil {
			if ev.Seq <= after {
				continue
			}
			s.drops = 0
			return []Event{ev}, Operation{}, nil
		}
		s.close()
		switch {
		case ctx.Err() != nil:
			return nil, Operation{}, ctx.Err()
		case errors.Is(err, errBadEvent):
			return nil, Operation{}, err
		case errors.Is(err, io.EOF):
			// The server ends a stream once the operation settled, and
			// also after its time bound or when it shuts down: the record
			// says which.
			op, _, err := s.c.operation(ctx, s.key)
			if err != nil {
				return nil, Operation{}, err
			}
			if op.settled() {
				var fresh []Event
				for _, e := range op.Events {
					if e.Seq > after {
						fresh = append(fresh, e)
					}
				}
				return fresh, op, nil
			}
		}
		if !s.backoff(ctx) {
			return nil, Operation{}, fmt.Errorf("GET %s: the stream ended %d times in a row without an event: %w", s.path(), s.drops, err)
		}
	}
}

// backoff waits before the next reopening, and reports false once the
// reopenings are used up or ctx ended.
func (s *sseStream) backoff(ctx context.Context) bool {
	if s.drops >= sseRetries {
		return false
	}
	d := min(sseBackoff<<s.drops, sseBackoffMax)
	s.drops++
	return service.Sleep(ctx, d)
}

func (s *sseStream) open(ctx context.Context, after int64) error {
	sctx, cancel := context.WithCancel(ctx)
	resp, err := s.c.stream(sctx, s.path(), after)
	if err != nil {
		cancel()
		return err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		resp.Body.Close()
		cancel()
		return fmt.Errorf("GET %s: the answer is %q, not an event stream", s.path(), resp.Header.Get("Content-Type"))
	}
	s.body, s.rd, s.cancel, s.opened = resp.Body, bufio.NewReader(resp.Body), cancel, true
	// A silent connection is cut, which ends the read with an error, and
	// reopened.
	s.idle = time.AfterFunc(sseIdle, cancel)
	return nil
}

func (s *sseStream) close() {
	if s.rd == nil {
		return
	}
	s.idle.Stop()
	s.cancel()
	s.body.Close()
	s.body, s.rd, s.cancel, s.idle = nil, nil, nil, nil
}

// read returns the next event of the stream. Comments (the keepalives) are
// skipped; an event cut off by the end of the stream is not returned, and
// comes again after the reopening.
func (s *sseStream) read() (Event, error) {
	var data strings.Builder
	hasData := false
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line != "" {
				err = io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		s.idle.Reset(sseIdle)
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if !hasData {
				continue
			}
			var ev Event
			if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
				return Event{}, fmt.Errorf("GET %s: an event is %w: %v", s.path(), errBadEvent, err)
			}
			ev.raw = json.RawMessage(data.String())
			return ev, nil
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		if field == "data" {
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(value, " "))
			hasData = true
		}
	}
}
