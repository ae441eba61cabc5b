package main

import (
	"context"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/workflow"
)

// loadWorkflows reads the workflows of the tools file and registers the
// undo tools their compensable steps need, before any component is built:
// the executor must know those tools when an unwind's first undo arrives.
// A registry given in code (dev --demo) declares no workflows.
func (a *app) loadWorkflows(o appOptions) error {
	defs := &workflow.Set{}
	if o.tools == nil && o.cfg.ToolsFile != "" {
		var err error
		if defs, err = workflow.Load(o.cfg.ToolsFile, a.tools); err != nil {
			return err
		}
		if err := workflow.RegisterUndoTools(a.tools, defs); err != nil {
			return err
		}
	}
	a.workflows = workflow.NewService(a.store, defs, a.tools, kafka.Config{TopicPrefix: o.cfg.TopicPrefix}.WithDefaults().TopicPrefix)
	return nil
}

// workflowComponent is the driver that advances workflow runs and
// publishes their events to the workflows topic.
func (a *app) workflowComponent() (component, error) {
	producer, err := kafka.NewProducer(a.kafka)
	if err != nil {
		return component{}, err
	}
	d := workflow.NewDriver(a.workflows, producer, workflow.DriverConfig{Logger: a.log})
	return component{componentWorkflow, func(ctx context.Context) error {
		defer producer.Close()
		return d.Run(ctx)
	}}, nil
}

// workflowsAPI is the API's view of the workflows.
func (a *app) workflowsAPI() api.Workflows { return a.workflows }
