package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// The pruner runs in every process that runs the reconciler, as a
// component of its own with its own leader election, rather than as a
// --components name: a deployment that runs the reconciler (every one must)
// cannot forget to prune, and nothing else about the reconciler changes —
// the sweep keeps its own lock and interval, and a slow prune never delays
// an expired lease's sweep. `effectline prune` runs one pass on demand.

// pruneConfig is the pruner's configuration from the tools file and the
// environment.
func pruneConfig(cfg config, tools *tool.Registry) pruner.Config {
	windows := map[string]time.Duration{}
	if tools != nil {
		for _, name := range tools.Names() {
			if t, ok := tools.Get(name); ok && t.Spec().DedupWindow > 0 {
				windows[name] = t.Spec().DedupWindow
			}
		}
	}
	return pruner.Config{Windows: windows, Default: cfg.Retention, TombstoneRetention: cfg.TombstoneRetention}
}

func (a *app) newPruner() (*pruner.Pruner, error) {
	pc := pruneConfig(a.cfg, a.tools)
	pc.Logger, pc.MeterProvider = a.log, a.tel.MeterProvider()
	return pruner.New(a.store, pc)
}

// runPrune is `effectline prune`: one pass now, beside or instead of the
// background pruner (the two never prune an operation twice).
func runPrune(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("prune", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := configFromEnv(getenv)
	if err != nil {
		return err
	}
	tools := tool.NewRegistry()
	if cfg.ToolsFile != "" {
		if tools, err = tool.Load(cfg.ToolsFile, getenv); err != nil {
			return err
		}
	}
	pool, err := connectDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	p, err := pruner.New(store.New(pool), pruneConfig(cfg, tools))
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := p.RunOnce(ctx)
	fmt.Fprintf(stdout, "pruned %d operations to tombstones, expired %d tombstones in %s\n",
		n.Pruned, n.Expired, time.Since(start).Round(time.Millisecond))
	return err
}
