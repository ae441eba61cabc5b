package app

import (
	"time"

	"github.com/effectline/effectline/pruner"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/workflow"
)

// The pruner runs in every process that runs the reconciler, as a
// component of its own with its own leader election, rather than as a
// --components name: a deployment that runs the reconciler (every one must)
// cannot forget to prune, and nothing else about the reconciler changes —
// the sweep keeps its own lock and interval, and a slow prune never delays
// an expired lease's sweep. `effectline prune` runs one pass on demand.

// PruneConfig is the pruner's configuration from the tools file (its tools,
// with the undo tools of its workflows registered, and its workflows) and
// the environment.
func PruneConfig(cfg Config, tools *tool.Registry, defs *workflow.Set) pruner.Config {
	windows := map[string]time.Duration{}
	if tools != nil {
		for _, name := range tools.Names() {
			if t, ok := tools.Get(name); ok && t.Spec().DedupWindow > 0 {
				windows[name] = t.Spec().DedupWindow
			}
		}
	}
	runs := map[string][]string{}
	for _, name := range defs.Names() {
		d, _ := defs.Get(name)
		runs[name] = d.Tools()
	}
	return pruner.Config{Windows: windows, Default: cfg.Retention, WorkflowTools: runs,
		TombstoneRetention: cfg.TombstoneRetention, Interval: cfg.PruneInterval}
}

func (a *App) newPruner() (*pruner.Pruner, error) {
	pc := PruneConfig(a.Config, a.Tools, a.Workflows.Defs())
	pc.Logger, pc.MeterProvider = a.Log, a.Tel.MeterProvider()
	return pruner.New(a.Store, pc)
}
