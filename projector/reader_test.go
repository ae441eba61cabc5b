package projector_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
)

const readerOps = 120

var readerTools = []string{"payments.charge", "inventory.reserve"}

// readerSetup journals readerOps operations, a third each pending,
// completed and failed, alternating two tools, four at a time sharing one
// created_at (so paging must break ties by key), with keys in an order
// unrelated to their creation; then rebuilds the read model from them.
func readerSetup(t *testing.T) (*harness, map[string]events.Operation) {
	h := setupDB(t)
	ctx := t.Context()
	var as []store.Append
	for i := range readerOps {
		key := fmt.Sprintf("op-%03d", (i*7)%readerOps)
		f := newFlow(t, key, readerTools[i%2], events.Idempotent, epoch.Add(time.Duration(i/4)*time.Second)).intent()
		switch i % 3 {
		case 1:
			f.started(1).succeeded(1)
		case 2:
			f.started(1).add(events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final, ErrorClass: "http_400", StatusCode: 400})
		}
		as = append(as, store.Append{Events: f.evs})
	}
	ops := map[string]events.Operation{}
	for i, r := range h.store.AppendBatch(ctx, as) {
		if r.Err != nil {
			t.Fatalf("journaling operation %d: %v", i, r.Err)
		}
		ops[r.Op.Key] = r.Op
	}
	if r, err := projector.Rebuild(ctx, h.store, nil); err != nil || r.Operations != readerOps {
		t.Fatalf("Rebuild = %d, %v", r.Operations, err)
	}
	return h, ops
}

func TestReaderGet(t *testing.T) {
	t.Parallel()
	h, ops := readerSetup(t)
	r := projector.NewReader(h.pool)
	ctx := t.Context()

	for _, key := range []string{"op-000", "op-007", "op-014"} { // pending, completed, failed
		st, err := r.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get(%s): %v", key, err)
		}
		assertStateOf(t, st, ops[key])
	}

	_, err := r.Get(ctx, "no-such-operation")
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of a missing key: err = %v, want ErrNotFound", err)
	}

	// The JSON of a record carries the contract's field names (contract §3).
	st, err := r.Get(ctx, "op-007")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"operation_key", "tool", "effect_class", "payload_hash", "principal", "status",
		"attempt", "lease_until", "result", "downstream_id", "undo_ref", "created_at", "updated_at",
		"last_error_class", "seq"} {
		if _, ok := fields[f]; !ok {
			t.Errorf("record JSON lacks %q: %s", f, b)
		}
	}
}

// listAll pages through f with its limit and returns every item in order,
// failing on a page longer than the limit.
func listAll(t *testing.T, r *projector.Reader, f events.ListFilter) ([]events.Operation, int) {
	t.Helper()
	var (
		all   []events.Operation
		pages int
	)
	for {
		p, err := r.List(t.Context(), f)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		pages++
		if f.Limit > 0 && len(p.Items) > f.Limit {
			t.Fatalf("page of %d items, limit %d", len(p.Items), f.Limit)
		}
		all = append(all, p.Items...)
		if p.NextCursor == "" {
			return all, pages
		}
		if len(p.Items) == 0 {
			t.Fatal("an empty page with a next cursor")
		}
		f.Cursor = p.NextCursor
		if pages > readerOps+1 {
			t.Fatal("paging does not end")
		}
	}
}

// assertKeysetOrder checks newest first, ties by key descending, and that
// the items are exactly the operations that match.
func assertKeysetOrder(t *testing.T, what string, items []events.Operation, ops map[string]events.Operation, match func(events.Operation) bool) {
	t.Helper()
	seen := map[string]bool{}
	for i, s := range items {
		if seen[s.Key] {
			t.Errorf("%s: %s appears twice", what, s.Key)
		}
		seen[s.Key] = true
		if op, ok := ops[s.Key]; !ok || !match(op) {
			t.Errorf("%s: %s does not match the filter", what, s.Key)
		}
		if i > 0 {
			prev := items[i-1]
			if s.CreatedAt.After(prev.CreatedAt) || (s.CreatedAt.Equal(prev.CreatedAt) && s.Key >= prev.Key) {
				t.Errorf("%s: %s (%s) follows %s (%s): not newest first", what,
					s.Key, s.CreatedAt, prev.Key, prev.CreatedAt)
			}
		}
	}
	for key, op := range ops {
		if match(op) && !seen[key] {
			t.Errorf("%s: %s is missing", what, key)
		}
	}
}

func TestReaderListPagesEveryRowOnceNewestFirst(t *testing.T) {
	t.Parallel()
	h, ops := readerSetup(t)
	r := projector.NewReader(h.pool)
	all := func(events.Operation) bool { return true }

	items, pages := listAll(t, r, events.ListFilter{Limit: 50})
	if len(items) != readerOps || pages != 3 {
		t.Errorf("limit 50: %d items in %d pages, want %d in 3", len(items), pages, readerOps)
	}
	assertKeysetOrder(t, "limit 50", items, ops, all)

	// The page size default and cap.
	p, err := r.List(t.Context(), events.ListFilter{})
	if err != nil || len(p.Items) != events.DefaultListLimit || p.NextCursor == "" {
		t.Errorf("default limit: %d items, cursor %q, err %v", len(p.Items), p.NextCursor, err)
	}
	p, err = r.List(t.Context(), events.ListFilter{Limit: 10_000})
	if err != nil || len(p.Items) != readerOps || p.NextCursor != "" {
		t.Errorf("limit above the cap: %d items, cursor %q, err %v", len(p.Items), p.NextCursor, err)
	}

	// Limits that end exactly on a page boundary, and pages of one.
	for _, limit := range []int{1, 7, 40, 120} {
		items, _ := listAll(t, r, events.ListFilter{Limit: limit})
		assertKeysetOrder(t, fmt.Sprintf("limit %d", limit), items, ops, all)
	}
}

func TestReaderListFilters(t *testing.T) {
	t.Parallel()
	h, ops := readerSetup(t)
	r := projector.NewReader(h.pool)

	for _, status := range []events.Status{events.StatusPending, events.StatusCompleted, events.StatusFailed, events.StatusEscalated} {
		items, _ := listAll(t, r, events.ListFilter{Status: status, Limit: 15})
		assertKeysetOrder(t, "status "+string(status), items, ops, func(op events.Operation) bool { return op.Status == status })
	}
	for _, tool := range append(readerTools, "no.such.tool") {
		items, _ := listAll(t, r, events.ListFilter{Tool: tool, Limit: 25})
		assertKeysetOrder(t, "tool "+tool, items, ops, func(op events.Operation) bool { return op.Tool == tool })
	}
	items, _ := listAll(t, r, events.ListFilter{Status: events.StatusCompleted, Tool: readerTools[1], Limit: 6})
	if len(items) != readerOps/6 {
		t.Errorf("completed %s: %d items, want %d", readerTools[1], len(items), readerOps/6)
	}
	assertKeysetOrder(t, "status and tool", items, ops, func(op events.Operation) bool {
		return op.Status == events.StatusCompleted && op.Tool == readerTools[1]
	})

	p, err := r.List(t.Context(), events.ListFilter{Tool: "no.such.tool"})
	if err != nil || p.Items == nil || len(p.Items) != 0 || p.NextCursor != "" {
		t.Errorf("empty result: %+v, %v; want an empty, non-nil page", p, err)
	}
}

func TestReaderListRejectsInvalidFilters(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	r := projector.NewReader(h.pool)
	b64 := base64.RawURLEncoding.EncodeToString
	cases := []struct {
		name  string
		f     events.ListFilter
		field string
	}{
		{"not base64", events.ListFilter{Cursor: "%%%"}, "cursor"},
		{"not JSON", events.ListFilter{Cursor: b64([]byte("garbage"))}, "cursor"},
		{"empty object", events.ListFilter{Cursor: b64([]byte(`{}`))}, "cursor"},
		{"unknown field", events.ListFilter{Cursor: b64([]byte(`{"t":"2026-01-01T00:00:00Z","k":"a","x":1}`))}, "cursor"},
		{"wrong types", events.ListFilter{Cursor: b64([]byte(`{"t":5,"k":"a"}`))}, "cursor"},
		{"too long", events.ListFilter{Cursor: strings.Repeat("A", 1<<16)}, "cursor"},
		{"unknown status", events.ListFilter{Status: "done"}, "status"},
		{"negative limit", events.ListFilter{Limit: -1}, "limit"},
	}
	for _, c := range cases {
		_, err := r.List(t.Context(), c.f)
		var fe *events.FilterError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, events.ErrInvalidFilter) {
			t.Errorf("%s: err = %v, want a *FilterError on %s", c.name, err, c.field)
		}
	}
}
