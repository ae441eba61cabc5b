package main

import (
	"context"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// livenessDeadline bounds how long the intents consumer group may take to
// hand a restarted executor its partitions after two crashes. A static
// member takes its predecessor's place at once; the deadline is for a
// loaded machine. Before, the group did not recover at all: a member killed
// while it joined stayed in the group holding partitions, or every later
// join outlived the client's read timeout and was retried.
const livenessDeadline = 90 * time.Second

// TestFaultConsumerGroupAfterTwoQuickKills: the executor is SIGKILLed, its
// replacement is SIGKILLed about a second after it started, and a third
// process starts on the same database and broker. Intents produced straight
// to the intents topic (nothing journals them but the consumer group) must
// then complete: the two dead members, which never left the group, must
// not keep the third from its partitions.
//
// The three processes are one replica restarted, so they share its static
// membership id (EFFECTLINE_KAFKA_INSTANCE_ID), as a StatefulSet pod or a
// systemd unit would give them. Without one, real Kafka drops each dead
// member after a session or rebalance timeout (kafka.Config.Sarama); the
// embedded broker keeps a member whose join response it could not deliver
// for good, so that path is not tested here.
func TestFaultConsumerGroupAfterTwoQuickKills(t *testing.T) {
	t.Parallel()
	w := newFaultWorld(t, faultWorldOptions{})
	pool := testenv.NewPool(t, w.db)
	st := store.New(pool)
	ctx := faultCtx(t)
	pr, cfg := faultIntentsProducer(t, w.broker.Addrs)
	run := func(name string) *proc {
		p := start(t, name, w.with(map[string]string{envKafkaInstanceID: "executor-0"}), "run", "--components", "executor")
		p.waitLine(faultRunningLine, 60*time.Second)
		return p
	}
	produce := func(ops []faultOp) {
		for i, op := range ops {
			env, raw := faultDirectIntent(t, op, i)
			faultProduceIntent(t, pr, cfg, env, raw)
		}
	}
	completed := func(ctx context.Context, ops []faultOp) int {
		n := 0
		waitForSoft(ctx, func() bool {
			n = faultCompletedCount(ctx, st, ops)
			return n == len(ops)
		})
		return n
	}

	// A stable group first: the first process holds every partition and
	// heartbeats.
	first := run("executor-1")
	warm := faultOps("liveness/warm", 3)
	produce(warm)
	wctx, cancel := context.WithTimeout(ctx, livenessDeadline)
	defer cancel()
	if n := completed(wctx, warm); n != len(warm) {
		t.Fatalf("before any crash, %d of %d direct intents completed", n, len(warm))
	}

	first.kill()
	second := run("executor-2")
	time.Sleep(time.Second) // the crash pattern under test: the replacement dies while it joins
	second.kill()
	third := run("executor-3")
	restarted := time.Now()

	after := faultOps("liveness/after", 6)
	produce(after)
	actx, cancel := context.WithTimeout(ctx, livenessDeadline)
	defer cancel()
	n := completed(actx, after)
	took := time.Since(restarted)
	if n != len(after) {
		t.Fatalf("%d of %d direct intents completed within %s of the third start; the consumer group did not recover\n%s",
			n, len(after), livenessDeadline, faultLogSummary(third))
	}
	t.Logf("every direct intent completed %s after the third start", took.Round(100*time.Millisecond))
	if err := third.stop(15 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}
