package workflow

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/traceparent"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

// MaxWorkflowIDBytes bounds a workflow id, so that every step's and undo's
// operation key stays under the operation key limit.
const MaxWorkflowIDBytes = 256

// Start asks for one workflow run.
type Start struct {
	// WorkflowID identifies the run, from the caller's deterministic
	// workflow layer (an order id), never a model's output or a run id:
	// starting the same id again with the same input is a no-op.
	WorkflowID string
	// Workflow is the declared workflow's name.
	Workflow string
	// Input is a JSON object, checked against the workflow's input_schema.
	Input json.RawMessage
	// Principal is who asks; every step runs as this principal.
	Principal string
}

// Service starts runs, reads them and records decisions. It is safe for
// concurrent use.
type Service struct {
	pool   *pgxpool.Pool
	store  *store.Store
	eng    *engine
	prefix string
	now    func() time.Time
}

// NewService returns a service for the workflows defs, whose tools are in
// reg. topicPrefix is the deployment's ("" for "effectline.").
func NewService(st *store.Store, defs *Set, reg *tool.Registry, topicPrefix string) *Service {
	if topicPrefix == "" {
		topicPrefix = store.DefaultTopicPrefix
	}
	return &Service{pool: st.Pool(), store: st, eng: &engine{defs: defs, reg: reg}, prefix: topicPrefix, now: time.Now}
}

// Defs returns the declared workflows.
func (s *Service) Defs() *Set { return s.eng.defs }

// Start records a run in its own transaction; see StartTx.
func (s *Service) Start(ctx context.Context, in Start) (events.Workflow, bool, error) {
	var rec events.Workflow
	var created bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		rec, created, err = s.StartTx(ctx, tx, in)
		return err
	})
	if err != nil {
		return events.Workflow{}, false, err
	}
	if created {
		s.store.NotifyAppended()
	}
	return rec, created, nil
}

// StartTx records a run inside tx, the caller's own transaction: the
// workflow.started event and the first step's intent exist if and only if
// tx commits. An id already recorded with the same workflow and input is
// not an error: the recorded run is returned with created false (a run
// pruned after its retention: its tombstone's record, Pruned true). With
// another workflow or input the error wraps ErrPayloadConflict. Neither
// writes anything or aborts tx.
func (s *Service) StartTx(ctx context.Context, tx pgx.Tx, in Start) (events.Workflow, bool, error) {
	d, hash, err := s.check(in)
	if err != nil {
		return events.Workflow{}, false, err
	}
	base := newRecord(d, in.WorkflowID)
	p := &plan{rec: base}
	first := StepKey(in.WorkflowID, d.Steps[0].Name, 0)
	base.Input = in.Input // the first step's args read the input
	fi, err := s.eng.stepIntent(d, base, 0, first)
	if err != nil {
		return events.Workflow{}, false, &InputError{Field: "input", Reason: err.Error()}
	}
	p.intents = append(p.intents, fi)
	if err := p.add(events.WorkflowStarted, events.WorkflowStartedData{Input: in.Input, InputHash: hash,
		Principal: in.Principal, Step: d.Steps[0].Name, OperationKey: first, Steps: stepDecls(d)}, s.now()); err != nil {
		return events.Workflow{}, false, err
	}
	ok, err := write(ctx, tx, events.Workflow{}, p, s.prefix, startTrace(ctx))
	if err != nil {
		return events.Workflow{}, false, err
	}
	if ok {
		return p.rec, true, nil
	}
	existing, err := load(ctx, tx, in.WorkflowID, false)
	if tomb, pruned := AsPruned(err); pruned {
		// The run settled longer ago than its retention and was pruned: its
		// tombstone answers as the run did, and it never starts again.
		existing, err = tomb.Record(), nil
	}
	if err != nil {
		return events.Workflow{}, false, err
	}
	if existing.Workflow != in.Workflow || existing.InputHash != hash {
		return existing, false, fmt.Errorf("workflow %s: %w", in.WorkflowID, ErrPayloadConflict)
	}
	return existing, false, nil
}

// startTrace is the trace context a run is started in: the caller's span,
// or a new trace of its own when the caller has none. It is journaled with
// the run's first event, and every step's and undo's intent is recorded
// with it (workflowTrace), so the run is one trace whose operations'
// spans are children of the start.
func startTrace(ctx context.Context) string {
	if tp := traceparent.FromContext(ctx); tp != "" {
		return tp
	}
	var ids [24]byte
	if _, err := rand.Read(ids[:]); err != nil {
		return ""
	}
	return "00-" + hex.EncodeToString(ids[:16]) + "-" + hex.EncodeToString(ids[16:]) + "-01"
}

func (s *Service) check(in Start) (*Def, string, error) {
	if r := checkID(in.WorkflowID); r != "" {
		return nil, "", &InputError{Field: "workflow_id", Reason: r}
	}
	if in.Principal == "" {
		return nil, "", &InputError{Field: "principal", Reason: "missing"}
	}
	d, ok := s.eng.defs.Get(in.Workflow)
	if !ok {
		return nil, "", fmt.Errorf("%w %q", ErrUnknownWorkflow, in.Workflow)
	}
	input := bytes.TrimSpace(in.Input)
	if len(input) == 0 || input[0] != '{' {
		return nil, "", &InputError{Field: "input", Reason: "must be a JSON object"}
	}
	if d.input != nil {
		if err := d.input.ValidateArgs(input); err != nil {
			var ae *tool.ArgsError
			if errors.As(err, &ae) {
				return nil, "", &InputError{Field: "input" + ae.Field, Reason: ae.Reason}
			}
			return nil, "", &InputError{Field: "input", Reason: err.Error()}
		}
	}
	hash, err := events.PayloadHash(input)
	if err != nil {
		return nil, "", &InputError{Field: "input", Reason: err.Error()}
	}
	return d, hash, nil
}

func checkID(id string) string {
	switch {
	case id == "":
		return "missing"
	case len(id) > MaxWorkflowIDBytes:
		return fmt.Sprintf("%d bytes, over the %d byte limit", len(id), MaxWorkflowIDBytes)
	case !utf8.ValidString(id):
		return "not valid UTF-8"
	case strings.Contains(id, "/"):
		return "contains '/', which separates the workflow id from the step in operation keys"
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return "contains a control character"
	}
	return ""
}

// Get returns a run with its events and a summary of its operations. A
// pruned run is a *PrunedError, which wraps ErrNotFound.
func (s *Service) Get(ctx context.Context, id string) (events.Workflow, error) {
	r, err := load(ctx, s.pool, id, false)
	if err != nil {
		return events.Workflow{}, err
	}
	if r.Events, err = journal(ctx, s.pool, id); err != nil {
		return events.Workflow{}, err
	}
	var keys []string
	for _, st := range r.Steps {
		for _, k := range []string{st.OperationKey, st.UndoKey} {
			if k != "" {
				keys = append(keys, k)
			}
		}
	}
	ops, err := s.store.LoadMany(ctx, keys)
	if err != nil {
		return events.Workflow{}, err
	}
	r.Operations = map[string]events.WorkflowOperation{}
	for k, op := range ops {
		r.Operations[k] = events.WorkflowOperation{Status: op.Status, Attempt: op.Attempt, LastErrorClass: op.LastErrorClass}
	}
	// A settled run outlives the operations of tools with shorter dedup
	// windows than its own retention: those are tombstones by now, and
	// still say how they ended.
	var gone []string
	for _, k := range keys {
		if _, ok := ops[k]; !ok {
			gone = append(gone, k)
		}
	}
	if len(gone) > 0 {
		tombs, err := s.store.Tombstones(ctx, gone)
		if err != nil {
			return events.Workflow{}, err
		}
		for k, t := range tombs {
			r.Operations[k] = events.WorkflowOperation{Status: t.Status, Pruned: true}
		}
	}
	return r, nil
}

// Decide records an approver's decision on an escalated run, and the
// intent it calls for, in one transaction.
func (s *Service) Decide(ctx context.Context, id string, action events.WorkflowAction, note, approver string) (events.Workflow, error) {
	if approver == "" {
		return events.Workflow{}, fmt.Errorf("%w: no approver", ErrInvalidDecision)
	}
	var rec events.Workflow
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		r, err := load(ctx, tx, id, true)
		if err != nil {
			return err
		}
		p, err := s.eng.decide(r, action, note, approver, s.now())
		if err != nil {
			rec = r
			return err
		}
		tp, err := workflowTrace(ctx, tx, id)
		if err != nil {
			return err
		}
		ok, err := write(ctx, tx, r, p, s.prefix, tp)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: the workflow changed meanwhile", ErrNotWaiting)
		}
		rec = p.rec
		return nil
	})
	if err != nil {
		return rec, err
	}
	s.store.NotifyAppended()
	return rec, nil
}
