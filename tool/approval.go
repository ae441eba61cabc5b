package tool

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Approval is a tool's approval gate: which calls wait for a person before
// their first attempt, how many distinct approvers must decide retry, and
// whether the principal that asked may be one of them.
type Approval struct {
	// When is a JSON Schema on the args: a call whose args match waits.
	// Empty means every call waits.
	When json.RawMessage
	// Approvers is how many distinct approvers must decide retry before
	// the first attempt runs; 0 means one.
	Approvers int
	// NotRequester refuses a decision by the principal that submitted the
	// intent. Tools-file default: true.
	NotRequester bool

	when *jsonschema.Schema
}

// prepare compiles When.
func (a *Approval) prepare() error {
	if a.Approvers < 0 {
		return fmt.Errorf("approval: approvers must not be negative, got %d", a.Approvers)
	}
	if len(a.When) == 0 {
		a.when = nil
		return nil
	}
	sch, _, err := compileSchema(a.When)
	if err != nil {
		return fmt.Errorf("approval.when: %w", err)
	}
	a.when = sch
	return nil
}

// Gate returns the approval rule of the tool, or nil when it has none:
// Approval, or the simple form RequiresApproval (every call, one approver
// who is not the requester).
func (s *Spec) Gate() *Approval {
	switch {
	case s.Approval != nil:
		return s.Approval
	case s.RequiresApproval:
		return &Approval{Approvers: 1, NotRequester: true}
	}
	return nil
}

// NeedsApproval reports whether a call with args must wait in the approval
// gate before its first attempt, and how many distinct approvers it needs.
// Args that cannot be read against When wait: when in doubt, a person looks.
func (s *Spec) NeedsApproval(args json.RawMessage) (approvers int, ok bool) {
	a := s.Gate()
	if a == nil {
		return 0, false
	}
	n := max(a.Approvers, 1)
	sch := a.when
	if sch == nil && len(a.When) > 0 {
		var err error
		if sch, _, err = compileSchema(a.When); err != nil {
			return n, true
		}
	}
	if sch == nil {
		return n, true
	}
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return n, true
	}
	if sch.Validate(inst) != nil {
		return 0, false
	}
	return n, true
}
