package main

import (
	"regexp"
	"testing"
	"time"

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
			if err := p.wait(time.Minute); err != nil {
				t.Fatalf("bench exited with %v", err)
			}
		})
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
