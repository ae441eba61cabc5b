package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// hooked records what the OnCommit hooks receive.
type hooked struct {
	mu  sync.Mutex
	got []delivered
}

type delivered struct {
	key string
	env string
}

func (h *hooked) hook(key string, env []byte) {
	h.mu.Lock()
	h.got = append(h.got, delivered{key, string(env)})
	h.mu.Unlock()
}

func (h *hooked) take() []delivered {
	h.mu.Lock()
	defer h.mu.Unlock()
	got := h.got
	h.got = nil
	return got
}

// The hooks receive each committed event once, with the bytes the journal
// holds; a step that conflicted gives them nothing, and neither does a batch
// whose transaction failed (the waiters must never see an event that is
// not in the journal).
func TestOnCommitHandsOverCommittedEventsOnly(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var h hooked
	s.OnCommit(h.hook)
	a, b := create(t, s, "a"), create(t, s, "b")
	if got := h.take(); len(got) != 2 || got[0].key != "a" || got[1].key != "b" {
		t.Fatalf("after two creates the hooks got %+v", got)
	}

	// A NUL in a text value (here the outbox topic, which nothing checks
	// before the database) fails its statement, SQLSTATE 22021, and with it
	// the whole pipelined batch.
	res := s.AppendBatch(ctx, []store.Append{
		{Base: a, Events: []events.Envelope{started(t, a, "w1")}},
		{Events: []events.Envelope{intent(t, "c", `{"x":1}`)}, TopicPrefix: "bad\x00."},
	})
	if res[0].Err == nil || !errors.Is(res[1].Err, store.ErrRejectedValue) {
		t.Fatalf("the failing batch: %+v, want both steps failed", res)
	}
	if got, _ := s.Load(ctx, "a"); got.Seq != 1 {
		t.Fatalf("a moved to seq %d in a failed batch", got.Seq)
	}
	if got := h.take(); len(got) != 0 {
		t.Fatalf("the hooks got %d events of a failed batch: %+v", len(got), got)
	}

	// Through the committer, as the executor appends: the conflicting step
	// is left out, the others delivered with their journaled bytes.
	c := s.NewCommitter(store.CommitterConfig{Window: -1})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	defer func() { cancel(); <-done }()
	if _, err := c.Append(ctx, store.Append{Base: a, Events: []events.Envelope{started(t, a, "w1")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Append(ctx, store.Append{Base: a, Events: []events.Envelope{started(t, a, "w2")}}); !store.IsConflict(err) {
		t.Fatalf("second append from a's base: %v, want a conflict", err)
	}
	if _, err := s.Append(ctx, store.Append{Base: b, Events: []events.Envelope{started(t, b, "w1")}}); err != nil {
		t.Fatal(err)
	}
	got := h.take()
	if len(got) != 2 || got[0].key != "a" || got[1].key != "b" {
		t.Fatalf("the hooks got %+v, want a's and b's attempt.started", got)
	}
	for _, d := range got {
		journaled, err := s.Events(ctx, d.key, 1)
		if err != nil || len(journaled) != 1 {
			t.Fatalf("journal of %s: %v %v", d.key, journaled, err)
		}
		if string(journaled[0].Raw) != d.env {
			t.Fatalf("%s: the hook got\n%s\nthe journal holds\n%s", d.key, d.env, journaled[0].Raw)
		}
	}

	// NotifyCommitted, for appends in a caller's own transaction, hands over
	// the same bytes the journal holds.
	bOp, _ := s.Load(ctx, "b")
	ev := started(t, bOp, "w9") // not journaled: only the encoding is compared
	s.NotifyCommitted(store.Append{Base: bOp, Events: []events.Envelope{ev}})
	want, _ := events.Encode(ev)
	if got := h.take(); len(got) != 1 || got[0].env != string(want) {
		t.Fatalf("NotifyCommitted handed over %+v", got)
	}
}
