package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/cmd/effectline/demo"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

// runDev is `effectline dev`: every component in one process, on an embedded
// Kafka-protocol broker unless EFFECTLINE_KAFKA_BROKERS names a real one.
// devMemoryLimit is dev's soft memory limit when GOMEMLIMIT is unset. A
// live heap above it only makes the collector work harder.
const devMemoryLimit = 256 << 20

func runDev(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("dev", stdout, stderr)
	runDemo := fs.Bool("demo", false, "start demo tools with realistic faults and run the worked example")
	toolsFile := fs.String("tools", "", "the tools file (default $"+app.EnvTools+")")
	orderID := fs.String("order-id", "ord-1001", "with --demo: the order to place; the same id resumes it")
	exitAfter := fs.Bool("exit-after-demo", false, "with --demo: exit when the example is done instead of serving")
	if err := fs.parse(args); err != nil {
		return err
	}
	cfg, err := app.FromEnv(getenv)
	if err != nil {
		return err
	}
	// dev has no container limit to size GOMEMLIMIT from, and the binary's
	// GOGC=400 (main) alone lets the heap reach five times its live size:
	// a 500/s soak held 600 MB of RSS for 90 MB live. A soft limit keeps
	// GOGC=400's CPU saving while the heap is small, and collects sooner
	// near the limit (the same soak: 310 MB of RSS, about 10 % more CPU).
	// The runtime has already read a GOMEMLIMIT that is set.
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(devMemoryLimit)
	}
	if *toolsFile != "" {
		cfg.ToolsFile = *toolsFile
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn" // the terminal belongs to the timeline; EFFECTLINE_LOG_LEVEL=info for more
	}

	var registry *tool.Registry
	var workflows *workflow.Set
	var downstream *demo.Downstream
	if *runDemo {
		if downstream, err = demo.StartDownstream(); err != nil {
			return fmt.Errorf("starting the demo tools: %w", err)
		}
		defer downstream.Close()
		if registry, err = httptool.Parse([]byte(downstream.ToolsYAML()), getenv); err != nil {
			return fmt.Errorf("demo tools: %w", err)
		}
		if workflows, err = workflow.Parse([]byte(downstream.ToolsYAML()), registry); err != nil {
			return fmt.Errorf("demo workflows: %w", err)
		}
		if cfg.ToolsFile != "" {
			fmt.Fprintln(stdout, "note: --demo uses its own tools; ignoring", cfg.ToolsFile)
		}
	}

	if registry == nil && cfg.ToolsFile == "" {
		// dev without tools still serves the API and the UI; the banner
		// says how to add some.
		registry = tool.NewRegistry()
	}

	brokerNote := "from " + app.EnvKafkaBrokers
	if len(cfg.KafkaBrokers) == 0 {
		cluster, err := app.StartEmbeddedBroker(cfg.Partitions, cfg.EmbeddedRetention)
		if err != nil {
			return err
		}
		defer cluster.Close()
		cfg.KafkaBrokers = cluster.ListenAddrs()
		brokerNote = "embedded Kafka-protocol broker (kfake); set " + app.EnvKafkaBrokers + " to use a real cluster"
	}
	open := cfg.APITokens == ""

	a, err := app.Open(ctx, app.Options{
		Config: cfg, Stdout: stderr, Getenv: getenv, Components: app.Components, Migrate: true,
		Tools: registry, Workflows: workflows, Open: open, Service: "effectline-dev", Version: version,
		SoleWriter: true,
	})
	if err != nil {
		return err
	}

	base := "http://" + a.APIAddr()
	fmt.Fprintf(stdout, "effectline dev %s\n", version)
	fmt.Fprintf(stdout, "  API       %s/v1/  (OpenAPI: %s/v1/openapi.json)\n", base, base)
	if open {
		fmt.Fprintf(stdout, "            open: %s is not set, so every request, decisions included, is the approver \"dev\"\n", app.EnvAPITokens)
	}
	fmt.Fprintf(stdout, "  UI        %s/ui/\n", base)
	fmt.Fprintf(stdout, "  metrics   %s/metrics\n", base)
	fmt.Fprintf(stdout, "  broker    %s  (%s)\n", strings.Join(cfg.KafkaBrokers, ","), brokerNote)
	fmt.Fprintf(stdout, "  database  %s\n", app.RedactURL(cfg.DatabaseURL))
	if len(a.Tools.Names()) == 0 {
		fmt.Fprintf(stdout, "  tools     none: pass --tools FILE or set %s (or try --demo)\n", app.EnvTools)
	} else {
		fmt.Fprintf(stdout, "  tools     %s\n", strings.Join(a.Tools.Names(), ", "))
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()

	if *runDemo {
		if err := sayResumed(runCtx, a, *orderID, stdout); err != nil {
			stopRun()
			<-done
			return err
		}
		sum, err := demo.Run(runCtx, demo.Config{Store: a.Store, Workflows: a.Workflows,
			Downstream: downstream, Out: stdout, OrderID: *orderID, UIBase: base})
		if err != nil {
			stopRun()
			<-done
			return err
		}
		if sum.Duplicates != 0 {
			fmt.Fprintf(stdout, "DUPLICATE EFFECTS: %d\n", sum.Duplicates)
		}
		if *exitAfter {
			stopRun()
			return <-done
		}
		fmt.Fprintf(stdout, "\nServing until Ctrl-C: explore %s/ui/ and %s/v1/operations\n", base, base)
	}
	if err := <-done; err != nil {
		return err
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stdout, "\neffectline dev stopped cleanly: every component drained and its last outcomes journaled.")
	}
	return nil
}

// sayResumed tells, before the demo's timeline, that the order was placed
// before on this database: its operations run once per operation key, so
// the timeline that follows is the recorded one, not a new run.
func sayResumed(ctx context.Context, a *app.App, orderID string, out io.Writer) error {
	keys := make([]string, 0, len(demo.Steps))
	for _, step := range demo.Steps {
		// The demo's order is a workflow: its steps are the operations
		// wf:<order>/<step>.
		keys = append(keys, workflow.StepKey(orderID, step.Name, 0))
	}
	ops, err := a.Store.LoadMany(ctx, keys)
	if err != nil {
		return fmt.Errorf("demo: looking up order %s: %w", orderID, err)
	}
	if len(ops) == 0 {
		return nil
	}
	settled := 0
	for _, op := range ops {
		if op.Status == events.StatusCompleted {
			settled++
		}
	}
	if settled == len(keys) {
		fmt.Fprintf(out, "\nOrder %s already ran on this database: each of its %d operations runs once per operation key,\n"+
			"so nothing is called again and the timeline below is the one recorded then. For a new order: --order-id %s\n",
			orderID, len(keys), nextOrderID(orderID))
		return nil
	}
	fmt.Fprintf(out, "\nResuming order %s: %d of its %d operations were recorded by an earlier run on this database;\n"+
		"the timeline below continues them. For a new order: --order-id %s\n", orderID, len(ops), len(keys), nextOrderID(orderID))
	return nil
}

// nextOrderID suggests an order id the database has not seen: the number
// at the end of id plus one (ord-1001 → ord-1002), else id with "-2".
func nextOrderID(id string) string {
	i := len(id)
	for i > 0 && id[i-1] >= '0' && id[i-1] <= '9' {
		i--
	}
	if i == len(id) || len(id)-i > 9 {
		return id + "-2"
	}
	n, _ := strconv.Atoi(id[i:])
	return fmt.Sprintf("%s%0*d", id[:i], len(id)-i, n+1)
}
