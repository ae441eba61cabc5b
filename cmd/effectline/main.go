// Command effectline runs the side effects AI agents ask for, so that
// retries, crashes, lost responses and duplicate messages never double an
// effect. See README.md for the two commands a newcomer runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/rcrowley/go-metrics"

	"github.com/effectline/effectline/cmd/effectline/ops"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// effectline's live heap is small (tens of MiB) and its allocation rate
	// high (every event is decoded and encoded at each hop), so the default
	// GOGC=100 spends several percent of the CPU, and part of the latency
	// tail, on collections that free little. GOGC and GOMEMLIMIT from the
	// environment still win; the Kubernetes manifests set GOMEMLIMIT.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGOGC)
	}
	// sarama times every Kafka request into go-metrics histograms (a
	// sample heap updated under a lock) that nothing in effectline reads;
	// they held 3 % of a CPU profile of the bench at 500/s (an A/B of
	// three pairs could not resolve it in the machine's CPU per
	// operation). This is sarama's documented switch; it is process-wide,
	// so it is thrown here, in the binary, and not in a package another
	// module may import.
	metrics.UseNilMetrics = true
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, errHelp) {
			return
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// SIGTERM or Ctrl-C before start-up finished is a stop like
			// any other: nothing had started, so nothing is left behind.
			fmt.Fprintln(os.Stderr, "effectline: stopped before start-up finished")
			return
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "effectline:", err)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// errHelp ends a command that printed its --help: exit status 0.
var errHelp = errors.New("help")

// defaultGOGC is the GC target when GOGC is unset (see main).
const defaultGOGC = 400

const usage = `effectline runs the side effects AI agents ask for, exactly once where it matters.

Usage:
  effectline dev [--demo] [--tools FILE]       everything in one process, embedded Kafka-protocol broker
  effectline run --components LIST             production: any of relay,executor,projector,reconciler,workflow,api
  effectline migrate                           apply the database schema
  effectline projector rebuild                 rebuild the operation_state read model from the event store
  effectline prune                             prune settled operations past their dedup_window to tombstones, now
  effectline bench [flags]                     drive intents through the whole pipeline and report
  effectline healthcheck [URL]                 exit 0 when URL (default the local /healthz) answers 2xx
  effectline ops COMMAND                       the operator's tool: list, show, watch, decide, workflows, dlq
  effectline version

Configuration is read from the environment: EFFECTLINE_DATABASE_URL, EFFECTLINE_KAFKA_BROKERS,
EFFECTLINE_TOOLS, EFFECTLINE_HTTP_ADDR, EFFECTLINE_API_TOKENS, EFFECTLINE_APPROVERS and the
standard OTEL_* variables. "effectline COMMAND --help" says which each command reads.
`

// run is main without the process: testable, and the only place that reads
// the environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "dev":
		return runDev(ctx, rest, getenv, stdout, stderr)
	case "run":
		return runComponents(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return runMigrate(ctx, rest, getenv, stdout, stderr)
	case "projector":
		return runProjectorCmd(ctx, rest, getenv, stdout, stderr)
	case "prune":
		return runPrune(ctx, rest, getenv, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, getenv, stdout, stderr)
	case "healthcheck":
		return runHealthcheck(ctx, rest, getenv, stdout)
	case "ops":
		return ops.Run(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "effectline", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "effectline: unknown command %q\n\n%s", cmd, usage)
	return errUsage
}

// cmdFlags is a command's flag set with the help it prints for --help.
type cmdFlags struct {
	*flag.FlagSet
	name           string
	stdout, stderr io.Writer
}

// newFlags returns a command's flag set: --help prints the command's help
// (commandHelp) to stdout and exits 0; a bad flag says so on stderr and
// points at --help.
func newFlags(name string, stdout, stderr io.Writer) *cmdFlags {
	fs := flag.NewFlagSet("effectline "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Usage is printed by parse, to the stream the case calls for.
	fs.Usage = func() {}
	return &cmdFlags{FlagSet: fs, name: name, stdout: stdout, stderr: stderr}
}

func (f *cmdFlags) parse(args []string) error {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp(f.stdout)
			return errHelp
		}
		fmt.Fprintf(f.stderr, "run 'effectline %s --help' for its flags\n", f.name)
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(f.Args(), " "))
	}
	return nil
}

// printHelp prints what the command does, its flags and the environment
// variables it reads.
func (f *cmdFlags) printHelp(w io.Writer) {
	h := commandHelp[f.name]
	fmt.Fprintf(w, "Usage: effectline %s [flags]\n\n%s\n", f.name, h.summary)
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nFlags:")
		f.SetOutput(w)
		f.PrintDefaults()
		f.SetOutput(f.stderr)
	}
	if len(h.env) > 0 {
		fmt.Fprintln(w, "\nEnvironment:")
		for _, name := range h.env {
			fmt.Fprintf(w, "  %-38s %s\n", name, envHelp[name])
		}
	}
	fmt.Fprintln(w, "\nThe contract: docs/contract.md; the tools file: docs/tools-file.md.")
}
