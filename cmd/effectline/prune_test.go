package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
)

// TestPruneCommand runs `effectline prune` against the real binary: the
// pipeline settles operations of two tools, one with a dedup_window of a
// millisecond in the tools file and one under the default (720h); the
// command prunes exactly the first tool's operations to tombstones, a late
// duplicate through the outbox is a no-op that reports the tombstone, and a
// second run with a tombstone retention expires them.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	yml := strings.ReplaceAll(e2eTools, "URL", w.fake.URL)
	yml = strings.Replace(yml, "  - name: cache.set\n    effect: idempotent\n", "  - name: cache.set\n    effect: idempotent\n    dedup_window: 1ms\n", 1)
	if err := os.WriteFile(tools, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := w.with(map[string]string{envTools: tools})
	pipeline := start(t, "pipeline", env, "run", "--components", "relay,executor,projector")
	pipeline.waitLine(regexp.MustCompile(`effectline running`), 60*time.Second)

	pool := testenv.NewPool(t, w.db)
	ctx := untilCtx(t, 3*time.Minute)
	intent := func(i int, toolName string, class events.EffectClass, args string) outbox.Intent {
		return outbox.Intent{OperationKey: fmt.Sprintf("prune/%s/%d", toolName, i), Tool: toolName, EffectClass: class,
			Args: json.RawMessage(args), Principal: "agent"}
	}
	var ins []outbox.Intent
	for i := range 4 {
		ins = append(ins, intent(i, "cache.set", events.Idempotent, `{"k":"v"}`),
			intent(i, "payments.charge", events.Irreversible, `{"amount":1}`))
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.AppendMany(ctx, tx, ins)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	query := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Settled, published and projected.
	for query(`SELECT count(*) FROM operation_state WHERE status = 'completed'`) < len(ins) ||
		query(`SELECT count(*) FROM outbox`) > 0 {
		if ctx.Err() != nil {
			t.Fatalf("the pipeline did not settle the operations: %v", ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := pipeline.stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	prune := func(extra map[string]string) string {
		t.Helper()
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range extra {
			e[k] = v
		}
		p := start(t, "prune", e, "prune")
		if err := p.wait(60 * time.Second); err != nil {
			t.Fatalf("effectline prune: %v\n%s", err, p.output())
		}
		return p.output()
	}
	if out := prune(nil); !strings.Contains(out, "pruned 4 operations to tombstones, expired 0 tombstones") {
		t.Fatalf("effectline prune said:\n%s", out)
	}
	if n := query(`SELECT count(*) FROM operations WHERE pruned_at IS NOT NULL AND tool = 'cache.set'`); n != 4 {
		t.Fatalf("%d tombstones of cache.set, want 4", n)
	}
	if n := query(`SELECT count(*) FROM events WHERE operation_key LIKE 'prune/cache.set/%'`) +
		query(`SELECT count(*) FROM operation_state WHERE tool = 'cache.set'`); n != 0 {
		t.Fatalf("%d events and read-model rows of pruned operations left", n)
	}
	if n := query(`SELECT count(*) FROM operation_state WHERE tool = 'payments.charge'`); n != 4 {
		t.Fatalf("%d read-model rows of payments.charge, want 4: its window is the default", n)
	}

	// A late retry of the agent's step: a no-op reporting the tombstone.
	var got []outbox.Appended
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		got, err = outbox.AppendMany(ctx, tx, ins[:1])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got[0].Created || !got[0].Pruned || got[0].Operation.Status != events.StatusCompleted {
		t.Fatalf("a duplicate of a pruned operation: %+v", got[0])
	}
	other := ins[0]
	other.Args = json.RawMessage(`{"k":"other"}`)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Append(ctx, tx, other)
		return err
	})
	if !outbox.IsPayloadConflict(err) {
		t.Fatalf("other args under a pruned key: %v, want a payload conflict", err)
	}
	if n := query(`SELECT count(*) FROM events WHERE operation_key LIKE 'prune/cache.set/%'`); n != 0 {
		t.Fatalf("the duplicates journaled %d events", n)
	}

	if out := prune(map[string]string{envTombstoneRetention: "1ms"}); !strings.Contains(out, "pruned 0 operations to tombstones, expired 4 tombstones") {
		t.Fatalf("effectline prune with a tombstone retention said:\n%s", out)
	}
	bad := start(t, "prune", w.with(map[string]string{envRetention: "a month"}), "prune")
	if err := bad.wait(30 * time.Second); err == nil || !strings.Contains(bad.output(), envRetention) {
		t.Fatalf("a bad %s: %v\n%s", envRetention, err, bad.output())
	}
}
