package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/testenv"
)

// TestBenchSmoke runs the load command briefly both ways intents come in
// and checks its machine-readable last line: every operation completed,
// no duplicate effect. The numbers themselves are measured, not asserted
// (docs/benchmarks.md).
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	last := regexp.MustCompile(`^bench: ops=(\d+) throughput=[\d.]+/s p50=[\d.]+ms p95=[\d.]+ms p99=[\d.]+ms tx_per_op=[\d.]+ duplicates=(\d+) lost=(\d+)$`)
	for _, via := range []string{"outbox", "http"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			p := start(t, "bench", map[string]string{envDatabaseURL: testenv.DatabaseURL()}, "bench", "-n", "300", "-via", via)
			m := p.waitLine(last, 3*time.Minute)
			if m[1] != "300" || m[2] != "0" || m[3] != "0" {
				t.Fatalf("bench reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
			}
			// The stages are read from the journal by the run's keys.
			if !regexp.MustCompile(`(?m)^stages: intent recorded → attempt started p50=[\d.]+ms`).MatchString(p.output()) {
				t.Errorf("no stages line:\n%s", p.output())
			}
			if err := p.wait(time.Minute); err != nil {
				t.Fatalf("bench exited with %v", err)
			}
		})
	}
}

// TestBenchSplitSmoke runs `bench -split -replicas 2` briefly: two
// processes of each component, the bench posting to both APIs and waiting. Every operation
// must complete once, the waits answer 200, and the CPU line count the
// children.
func TestBenchSplitSmoke(t *testing.T) {
	t.Parallel()
	last := regexp.MustCompile(`^bench: ops=(\d+) throughput=[\d.]+/s p50=[\d.]+ms p95=[\d.]+ms p99=[\d.]+ms tx_per_op=[\d.]+ duplicates=(\d+) lost=(\d+)$`)
	p := start(t, "bench-split", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-split", "-replicas", "2", "-via", "http", "-wait", "-n", "200", "-rate", "100", "-warmup", "20")
	m := p.waitLine(last, 3*time.Minute)
	if m[1] != "200" || m[2] != "0" || m[3] != "0" {
		t.Fatalf("bench reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
	}
	out := p.output()
	if !regexp.MustCompile(`(?m)^wait: POST with Prefer: wait=20 to its 200: .*\(200 answered 200, 0 answered 202\)$`).MatchString(out) {
		t.Errorf("not every waiting POST answered 200:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^cpu: .* ms of it in the components' processes`).MatchString(out) {
		t.Errorf("the cpu line does not count the components' processes:\n%s", out)
	}
	if err := p.wait(time.Minute); err != nil {
		t.Fatalf("bench exited with %v", err)
	}
}

// TestBenchWorkflowsSmoke runs `bench -workflows` briefly and checks its
// last line: every three-step workflow completed, no duplicate effect, and
// the hop latency and commits per step were measured.
func TestBenchWorkflowsSmoke(t *testing.T) {
	t.Parallel()
	last := regexp.MustCompile(`^bench: workflows=(\d+) throughput=[\d.]+/s hop_p50=[\d.]+ms hop_p99=[\d.]+ms commits_per_step=([\d.]+) duplicates=(\d+) lost=(\d+)$`)
	p := start(t, "bench-workflows", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-workflows", "-n", "60", "-warmup", "5")
	m := p.waitLine(last, 3*time.Minute)
	if m[1] != "60" || m[3] != "0" || m[4] != "0" {
		t.Fatalf("bench reported workflows=%s duplicates=%s lost=%s", m[1], m[3], m[4])
	}
	if m[2] == "0.00" {
		t.Fatalf("bench counted no commits per step")
	}
	if err := p.wait(time.Minute); err != nil {
		t.Fatalf("bench exited with %v", err)
	}
}

// TestBenchHistory runs a bench against a seeded history: the copies must
// pass the bench's own check that each is the fold of its events with a
// downstream id of its own (the run fails otherwise), the sizes line must
// count them, and the measured run must complete as on a fresh database.
// The database is kept, and a second run in it (-in) must run every
// operation anew under keys of its own rather than answer from the first
// run's stored results.
func TestBenchHistory(t *testing.T) {
	t.Parallel()
	kept := regexp.MustCompile(`^bench: the database (effectline_bench_[0-9a-f]+) is kept`)
	seeded := regexp.MustCompile(`^history: (\d+) settled operations copied from (\d+) the warm-up ran in `)
	sizes := regexp.MustCompile(`^history: tables operations \d+ MB \(idx \d+ MB\) events \d+ MB \(idx \d+ MB\) operation_state \d+ MB \(idx \d+ MB\); (\d+) bytes per retained operation$`)
	last := regexp.MustCompile(`^bench: ops=(\d+) throughput=[\d.]+/s p50=[\d.]+ms p95=[\d.]+ms p99=[\d.]+ms tx_per_op=[\d.]+ duplicates=(\d+) lost=(\d+)$`)
	p := start(t, "bench-history", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-n", "200", "-rate", "200", "-warmup", "30", "-history", "2000", "-keep")
	db := p.waitLine(kept, time.Minute)[1]
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
		if err != nil {
			t.Errorf("dropping the kept database: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping the kept database: %v", err)
		}
	})
	m := p.waitLine(last, 3*time.Minute)
	if m[1] != "200" || m[2] != "0" || m[3] != "0" {
		t.Fatalf("bench reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
	}
	if err := p.wait(time.Minute); err != nil {
		t.Fatalf("bench exited with %v", err)
	}
	var sawSeeded, sawSizes bool
	for _, line := range strings.Split(p.output(), "\n") {
		line = strings.TrimSpace(line)
		if s := seeded.FindStringSubmatch(line); s != nil {
			sawSeeded = true
			if s[1] != "2000" || s[2] != "30" {
				t.Errorf("seeded %s copies of %s operations, want 2000 of the warm-up's 30", s[1], s[2])
			}
		}
		if s := sizes.FindStringSubmatch(line); s != nil {
			sawSizes = true
			if b, _ := strconv.Atoi(s[1]); b < 500 {
				t.Errorf("%d bytes per retained operation: the sizes do not count the history", b)
			}
		}
	}
	if !sawSeeded || !sawSizes {
		t.Fatalf("no history lines (seeded %t, sizes %t):\n%s", sawSeeded, sawSizes, p.output())
	}

	again := start(t, "bench-in", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-n", "200", "-warmup", "10", "-in", db)
	m = again.waitLine(last, 3*time.Minute)
	if m[1] != "200" || m[2] != "0" || m[3] != "0" {
		t.Fatalf("bench -in reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
	}
	if !regexp.MustCompile(`(?m)^completed 200 of 200 in [\d.]+s; tool calls 200, effects 200$`).MatchString(again.output()) {
		t.Errorf("bench -in did not call the tool once per operation:\n%s", again.output())
	}
	if err := again.wait(time.Minute); err != nil {
		t.Fatalf("bench -in exited with %v", err)
	}

	// A soak in the same database: how a long run behaves on top of a
	// history (its keys carry a tag of their own too).
	soakLast := regexp.MustCompile(`^soak: ops=(\d+) throughput=[\d.]+/s p50=[\d.]+ms p99=[\d.]+ms duplicates=(\d+) lost=(\d+)$`)
	soak := start(t, "bench-in-soak", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-in", db, "-duration", "3s", "-window", "1s", "-rate", "40", "-warmup", "10")
	m = soak.waitLine(soakLast, 3*time.Minute)
	if n, _ := strconv.Atoi(m[1]); n == 0 || m[2] != "0" || m[3] != "0" {
		t.Fatalf("bench -in -duration reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
	}
	if err := soak.wait(time.Minute); err != nil {
		t.Fatalf("bench -in -duration exited with %v", err)
	}
}

// TestBenchSoak runs the soak mode briefly with pruning on and parses its
// window lines: one per window, each with the table sizes from the catalog
// and the memory of the process, then a summary with no duplicate and no
// lost operation. The soak counts completions on the outcomes topic, not
// in operation_state, so operations pruned during the run still count:
// with a 1s dedup_window and tombstones deleted after 1s, the last window
// must show operations pruned (fewer live rows in operation_state than
// operations completed).
func TestBenchSoak(t *testing.T) {
	t.Parallel()
	window := regexp.MustCompile(`^soak: t=(\d+)s completed=(\d+) throughput=\d+/s p50=[\d.]+ms p99=[\d.]+ms rss=(\d+)MB heap=\d+MB` +
		` operations=[\d.]+MB,idx=[\d.]+MB,live=\d+,dead=\d+ events=[\d.]+MB,idx=[\d.]+MB,live=\d+,dead=\d+` +
		` outbox=([\d.]+)MB,idx=[\d.]+MB,live=\d+,dead=\d+ operation_state=([\d.]+)MB,idx=[\d.]+MB,live=(\d+),dead=\d+` +
		` tables=[\d.]+MB total=(\d+) submitted=\d+ held=\d+ duplicates=(\d+) lost=(\d+) pending=\d+` +
		` relay_published=\d+ relay_batches=\d+ relay_errors=\d+ relay_busy=\d+% relay_kafka=\d+%` +
		` outbox_rotations=\d+ outbox_truncates=\d+ outbox_truncate_busy=\d+$`)
	last := regexp.MustCompile(`^soak: ops=(\d+) throughput=[\d.]+/s p50=[\d.]+ms p99=[\d.]+ms duplicates=(\d+) lost=(\d+)$`)
	p := start(t, "bench", map[string]string{envDatabaseURL: testenv.DatabaseURL()}, "bench",
		"-duration", "5s", "-window", "1s", "-rate", "40", "-warmup", "10", "-retention", "1s", "-tombstone-retention", "1s")
	m := p.waitLine(last, 3*time.Minute)
	if err := p.wait(time.Minute); err != nil {
		t.Fatalf("bench exited with %v", err)
	}
	ops, _ := strconv.Atoi(m[1])
	if ops == 0 || m[2] != "0" || m[3] != "0" {
		t.Fatalf("soak reported ops=%s duplicates=%s lost=%s", m[1], m[2], m[3])
	}
	var windows [][]string
	for _, line := range strings.Split(p.output(), "\n") {
		if w := window.FindStringSubmatch(strings.TrimSpace(line)); w != nil {
			windows = append(windows, w)
		} else if strings.HasPrefix(line, "soak: t=") {
			t.Errorf("a window line that does not parse: %q", line)
		}
	}
	// Five windows of 1s, and the last one after the drain.
	if len(windows) < 5 {
		t.Fatalf("%d window lines, want at least 5:\n%s", len(windows), p.output())
	}
	sum := 0
	for _, w := range windows {
		n, _ := strconv.Atoi(w[2])
		sum += n
		if w[3] == "0" {
			t.Errorf("window at t=%ss reports no RSS", w[1])
		}
		if w[8] != "0" || w[9] != "0" {
			t.Errorf("window at t=%ss: duplicates=%s lost=%s", w[1], w[8], w[9])
		}
		// The outbox is partitioned: its parent's own size is zero, and
		// only the sum over its partitions (each at least its empty
		// indexes) says what it holds.
		if w[4] == "0.0" {
			t.Errorf("window at t=%ss reports an outbox of 0.0MB: the sizes do not sum the partitions", w[1])
		}
		// A plain table has no partition tree: summing over the tree
		// alone reported it as empty.
		if strings.Contains(w[0], " operations=0.0MB") {
			t.Errorf("window at t=%ss reports no operations table: the sizes lost the plain tables", w[1])
		}
	}
	end := windows[len(windows)-1]
	if total, _ := strconv.Atoi(end[7]); sum != ops || total != ops {
		t.Errorf("the windows add up to %d completions, the last says %d in total, the summary %d", sum, total, ops)
	}
	if live, _ := strconv.Atoi(end[6]); live >= ops {
		t.Errorf("operation_state holds %d live rows after %d operations with a 1s dedup_window: nothing was pruned", live, ops)
	}
}
