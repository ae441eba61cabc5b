package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

// runPrune is `effectline prune`: one pass now, beside or instead of the
// background pruner (the two never prune an operation or a run twice). It
// reads the tools file as a running process does, workflows and their undo
// tools included, so each run's retention is the one the background pruner
// would give it.
func runPrune(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("prune", stdout, stderr)
	if err := fs.parse(args); err != nil {
		return err
	}
	cfg, err := app.FromEnv(getenv)
	if err != nil {
		return err
	}
	tools := tool.NewRegistry()
	defs := &workflow.Set{}
	if cfg.ToolsFile != "" {
		if tools, err = httptool.Load(cfg.ToolsFile, getenv); err != nil {
			return err
		}
		if defs, err = workflow.Load(cfg.ToolsFile, tools); err != nil {
			return err
		}
		if err := workflow.RegisterUndoTools(tools, defs); err != nil {
			return err
		}
	}
	pool, err := app.ConnectDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	p, err := pruner.New(store.New(pool), app.PruneConfig(cfg, tools, defs))
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := p.RunOnce(ctx)
	fmt.Fprintf(stdout, "pruned %d operations to tombstones, expired %d tombstones; pruned %d workflow runs to tombstones, expired %d run tombstones in %s\n",
		n.Pruned, n.Expired, n.RunsPruned, n.RunsExpired, time.Since(start).Round(time.Millisecond))
	return err
}
