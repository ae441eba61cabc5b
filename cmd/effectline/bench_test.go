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
