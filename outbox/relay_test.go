package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/service"
	"github.com/effectline/effectline/store"
)

// TestRelayRepublishesWhenTheMarkIsLost: the relay dies between Kafka's
// acknowledgement and the delete of the rows. Two ways: the publisher
// returns an error after publishing (as if the process crashed there), and
// the relay's database connection is killed after publishing. Either way
// the rows are published again, and a consumer deduplicating by
// (key, seq) applies every event exactly once, in order.
func TestRelayRepublishesWhenTheMarkIsLost(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"error after send", "connection killed after send"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			keys := opKeys("lost-mark", 40)
			appendWorkload(t, h.store, keys, 40)

			relayPool := h.poolNamed(t, "lost-mark-relay")
			pub := &countingPublisher{next: h.producer(t)}
			pub.after = func(n int, err error) error {
				if err != nil || n > 3 {
					return err
				}
				// The first three batches reach Kafka but are never marked.
				if mode == "error after send" {
					return errors.New("simulated crash after publishing")
				}
				if _, err := h.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name = 'lost-mark-relay' AND pid <> pg_backend_pid()`); err != nil {
					t.Errorf("terminating the relay's backend: %v", err)
				}
				return nil
			}
			relay := outbox.NewRelay(store.New(relayPool), pub, outbox.RelayConfig{BatchSize: 100, Base: service.Base{Logger: newTestLogger(t).logs}})
			runRelay(t, relay)

			want := len(keys) * eventsPerOp
			recs := consume(t, h.broker.Addrs, "effectline.outcomes", 30*time.Second, func(rs []*kgo.Record) bool {
				return distinct(t, rs) == want
			})
			dups := checkStreams(t, recs, wantAll(keys, eventsPerOp))
			if dups == 0 {
				t.Fatalf("no duplicates among %d records: the lost marks were not republished", len(recs))
			}
			eventual(t, 10*time.Second, "the outbox to drain", func() bool {
				n, _, err := h.store.OutboxBacklog(context.Background())
				return err == nil && n == 0
			})
			// Either way the batch fails after it reached Kafka: at least one
			// failed batch.
			if st := relay.Stats(); st.Errors < 1 {
				t.Errorf("relay stats %+v; want failed batches", st)
			}
			t.Logf("%d records, %d duplicates dropped, %d sends", len(recs), dups, pub.count())
		})
	}
}

// TestRelayBrokerOutage: the broker goes away for 10s and comes back on the
// same port with its data. Everything appended before and during the outage
// is delivered, in order per key; the relay retries with backoff (a bounded
// number of Sends, no busy loop), logs the streak once, and resumes.
func TestRelayBrokerOutage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := setup(t, testenv.WithKfakeOptions(kfake.DataDir(dir)))
	var port int
	if _, err := fmt.Sscanf(h.broker.Addrs[0], "127.0.0.1:%d", &port); err != nil {
		t.Fatalf("broker address %q: %v", h.broker.Addrs[0], err)
	}

	logs := newTestLogger(t)
	pub := &countingPublisher{next: h.producer(t)}
	relay := outbox.NewRelay(h.store, pub, outbox.RelayConfig{BatchSize: 100, MaxBackoff: 2 * time.Second, Base: service.Base{Logger: logs.logs}})
	runRelay(t, relay)

	before := opKeys("before", 50)
	appendWorkload(t, h.store, before, 25)
	recs := consume(t, h.broker.Addrs, "effectline.outcomes", 30*time.Second, func(rs []*kgo.Record) bool {
		return distinct(t, rs) == len(before)*eventsPerOp
	})
	checkStreams(t, recs, wantAll(before, eventsPerOp))

	h.broker.Cluster.Close()
	down := time.Now()
	sendsAtOutage := pub.count()
	during := opKeys("during", 50)
	appendWorkload(t, h.store, during, 25)
	time.Sleep(10*time.Second - time.Since(down)) // the outage is the scenario
	sendsDuringOutage := pub.count() - sendsAtOutage

	testenv.NewBroker(t, testenv.WithKfakeOptions(kfake.DataDir(dir), kfake.Ports(port)))
	all := append(append([]string{}, before...), during...)
	recs = consume(t, h.broker.Addrs, "effectline.outcomes", 60*time.Second, func(rs []*kgo.Record) bool {
		return distinct(t, rs) == len(all)*eventsPerOp
	})
	dups := checkStreams(t, recs, wantAll(all, eventsPerOp))
	intents := consume(t, h.broker.Addrs, "effectline.intents", 30*time.Second, func(rs []*kgo.Record) bool {
		return distinct(t, rs) == len(all)
	})
	checkStreams(t, intents, wantAll(all, 1))

	// A failing Send is slow on its own here (sarama retries inside it and
	// then its circuit breaker holds for 10s), so the relay's backoff is
	// proven by TestRelayBacksOff; this bounds the total anyway: a busy
	// loop would make hundreds.
	if sendsDuringOutage > 12 {
		t.Errorf("%d Sends during the 10s outage; want a handful", sendsDuringOutage)
	}
	eventual(t, 10*time.Second, "the relay to log its recovery", func() bool {
		return logs.count("outbox relay: publishing again") == 1
	})
	if n := logs.count("outbox relay: publishing failed; retrying with backoff"); n != 1 {
		t.Errorf("the outage was logged %d times; want once per streak", n)
	}
	t.Logf("%d Sends during the outage, %d records after it, %d duplicates dropped, stats %+v",
		sendsDuringOutage, len(recs), dups, relay.Stats())
}

// TestRelaysConcurrently: two relays (two pools, two producers: two
// processes) drain 10,000 events of 2,000 operations while four appenders
// write them, on topics of 3 partitions. Per key, the seqs read back are,
// after dropping those already seen, exactly 1..5 in order.
func TestRelaysConcurrently(t *testing.T) {
	t.Parallel()
	h := setup(t)
	keys := opKeys("conc", 2000)

	relays, recs, dups := relayTwoWhileAppending(t, h, "relay", keys, 50,
		outbox.RelayConfig{BatchSize: 200, Base: service.Base{Logger: newTestLogger(t).logs}})

	var stats []outbox.RelayStats
	total, skipped := int64(0), int64(0)
	for _, r := range relays {
		s := r.Stats()
		stats = append(stats, s)
		total += s.Published
		skipped += s.Skipped
		if s.Published == 0 {
			t.Errorf("a relay published nothing (%+v): the test did not exercise two relays", s)
		}
	}
	// The race the order guard closes (another relay holds a lower seq of
	// the same operation) must have happened, or the test proved little.
	if skipped == 0 {
		t.Errorf("the order guard never held a row back (%+v): the relays never contended", stats)
	}
	if want := len(keys) * eventsPerOp; total != int64(want+len(keys)) {
		t.Errorf("relays published %d rows together; want %d, each once (no failures happened)", total, want+len(keys))
	}
	t.Logf("%d outcome records, %d duplicates; relay stats %+v", len(recs), dups, stats)
}

// TestRelayPostgresConnectionCut: the relay's backends (its pool's and its
// LISTEN connection) are terminated repeatedly while events are written;
// the relay reconnects and nothing is lost or reordered.
func TestRelayPostgresConnectionCut(t *testing.T) {
	t.Parallel()
	h := setup(t)
	relayPool := h.poolNamed(t, "cut-relay")
	logs := newTestLogger(t)
	relay := outbox.NewRelay(store.New(relayPool), h.producer(t), outbox.RelayConfig{
		BatchSize: 50, Listen: true, MaxBackoff: 500 * time.Millisecond, Base: service.Base{Logger: logs.logs}})
	runRelay(t, relay)

	keys := opKeys("cut", 300)
	done := make(chan struct{})
	go func() {
		defer close(done)
		appendWorkload(t, h.store, keys, 10)
	}()
	killed := 0
	for i := 0; i < 5; i++ {
		var n int
		if err := h.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'cut-relay' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
		time.Sleep(150 * time.Millisecond) // spacing the cuts is the scenario
	}
	<-done
	if killed == 0 {
		t.Fatal("no relay backend was terminated: the test did not cut anything")
	}

	recs := consume(t, h.broker.Addrs, "effectline.outcomes", 60*time.Second, func(rs []*kgo.Record) bool {
		return distinct(t, rs) == len(keys)*eventsPerOp
	})
	dups := checkStreams(t, recs, wantAll(keys, eventsPerOp))
	eventual(t, 10*time.Second, "the outbox to drain", func() bool {
		n, _, err := h.store.OutboxBacklog(context.Background())
		return err == nil && n == 0
	})
	// The LISTEN connection came back too.
	eventual(t, 10*time.Second, "the relay to LISTEN again", func() bool {
		var n int
		err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'cut-relay' AND query LIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n == 1
	})
	t.Logf("%d backends terminated, %d records, %d duplicates, stats %+v", killed, len(recs), dups, relay.Stats())
}

// TestRelayWakeUps: with polling effectively off, the relay still publishes
// at once what its own store commits (OnAppend) and what another process
// commits with Notify (LISTEN).
func TestRelayWakeUps(t *testing.T) {
	t.Parallel()
	h := setup(t)
	relay := outbox.NewRelay(h.store, h.producer(t), outbox.RelayConfig{PollInterval: time.Hour, Listen: true, Base: service.Base{Logger: newTestLogger(t).logs}})
	runRelay(t, relay)
	ctx := context.Background()

	// Wait for the first (start-up) run and the LISTEN to be in place.
	eventual(t, 10*time.Second, "the relay to LISTEN", func() bool {
		var n int
		err := h.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n == 1
	})

	// Another process: its own pool, a transaction that calls Notify.
	other := store.New(h.poolNamed(t, "agent-service"))
	err := pgx.BeginFunc(ctx, other.Pool(), func(tx pgx.Tx) error {
		if _, err := outbox.Append(ctx, tx, testIntent("wf:notified/step")); err != nil {
			return err
		}
		return outbox.Notify(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	recs := consume(t, h.broker.Addrs, "effectline.intents", 5*time.Second, func(rs []*kgo.Record) bool { return len(rs) == 1 })
	if len(recs) != 1 {
		t.Fatalf("a notified intent was not published within 5s (poll interval 1h)")
	}

	// This process: an append through the relay's own store.
	op, err := h.store.Append(ctx, store.Append{Events: appendIntentEvents(t, "wf:in-process/step"), TopicPrefix: "effectline."})
	if err != nil {
		t.Fatal(err)
	}
	recs = consume(t, h.broker.Addrs, "effectline.intents", 5*time.Second, func(rs []*kgo.Record) bool { return len(rs) == 2 })
	if len(recs) != 2 {
		t.Fatalf("an in-process append of %s was not published within 5s (poll interval 1h)", op.Key)
	}

	// A process without a relay (`run --components executor`): its store's
	// commits wake the relay through its Notifier, with no Notify in the
	// transaction.
	writer := store.New(h.poolNamed(t, "executor-process"))
	n := outbox.NewNotifier(writer.Pool(), service.Base{Logger: newTestLogger(t).logs})
	writer.OnAppend(n.Signal)
	nctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(nctx) }()
	defer func() { stop(); <-done }()
	if _, err := writer.Append(ctx, store.Append{Events: appendIntentEvents(t, "wf:other-process/step"), TopicPrefix: "effectline."}); err != nil {
		t.Fatal(err)
	}
	recs = consume(t, h.broker.Addrs, "effectline.intents", 5*time.Second, func(rs []*kgo.Record) bool { return len(rs) == 3 })
	if len(recs) != 3 {
		t.Fatalf("an append in another process with a Notifier was not published within 5s (poll interval 1h)")
	}
}

// failingPublisher fails at once until healed, recording what it was sent
// afterwards.
type failingPublisher struct {
	mu      sync.Mutex
	healed  bool
	calls   int
	records int
}

func (p *failingPublisher) Send(_ context.Context, recs []kafka.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if !p.healed {
		return errors.New("broker unreachable")
	}
	p.records += len(recs)
	return nil
}

func (p *failingPublisher) state() (calls, records int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, p.records
}

// TestRelayBacksOff: against a publisher that fails instantly, the relay
// waits with exponential backoff between attempts (no busy loop, even
// though every commit wakes it), logs the streak once, and after the
// publisher heals delivers everything and logs the recovery once.
func TestRelayBacksOff(t *testing.T) {
	t.Parallel()
	h := setup(t)
	logs := newTestLogger(t)
	pub := &failingPublisher{}
	relay := outbox.NewRelay(h.store, pub, outbox.RelayConfig{MaxBackoff: time.Second, Base: service.Base{Logger: logs.logs}})
	runRelay(t, relay)

	start := time.Now()
	keys := opKeys("backoff", 20)
	for _, k := range keys {
		// Each append through the relay's store wakes it; the backoff wait
		// must ignore those wake-ups.
		if _, err := h.store.Append(context.Background(), store.Append{Events: appendIntentEvents(t, k), TopicPrefix: "effectline."}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3*time.Second - time.Since(start)) // the failure period is the scenario
	calls, _ := pub.state()
	// Waits of at least 50, 100, 200, 400, 500, 500… ms (equal jitter on
	// 100ms doubling to 1s) allow at most 9 attempts in 3s.
	if calls < 3 || calls > 9 {
		t.Errorf("%d Send attempts in 3s of failures; want 3..9 (exponential backoff)", calls)
	}
	if n := logs.count("outbox relay: publishing failed; retrying with backoff"); n != 1 {
		t.Errorf("the failure streak was logged %d times; want once", n)
	}

	pub.mu.Lock()
	pub.healed = true
	pub.mu.Unlock()
	eventual(t, 5*time.Second, "the backlog to be published", func() bool {
		_, records := pub.state()
		return records == 2*len(keys)
	})
	eventual(t, 5*time.Second, "the recovery to be logged", func() bool {
		return logs.count("outbox relay: publishing again") == 1
	})
	if st := relay.Stats(); st.Published != int64(2*len(keys)) || st.Errors < int64(calls) {
		t.Errorf("stats %+v after %d failed calls", st, calls)
	}
}

// TestRelaysRotateTheOutbox runs two relays that rotate the outbox's
// partitions every 50ms while four writers append: every event reaches
// Kafka in order per key, the partitions were rotated and truncated while
// rows were in flight, and once drained the outbox is back to empty tables'
// size.
func TestRelaysRotateTheOutbox(t *testing.T) {
	t.Parallel()
	h := setup(t)
	keys := opKeys("rot", 800)

	relays, recs, dups := relayTwoWhileAppending(t, h, "rot-relay", keys, 20,
		outbox.RelayConfig{BatchSize: 100, RotateEvery: 50 * time.Millisecond, Base: service.Base{Logger: newTestLogger(t).logs}})

	// The relays go on rotating once idle: every partition but the current
	// one is truncated soon after the drain.
	var size int64
	eventual(t, 10*time.Second, "the drained outbox to be truncated", func() bool {
		err := h.pool.QueryRow(context.Background(), `SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox')`).Scan(&size)
		return err == nil && size <= 3*24576+2*(64<<10)
	})
	var rotations, truncates int64
	for _, r := range relays {
		s := r.Stats()
		rotations += s.Rotations
		truncates += s.Truncates
	}
	if rotations < 3 || truncates < 3 {
		t.Errorf("%d rotations and %d truncates: the partitions did not rotate under the load", rotations, truncates)
	}
	t.Logf("%d outcome records, %d duplicates, %d rotations, %d truncates, outbox %d bytes after the drain", len(recs), dups, rotations, truncates, size)
}

// relayTwoWhileAppending runs two relays with cfg (two pools, two
// producers: two processes) while four appenders write eventsPerOp events
// for each of keys, perTx operations a transaction, then reads both topics
// back and checks every key's stream is complete and in order. It returns
// the relays, the outcome records read and the duplicates among them.
func relayTwoWhileAppending(t *testing.T, h *harness, name string, keys []string, perTx int, cfg outbox.RelayConfig) ([]*outbox.Relay, []*kgo.Record, int) {
	t.Helper()
	var relays []*outbox.Relay
	for i := range 2 {
		pool := h.poolNamed(t, fmt.Sprintf("%s-%d", name, i))
		r := outbox.NewRelay(store.New(pool), h.producer(t), cfg)
		relays = append(relays, r)
		runRelay(t, r)
	}
	var wg sync.WaitGroup
	const appenders = 4
	for i := range appenders {
		wg.Go(func() {
			var mine []string
			for j := i; j < len(keys); j += appenders {
				mine = append(mine, keys[j])
			}
			appendWorkload(t, h.store, mine, perTx)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	want := len(keys) * eventsPerOp
	recs := consume(t, h.broker.Addrs, "effectline.outcomes", 120*time.Second, func(rs []*kgo.Record) bool {
		return len(rs) >= want && distinct(t, rs) == want
	})
	dups := checkStreams(t, recs, wantAll(keys, eventsPerOp))
	intents := consume(t, h.broker.Addrs, "effectline.intents", 30*time.Second, func(rs []*kgo.Record) bool {
		return len(rs) >= len(keys) && distinct(t, rs) == len(keys)
	})
	checkStreams(t, intents, wantAll(keys, 1))
	return relays, recs, dups
}

// TestRelayPacesItsCyclesWhileEventsArriveSteadily: with a Window, a relay
// woken by every one of 40 appends 5 ms apart runs a cycle per window, not
// one per wake-up, and every event still goes out. The bound only counts
// cycles, so a slow machine (which runs fewer) cannot fail it; without
// the window the relay runs a cycle for nearly every append.
func TestRelayPacesItsCyclesWhileEventsArriveSteadily(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const window = 100 * time.Millisecond
	relay := outbox.NewRelay(h.store, h.producer(t), outbox.RelayConfig{PollInterval: time.Hour, Window: window,
		Base: service.Base{Logger: newTestLogger(t).logs}})
	runRelay(t, relay)
	eventual(t, 10*time.Second, "the relay's first cycle", func() bool { return relay.Stats().Cycles >= 1 })

	ctx := t.Context()
	keys := opKeys("paced", 40)
	start := time.Now()
	for _, k := range keys {
		if _, err := h.store.Append(ctx, store.Append{Events: appendIntentEvents(t, k), TopicPrefix: "effectline."}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	steady := time.Since(start)
	recs := consume(t, h.broker.Addrs, "effectline.intents", 10*time.Second, func(rs []*kgo.Record) bool { return distinct(t, rs) == len(keys) })
	checkStreams(t, recs, wantAll(keys, 1))
	// The start-up cycle, the first append's (nothing was arriving before
	// it), one per window while the appends went on, a last one for what
	// committed in the final window, and one to spare.
	cycles := relay.Stats().Cycles
	if most := 4 + int64(steady/window); cycles > most {
		t.Errorf("%d cycles for 40 appends over %v with a %v window; want at most %d", cycles, steady.Round(time.Millisecond), window, most)
	}
	t.Logf("%d cycles for 40 appends over %v", cycles, steady.Round(time.Millisecond))
}
