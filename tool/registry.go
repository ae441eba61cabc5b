package tool

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/effectline/effectline/events"
)

// Registry holds the tools the executor may call, by name. It is filled at
// start (Parse or Load for the tools file, Register for Go tools) and read
// concurrently afterwards.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]Tool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{tools: map[string]Tool{}} }

// Register adds a tool written in Go (or any Tool). It prepares the spec
// (compiling its args schema) and refuses a tool whose declared abilities do
// not match what it implements: a compensable tool that cannot compensate
// would turn every unknown outcome into a stuck operation.
func (r *Registry) Register(t Tool) error {
	if t == nil || t.Spec() == nil {
		return errors.New("registering tool: nil tool or spec")
	}
	if e, ok := t.(interface{ Err() error }); ok && e.Err() != nil {
		return fmt.Errorf("registering tool: %w", e.Err())
	}
	s := t.Spec()
	if err := s.Prepare(); err != nil {
		return fmt.Errorf("registering tool: %w", err)
	}
	_, canComp := t.(Compensator)
	_, canRec := t.(Reconciler)
	switch {
	case s.Effect == events.Compensable && !(canComp && s.CanCompensate):
		return fmt.Errorf("registering tool %q: compensate: required for a compensable tool", s.Name)
	case s.CanCompensate && !canComp:
		return fmt.Errorf("registering tool %q: CanCompensate is set but it does not implement Compensator", s.Name)
	case s.CanReconcile && !canRec:
		return fmt.Errorf("registering tool %q: CanReconcile is set but it does not implement Reconciler", s.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tools == nil {
		r.tools = map[string]Tool{}
	}
	if _, dup := r.tools[s.Name]; dup {
		return fmt.Errorf("registering tool %q: %w", s.Name, ErrDuplicateTool)
	}
	r.tools[s.Name] = t
	return nil
}

// Get returns the tool registered under name.
func (r *Registry) Get(name string) (Tool, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tools[name]
	return t, ok
}

// Names lists the registered tools, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tools))
	for n := range r.tools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
