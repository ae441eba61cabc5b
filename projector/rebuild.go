package projector

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Rebuild batch sizes: events read per query (the store's journal scan) and
// rows written per statement. They bound memory, not transactions: the
// rebuild is one transaction.
const (
	rebuildReadPage  = 5000
	rebuildWriteRows = 1000
)

// Rebuilt counts what Rebuild wrote.
type Rebuilt struct {
	Operations int
	Workflows  int
}

// Rebuild replaces operation_state with the fold of every operation in the
// event store and, when wj is not nil, workflow_state with the fold of
// every run in the workflow journal, and returns how many rows it wrote.
// The result is the tables the live projector produces: both fold with the
// same functions (events.Apply, events.ApplyWorkflow) and write through the
// same upserts.
//
// It runs in one transaction that takes an EXCLUSIVE lock on each table and
// deletes every row before writing the new ones. Readers are not blocked:
// they see the old rows until the commit and the new ones after it. Writers
// are: a projector's upsert waits on the lock, then writes only the rows it
// is ahead on. What it folded onto (a cached record, or a row read before
// the lock, since plain reads do not wait) is the fold of the same events to
// an earlier seq, so where it is ahead its row is the one Rebuild would have
// written, and Rebuild may run while projectors do. Events appended during
// the rebuild either are in the pages it has still to read or arrive through
// Kafka afterwards; both end the same.
func Rebuild(ctx context.Context, st *store.Store, wj WorkflowJournal) (Rebuilt, error) {
	return rebuild(ctx, st, wj, rebuildReadPage, rebuildWriteRows)
}

// rebuild is Rebuild with its page sizes as parameters, so tests can make
// operations straddle pages.
func rebuild(ctx context.Context, st *store.Store, wj WorkflowJournal, readPage, writeRows int) (Rebuilt, error) {
	var out Rebuilt
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		var err error
		if out.Operations, err = rebuildOperations(ctx, tx, readPage, writeRows); err != nil {
			return err
		}
		if wj == nil {
			return nil
		}
		out.Workflows, err = rebuildWorkflows(ctx, tx, wj, readPage, writeRows)
		return err
	})
	if err != nil {
		return Rebuilt{}, err
	}
	return out, nil
}

func rebuildOperations(ctx context.Context, tx pgx.Tx, readPage, writeRows int) (int, error) {
	written := 0
	// DELETE rather than TRUNCATE: TRUNCATE needs ACCESS EXCLUSIVE,
	// which would block every reader of the API for the whole rebuild.
	if _, err := tx.Exec(ctx, `LOCK TABLE operation_state IN EXCLUSIVE MODE`); err != nil {
		return 0, fmt.Errorf("rebuilding operation_state: locking: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM operation_state`); err != nil {
		return 0, fmt.Errorf("rebuilding operation_state: clearing: %w", err)
	}
	var (
		op      events.Operation
		pending = make([]events.Operation, 0, writeRows)
	)
	flush := func() error {
		if err := upsertTx(ctx, tx, pending); err != nil {
			return err
		}
		written += len(pending)
		pending = pending[:0]
		return nil
	}
	for e, err := range store.JournalTx(ctx, tx, readPage) {
		if err != nil {
			return 0, fmt.Errorf("rebuilding operation_state: %w", err)
		}
		if op.Seq > 0 && e.OperationKey != op.Key {
			pending = append(pending, op)
			op = events.Operation{}
			if len(pending) >= writeRows {
				if err := flush(); err != nil {
					return 0, fmt.Errorf("rebuilding operation_state: %w", err)
				}
			}
		}
		next, err := events.Apply(op, e)
		if err != nil {
			return 0, fmt.Errorf("rebuilding operation_state: folding %s: %w", e.OperationKey, err)
		}
		op = next
	}
	if op.Seq > 0 {
		pending = append(pending, op)
	}
	if err := flush(); err != nil {
		return 0, fmt.Errorf("rebuilding operation_state: %w", err)
	}
	return written, nil
}

// rebuildWorkflows is rebuildOperations for workflow_state: the same lock,
// delete and paged fold, from the workflow journal.
func rebuildWorkflows(ctx context.Context, tx pgx.Tx, wj WorkflowJournal, readPage, writeRows int) (int, error) {
	written := 0
	if _, err := tx.Exec(ctx, `LOCK TABLE workflow_state IN EXCLUSIVE MODE`); err != nil {
		return 0, fmt.Errorf("rebuilding workflow_state: locking: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM workflow_state`); err != nil {
		return 0, fmt.Errorf("rebuilding workflow_state: clearing: %w", err)
	}
	var (
		s       workflowStream
		run     workflowRow
		pending = make([]workflowRow, 0, writeRows)
	)
	flush := func() error {
		if err := upsertWorkflowsTx(ctx, tx, pending); err != nil {
			return err
		}
		written += len(pending)
		pending = pending[:0]
		return nil
	}
	for e, err := range wj.WorkflowJournalTx(ctx, tx, readPage) {
		if err != nil {
			return 0, fmt.Errorf("rebuilding workflow_state: %w", err)
		}
		if run.rec.Seq > 0 && e.WorkflowID != run.rec.WorkflowID {
			pending = append(pending, run)
			run = workflowRow{}
			if len(pending) >= writeRows {
				if err := flush(); err != nil {
					return 0, fmt.Errorf("rebuilding workflow_state: %w", err)
				}
			}
		}
		next, err := s.apply(run, workflowEvent{env: e.WorkflowEnvelope, trace: e.Traceparent})
		if err != nil {
			return 0, fmt.Errorf("rebuilding workflow_state: folding %s: %w", e.WorkflowID, err)
		}
		run = next
	}
	if run.rec.Seq > 0 {
		pending = append(pending, run)
	}
	if err := flush(); err != nil {
		return 0, fmt.Errorf("rebuilding workflow_state: %w", err)
	}
	return written, nil
}
