package projector

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/internal/testenv/storedb"
	"github.com/effectline/effectline/store"
)

// countingStream is the operations' stream, remembering how many rows each
// write had.
type countingStream struct {
	stream[events.Envelope, events.Operation]
	mu     sync.Mutex
	writes []int
}

func (s *countingStream) write(ctx context.Context, pool *pgxpool.Pool, ops []events.Operation) ([]string, error) {
	s.mu.Lock()
	s.writes = append(s.writes, len(ops))
	s.mu.Unlock()
	return s.stream.write(ctx, pool, ops)
}

// TestSteadyEventsShareAPacedWrite: once events arrive steadily, the first
// flusher holds its next write until a FlushWindow has passed since the
// last one began and writes what arrived meanwhile together; the first
// event after a quiet spell is written at once.
func TestSteadyEventsShareAPacedWrite(t *testing.T) {
	t.Parallel()
	url := storedb.New(t)
	pool := testenv.NewPool(t, url)
	ctx := t.Context()
	// A window far longer than a write takes on a loaded machine, so that
	// the second write is still held when the third event arrives.
	cfg := Config{FlushWindow: 2 * time.Second}.WithDefaults()
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	s := &countingStream{stream: operationStream{store: store.New(pool)}}
	b := newBatcher(cfg, stream[events.Envelope, events.Operation](s), newRecordCache(100), m.stream(StreamOperations), cfg.Logger)
	b.pool = pool
	bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan struct{})
	go func() { defer close(ran); b.run(bctx) }()
	defer func() { stop(); <-ran }()

	submit := func(key string) {
		e, err := events.New(events.IntentRecorded, key, 1, "cache.set", events.Idempotent, 0,
			events.IntentData{Args: json.RawMessage(`{"k":1}`), Principal: "agent"}, time.Now())
		if err != nil {
			t.Error(err)
			return
		}
		for _, r := range b.submit([]context.Context{ctx}, []events.Envelope{e}) {
			if r.err != nil {
				t.Errorf("%s: %v", key, r.err)
			}
		}
	}
	started := time.Now()
	submit("pace/a") // after a quiet spell: written at once
	if waited := time.Since(started); waited > time.Second {
		t.Logf("the first write took %v (a slow machine; the pacing below is what is checked)", waited)
	}
	var wg sync.WaitGroup
	wg.Go(func() { submit("pace/b") })
	time.Sleep(20 * time.Millisecond)
	wg.Go(func() { submit("pace/c") })
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Equal(s.writes, []int{1, 2}) {
		t.Fatalf("rows per write %v; want [1 2]: the first alone, the next two held together", s.writes)
	}
}
