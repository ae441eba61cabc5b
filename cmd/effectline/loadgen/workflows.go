package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

// benchSteps are the steps of the benchmark's workflow, in order.
var benchSteps = []string{"reserve", "charge", "send"}

// workflowsYAML declares three irreversible tools on the local downstream
// and a workflow running them one after another. Irreversible steps make
// the first step the pivot, so nothing unwinds: what is measured is the
// forward path, step completed → next intent → next attempt.
func (t *benchTool) workflowsYAML() string {
	y := "tools:\n"
	for _, s := range benchSteps {
		y += `  - name: bench.` + s + `
    effect: irreversible
    invoke: {method: POST, url: "` + t.url + `/` + s + `", timeout: 5s}
    reconcile: {method: GET, url: "` + t.url + `/` + s + `?idempotency_key={{.Key}}", timeout: 5s}
    retry: {max_attempts: 4, base_delay: 50ms, max_delay: 2s, deadline: 60s}
`
	}
	y += "workflows:\n  - name: bench\n    steps:\n"
	for _, s := range benchSteps {
		y += `      - name: ` + s + `
        tool: bench.` + s + `
        args: {amount: "{{.Input.amount}}", currency: EUR}
`
	}
	return y
}

func benchWorkflowID(i int) string  { return fmt.Sprintf("wfbench-%07d", i) }
func warmupWorkflowID(i int) string { return fmt.Sprintf("wfwarmup-%07d", i) }

// RunWorkflows is `effectline bench -workflows`: it starts bc.N three-step
// workflows through the workflow service, in one process with the relay,
// executor, projector, reconciler and workflow driver, and reports
// workflows per second, start-to-completed latency, the hop latency between
// steps (step n's completion event → step n+1's first attempt.started, from
// the journal's occurred_at) and synchronous commits per step.
func RunWorkflows(ctx context.Context, bc Config, cfg app.Config, getenv func(string) string, stdout, stderr io.Writer) error {
	if bc.N <= 0 || bc.Concurrency <= 0 || bc.Rate < 0 || bc.Warmup < 0 || bc.In != "" || bc.History > 0 {
		return ErrConfig
	}
	if bc.Via != "outbox" || bc.Wait {
		return fmt.Errorf("%w (with -workflows the runs start through the workflow service: no -via http or -wait)", ErrConfig)
	}
	cfg, sink, cleanup, err := bc.prepare(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	doc := []byte(sink.workflowsYAML())
	reg, err := httptool.Parse(doc, getenv)
	if err != nil {
		return err
	}
	defs, err := workflow.Parse(doc, reg)
	if err != nil {
		return err
	}
	if len(cfg.KafkaBrokers) == 0 {
		cluster, err := app.StartEmbeddedBroker(cfg.Partitions, 2*soakLostAfter)
		if err != nil {
			return err
		}
		defer cluster.Close()
		cfg.KafkaBrokers = cluster.ListenAddrs()
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	a, err := app.Open(ctx, app.Options{Config: cfg, Stdout: stderr, Getenv: getenv,
		Components: []string{app.Relay, app.Executor, app.Projector, app.Reconciler, app.Workflow},
		Migrate:    true, Tools: reg, Workflows: defs, Service: "effectline-bench", Open: true})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { stop(); <-done }()

	if bc.Warmup > 0 {
		wc := bc
		wc.N = bc.Warmup
		if err := wc.runWorkflows(ctx, runCtx, a, warmupWorkflowID, "wfwarmup-", make([]time.Time, wc.N), io.Discard); err != nil {
			return fmt.Errorf("bench: warming up: %w", err)
		}
	}
	warmupCalls := sink.calls.Load()
	var beforeAll int64
	_ = a.Pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&beforeAll)
	beforeJournal := a.Store.SyncCommits()

	mode := "flat out"
	if bc.Rate > 0 {
		mode = fmt.Sprintf("%d workflows/s", bc.Rate)
	}
	fmt.Fprintf(stdout, "bench: %d workflows of %d steps, %s, started one per transaction through the workflow service, tool %s\n",
		bc.N, len(benchSteps), mode, sink.url)
	if bc.Warmup > 0 {
		fmt.Fprintf(stdout, "warm-up: %d workflows run first, not measured\n", bc.Warmup)
	}
	started := make([]time.Time, bc.N)
	start := time.Now()
	cpuBefore := sampleCPU()
	if err := bc.runWorkflows(ctx, runCtx, a, benchWorkflowID, "wfbench-", started, stderr); err != nil {
		return err
	}
	steps := bc.N * len(benchSteps)
	cpu := sampleCPU().perOp(cpuBefore, steps)
	var afterAll int64
	_ = a.Pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&afterAll)
	journalCommits := a.Store.SyncCommits() - beforeJournal

	// End to end: the start's commit to the run's completed head.
	journal := workflow.NewJournal(a.Pool)
	finished, err := journal.HeadTimes(ctx, "wfbench-", events.WorkflowCompleted)
	if err != nil {
		return err
	}
	var e2e []time.Duration
	var last time.Time
	for i := range bc.N {
		at, ok := finished[benchWorkflowID(i)]
		if !ok || started[i].IsZero() {
			continue
		}
		e2e = append(e2e, at.Sub(started[i]))
		if at.After(last) {
			last = at
		}
	}
	completed := len(e2e)

	// Hops, from the operations' journal: when step n's operation completed
	// and when step n+1's first attempt started.
	stepKeys := make([]string, 0, bc.N*len(benchSteps))
	for i := range bc.N {
		for _, step := range benchSteps {
			stepKeys = append(stepKeys, workflow.StepKey(benchWorkflowID(i), step, 0))
		}
	}
	first, err := a.Store.FirstEventTimes(ctx, stepKeys, events.AttemptStarted, events.AttemptSucceeded, events.ReconciliationResolved)
	if err != nil {
		return err
	}
	startedAt, completedAt := first[events.AttemptStarted], first[events.AttemptSucceeded]
	for key, at := range first[events.ReconciliationResolved] {
		if prev, ok := completedAt[key]; !ok || at.Before(prev) {
			completedAt[key] = at
		}
	}
	var hops []time.Duration
	for i := range bc.N {
		id := benchWorkflowID(i)
		for s := 0; s+1 < len(benchSteps); s++ {
			c, ok1 := completedAt[workflow.StepKey(id, benchSteps[s], 0)]
			n, ok2 := startedAt[workflow.StepKey(id, benchSteps[s+1], 0)]
			if ok1 && ok2 {
				hops = append(hops, n.Sub(c))
			}
		}
	}

	// The starts commit one transaction each; the driver commits one per
	// round, for all the transitions of the round (whose events share its
	// occurred_at).
	transitions, rounds, err := journal.CountTransitions(ctx, "wfbench-")
	if err != nil {
		return err
	}
	starts := int64(completed)
	syncCommits := journalCommits + rounds + starts

	span := time.Since(start)
	if !last.IsZero() {
		span = last.Sub(start)
	}
	throughput := float64(completed) / span.Seconds()
	dups := sink.duplicates()
	lost := bc.N - completed
	slices.Sort(e2e)
	slices.Sort(hops)
	fmt.Fprintf(stdout, "completed %d of %d workflows in %.2fs; tool calls %d, effects %d (%d steps)\n", completed, bc.N, span.Seconds(),
		sink.calls.Load()-warmupCalls, sink.effects()-int(warmupCalls), steps)
	fmt.Fprintf(stdout, "workflow: start to completed p50=%.1fms p99=%.1fms\n", ms(pctOf(e2e, 0.50)), ms(pctOf(e2e, 0.99)))
	fmt.Fprintf(stdout, "hop: step completed to the next step's attempt started p50=%.1fms p99=%.1fms (%d hops)\n",
		ms(pctOf(hops, 0.50)), ms(pctOf(hops, 0.99)), len(hops))
	fmt.Fprintf(stdout, "postgres: %.2f synchronous commits per step (%d: %d the journal's claims and outcomes, %d driver rounds, %d starts; "+
		"the driver's publish batches are not counted), %.2f transactions of any kind per step\n",
		float64(syncCommits)/float64(steps), syncCommits, journalCommits, rounds, starts, float64(afterAll-beforeAll)/float64(steps))
	if rounds > 0 {
		fmt.Fprintf(stdout, "driver: %d workflow transitions in %d rounds, %.1f per round\n", transitions, rounds, float64(transitions)/float64(rounds))
	}
	if cpu.machine > 0 {
		fmt.Fprintln(stdout, cpu.line("step", false, 0))
	}
	fmt.Fprintf(stdout, "bench: workflows=%d throughput=%.0f/s hop_p50=%.1fms hop_p99=%.1fms commits_per_step=%.2f duplicates=%d lost=%d\n",
		bc.N, throughput, ms(pctOf(hops, 0.50)), ms(pctOf(hops, 0.99)), float64(syncCommits)/float64(steps), dups, lost)
	if dups > 0 || lost > 0 {
		return fmt.Errorf("bench: %d duplicate effects, %d workflows not completed", dups, lost)
	}
	return nil
}

func pctOf(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// runWorkflows starts bc.N workflows named by id and waits until every run
// whose id starts with prefix has left the running states (or bc.Timeout).
func (bc Config) runWorkflows(ctx, runCtx context.Context, a *app.App, id func(int) string, prefix string,
	started []time.Time, progressTo io.Writer) error {
	begin := time.Now()
	loadErr := make(chan error, 1)
	go func() { loadErr <- bc.startWorkflows(runCtx, a, id, started) }()
	deadline := time.Now().Add(bc.Timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for finished := 0; finished < bc.N && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-loadErr:
			if err != nil {
				return fmt.Errorf("bench: starting workflows: %w", err)
			}
		case <-tick.C:
		}
		n, err := workflow.NewJournal(a.Pool).CountSettled(ctx, prefix)
		if err != nil {
			return err
		}
		finished = n
		progress(progressTo, finished, bc.N, time.Since(begin))
	}
	fmt.Fprintln(progressTo)
	return nil
}

// startWorkflows plays the caller: one workflow start per transaction, at
// the configured rate or from bc.Concurrency callers as fast as they can.
func (bc Config) startWorkflows(ctx context.Context, a *app.App, id func(int) string, started []time.Time) error {
	var next atomic.Int64
	submit := func() (bool, error) {
		i := int(next.Add(1)) - 1
		if i >= bc.N {
			return false, nil
		}
		_, _, err := a.Workflows.Start(ctx, workflow.Start{WorkflowID: id(i), Workflow: "bench",
			Input: json.RawMessage(fmt.Sprintf(`{"amount":%d}`, 100+i%900)), Principal: "bench-agent"})
		if err != nil {
			return false, err
		}
		started[i] = time.Now()
		return i+1 < bc.N, nil
	}
	var wg sync.WaitGroup
	errc := make(chan error, bc.Concurrency+1)
	if bc.Rate > 0 {
		var failed error
		err := paced(ctx, wallClock, time.Second/time.Duration(bc.Rate), func() bool {
			select {
			case failed = <-errc:
				return false
			default:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := submit(); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}()
			return int(next.Load()) < bc.N
		})
		wg.Wait()
		if failed == nil {
			select {
			case failed = <-errc:
			default:
			}
		}
		return cmp.Or(failed, err)
	}
	for range bc.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				more, err := submit()
				if err != nil {
					errc <- err
					return
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}
