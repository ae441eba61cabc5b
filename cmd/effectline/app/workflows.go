package app

import (
	"context"

	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/workflow"
)

// loadWorkflows reads the workflows of the tools file and registers the
// undo tools their compensable steps need, before any component is built:
// the executor must know those tools when an unwind's first undo arrives.
// A registry given in code (dev --demo) comes with its workflows in code
// too (Options.Workflows).
func (a *App) loadWorkflows(o Options) error {
	defs := &workflow.Set{}
	switch {
	case o.Tools != nil && o.Workflows != nil:
		defs = o.Workflows
	case o.Tools == nil && o.Config.ToolsFile != "":
		var err error
		if defs, err = workflow.Load(o.Config.ToolsFile, a.Tools); err != nil {
			return err
		}
	}
	if err := workflow.RegisterUndoTools(a.Tools, defs); err != nil {
		return err
	}
	a.Workflows = workflow.NewService(a.Store, defs, a.Tools, kafka.Config{TopicPrefix: o.Config.TopicPrefix}.WithDefaults().TopicPrefix)
	return nil
}

// workflowComponent is the driver that advances workflow runs and
// publishes their events to the workflows topic.
func (a *App) workflowComponent() (Component, error) {
	producer, err := kafka.NewProducer(a.Kafka)
	if err != nil {
		return Component{}, err
	}
	d := workflow.NewDriver(a.Workflows, producer, workflow.DriverConfig{Logger: a.Log, CrashPoint: a.crashPoint})
	return Component{Workflow, func(ctx context.Context) error {
		defer producer.Close()
		return d.Run(ctx)
	}}, nil
}
