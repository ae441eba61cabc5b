package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/store/packed"
)

var (
	// ErrNotFound: no workflow run under that id.
	ErrNotFound = errors.New("workflow not found")
	// ErrPayloadConflict: the workflow id was used with another workflow or
	// input.
	ErrPayloadConflict = errors.New("workflow id reused with another input")
	// ErrNotWaiting: the run is not waiting for a decision.
	ErrNotWaiting = errors.New("workflow is not waiting for a decision")
	// ErrInvalidDecision: the decision cannot apply to this run.
	ErrInvalidDecision = errors.New("invalid decision")
	// ErrUnknownWorkflow: no workflow of that name is declared.
	ErrUnknownWorkflow = errors.New("unknown workflow")
	// ErrInvalidInput: the start request is malformed or its input does not
	// match the workflow's input_schema.
	ErrInvalidInput = errors.New("invalid workflow input")
)

// InputError says what is wrong with a start request.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

func (e *InputError) Unwrap() error { return ErrInvalidInput }

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// load reads the head of a run; forUpdate locks it for the transaction,
// FOR NO KEY UPDATE as the driver does (see lockDueSQL).
// A pruned run's head is its tombstone: a *PrunedError.
func load(ctx context.Context, q querier, id string, forUpdate bool) (events.Workflow, error) {
	sql := `SELECT record, pruned_at IS NOT NULL FROM workflows WHERE workflow_id = $1`
	if forUpdate {
		sql += ` FOR NO KEY UPDATE`
	}
	var raw []byte
	var pruned bool
	if err := q.QueryRow(ctx, sql, id).Scan(&raw, &pruned); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return events.Workflow{}, fmt.Errorf("loading workflow %s: %w", id, ErrNotFound)
		}
		return events.Workflow{}, fmt.Errorf("loading workflow %s: %w", id, err)
	}
	if pruned {
		// A second read, on a path that is rare by construction.
		return events.Workflow{}, loadTombstone(ctx, q, id)
	}
	var r events.Workflow
	if err := json.Unmarshal(raw, &r); err != nil {
		return events.Workflow{}, fmt.Errorf("loading workflow %s: decoding the record: %w", id, err)
	}
	return r, nil
}

// write journals a plan inside tx: the head moves from base.Seq to the
// plan's record only if it is still at base.Seq (the claim of the
// transition), the events are appended, and the plan's intents recorded.
// base.Seq 0 creates the run; false means another writer got there first.
func write(ctx context.Context, tx pgx.Tx, base events.Workflow, p *plan, prefix, traceparent string) (bool, error) {
	t := &transition{base: base, p: p, tp: traceparent}
	if err := writeTransitions(ctx, tx, []*transition{t}, prefix, nil); err != nil {
		return false, err
	}
	return t.done, nil
}

// transition is one run's plan, to be written from base.
type transition struct {
	base events.Workflow
	p    *plan
	// tp is the run's trace context (workflowTrace): its events and
	// intents are journaled with it.
	tp string
	// done is set by writeTransitions: the head moved, the events and
	// intents are written.
	done bool
}

// The statements that move a run's head and journal the transition's
// events, one statement per run so that a round's runs are pipelined (see
// store's appendSQL, the same shape): the events are inserted only if the
// head row was written, and count(*) says whether it was. $2 is the seq
// the writer decided from; a run's head moves only from there.
const (
	advanceRunSQL = `
WITH head AS (
    UPDATE workflows SET status = $3, seq = $4, awaiting = $5, record = $6, updated_at = $7
     WHERE workflow_id = $1 AND seq = $2
    RETURNING 1` + runEventsSQL

	createRunSQL = `
WITH head AS (
    INSERT INTO workflows (workflow_id, workflow, input_hash, status, seq, awaiting, record, created_at, updated_at)
    VALUES ($1, $14, $15, $3, $4, $5, $6, $7, $7)
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING $2::bigint` + runEventsSQL

	runEventsSQL = `
), ev AS (
    INSERT INTO workflow_events (workflow_id, seq, event_id, type, envelope, traceparent, occurred_at)
    SELECT $1, u.seq, u.event_id, u.type, u.envelope, $8, u.occurred_at
      FROM unnest($9::bigint[], $10::text[], $11::text[], $12::bytea[], $13::timestamptz[])
           AS u(seq, event_id, type, envelope, occurred_at)
     WHERE EXISTS (SELECT 1 FROM head)
)
SELECT count(*) FROM head`
)

// queueHead queues t's head-and-events statement on b.
func queueHead(b *pgx.Batch, t *transition) error {
	rec := t.p.rec
	rec.Events, rec.Operations = nil, nil
	raw, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding workflow %s: %w", rec.WorkflowID, err)
	}
	var awaiting any
	if rec.Awaiting != "" {
		awaiting = rec.Awaiting
	}
	n := len(t.p.events)
	seqs, ids, types := make([]int64, n), make([]string, n), make([]string, n)
	envs, times := make([][]byte, n), make([]time.Time, n)
	// Workflow envelopes are packed with no key left out (""): the
	// operations' journal is where that pays (store.StoredEnvelope).
	for i, e := range t.p.events {
		env, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encoding %s of workflow %s: %w", e.Type, e.WorkflowID, err)
		}
		seqs[i], ids[i], types[i], envs[i], times[i] = e.Seq, e.EventID, string(e.Type), store.StoredEnvelope(env, ""), e.OccurredAt
	}
	// The head record is a derived copy in jsonb, which cannot hold NUL;
	// the journal keeps the exact bytes.
	args := []any{rec.WorkflowID, t.base.Seq, string(rec.Status), rec.Seq, awaiting, store.JSONBSafe(raw), rec.UpdatedAt,
		t.tp, seqs, ids, types, envs, times}
	if t.base.Seq == 0 {
		b.Queue(createRunSQL, append(args, rec.Workflow, rec.InputHash)...)
	} else {
		b.Queue(advanceRunSQL, args...)
	}
	return nil
}

// writeTransitions writes ts inside tx in a few round trips whatever their
// number: one pipelined batch moves the heads and journals the events,
// beforeIntents (if set) is called for each transition written that has
// intents, and a second batch records the intents of the transitions
// written (store.AppendBatchTx). A transition whose head had moved
// meanwhile is left with done false and nothing of it written. Any error
// leaves tx to be rolled back: which run caused it is for the caller to
// find out, by writing the runs one at a time.
func writeTransitions(ctx context.Context, tx pgx.Tx, ts []*transition, prefix string, beforeIntents func(*transition)) error {
	var b pgx.Batch
	for _, t := range ts {
		if err := queueHead(&b, t); err != nil {
			return err
		}
	}
	br := tx.SendBatch(ctx, &b)
	for _, t := range ts {
		var n int64
		if err := br.QueryRow().Scan(&n); err != nil {
			_ = br.Close()
			return fmt.Errorf("recording workflow %s: %w", t.p.rec.WorkflowID, store.InterpretError(err))
		}
		t.done = n > 0
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("recording %d workflow transitions: %w", len(ts), store.InterpretError(err))
	}

	var appends []store.Append
	var wanted []intent
	for _, t := range ts {
		if !t.done || len(t.p.intents) == 0 {
			continue
		}
		if beforeIntents != nil {
			beforeIntents(t)
		}
		for _, in := range t.p.intents {
			env, err := events.New(events.IntentRecorded, in.key, 1, in.tool, in.class, 0,
				events.IntentData{Args: in.args, Principal: t.p.rec.Principal}, t.p.rec.UpdatedAt)
			if err != nil {
				return fmt.Errorf("recording intent %s: %w", in.key, err)
			}
			appends = append(appends, store.Append{Events: []events.Envelope{env}, Traceparent: t.tp, TopicPrefix: prefix})
			wanted = append(wanted, in)
		}
	}
	if len(appends) == 0 {
		return nil
	}
	res, err := store.AppendBatchTx(ctx, tx, appends)
	if err != nil {
		return fmt.Errorf("recording %d intents: %w", len(appends), err)
	}
	var taken []intent
	for i, r := range res {
		switch {
		case r.Err == nil:
		case store.IsConflict(r.Err):
			taken = append(taken, wanted[i])
		default:
			return fmt.Errorf("recording intent %s: %w", wanted[i].key, r.Err)
		}
	}
	return adoptIntents(ctx, tx, taken)
}

// adoptIntents checks intents whose keys exist already. The same call
// recorded by hand is one the step adopts. Another call under the key is a
// conflict the run cannot get past, an error.
func adoptIntents(ctx context.Context, tx pgx.Tx, taken []intent) error {
	if len(taken) == 0 {
		return nil
	}
	keys := make([]string, len(taken))
	for i, in := range taken {
		keys[i] = in.key
	}
	ops, err := store.LoadManyTx(ctx, tx, keys)
	if err != nil {
		return fmt.Errorf("recording intents: %w", err)
	}
	for _, in := range taken {
		op, ok := ops[in.key]
		if !ok {
			return fmt.Errorf("recording intent %s: the key is already recorded, and pruned", in.key)
		}
		hash, err := events.PayloadHash(in.args)
		if err != nil {
			return fmt.Errorf("recording intent %s: %w", in.key, err)
		}
		if op.PayloadHash != hash || op.Tool != in.tool {
			return fmt.Errorf("recording intent %s: the key is already recorded for another call: %w", in.key, ErrPayloadConflict)
		}
	}
	return nil
}

// workflowTrace returns the trace context a run was started in, journaled
// with its first event (startTrace).
func workflowTrace(ctx context.Context, q querier, id string) (string, error) {
	var tp string
	err := q.QueryRow(ctx, `SELECT traceparent FROM workflow_events WHERE workflow_id = $1 AND seq = 1`, id).Scan(&tp)
	if err != nil {
		return "", fmt.Errorf("loading the trace context of workflow %s: %w", id, err)
	}
	return tp, nil
}

// journal reads a run's events, in order.
func journal(ctx context.Context, q querier, id string) ([]events.WorkflowEnvelope, error) {
	rows, err := q.Query(ctx, `SELECT envelope FROM workflow_events WHERE workflow_id = $1 ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("reading workflow %s: %w", id, err)
	}
	defer rows.Close()
	var out []events.WorkflowEnvelope
	for rows.Next() {
		var stored []byte
		if err := rows.Scan(&stored); err != nil {
			return nil, err
		}
		raw, err := packed.Unpack(stored, "")
		if err != nil {
			return nil, fmt.Errorf("reading workflow %s: %w", id, err)
		}
		var e events.WorkflowEnvelope
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("reading workflow %s: %w", id, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Journal reads the workflow journal for those who fold it elsewhere: the
// projector's gap fills and rebuild of workflow_state. It is safe for
// concurrent use.
type Journal struct {
	pool *pgxpool.Pool
}

// NewJournal returns a reader of the workflow journal in pool's database.
func NewJournal(pool *pgxpool.Pool) *Journal { return &Journal{pool: pool} }

// WorkflowEvents returns the events of run id after afterSeq, in seq order.
func (j *Journal) WorkflowEvents(ctx context.Context, id string, afterSeq int64) ([]events.JournaledWorkflowEvent, error) {
	rows, err := j.pool.Query(ctx, `SELECT envelope, traceparent FROM workflow_events
		WHERE workflow_id = $1 AND seq > $2 ORDER BY seq`, id, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("reading workflow %s after seq %d: %w", id, afterSeq, store.InterpretError(err))
	}
	out, err := pgx.CollectRows(rows, scanJournaled)
	if err != nil {
		return nil, fmt.Errorf("reading workflow %s after seq %d: %w", id, afterSeq, store.InterpretError(err))
	}
	return out, nil
}

// WorkflowJournalTx streams every journaled workflow event inside the
// caller's transaction, in (workflow_id, seq) order, pageSize events per
// query. Each page is a range scan of the primary key that starts where the
// last one ended (store.JournalTx reads the operations' journal the same
// way). The first error ends the sequence.
func (j *Journal) WorkflowJournalTx(ctx context.Context, tx pgx.Tx, pageSize int) iter.Seq2[events.JournaledWorkflowEvent, error] {
	return func(yield func(events.JournaledWorkflowEvent, error) bool) {
		var (
			afterID  string
			afterSeq int64
		)
		for {
			rows, err := tx.Query(ctx, `SELECT envelope, traceparent FROM workflow_events
				WHERE (workflow_id, seq) > ($1, $2) ORDER BY workflow_id, seq LIMIT $3`, afterID, afterSeq, pageSize)
			if err != nil {
				yield(events.JournaledWorkflowEvent{}, fmt.Errorf("reading workflow events after %s/%d: %w", afterID, afterSeq, store.InterpretError(err)))
				return
			}
			page, err := pgx.CollectRows(rows, scanJournaled)
			if err != nil {
				yield(events.JournaledWorkflowEvent{}, fmt.Errorf("reading workflow events after %s/%d: %w", afterID, afterSeq, store.InterpretError(err)))
				return
			}
			for _, e := range page {
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < pageSize {
				return
			}
			last := page[len(page)-1]
			afterID, afterSeq = last.WorkflowID, last.Seq
		}
	}
}

func scanJournaled(row pgx.CollectableRow) (events.JournaledWorkflowEvent, error) {
	var (
		stored []byte
		tp     string
	)
	if err := row.Scan(&stored, &tp); err != nil {
		return events.JournaledWorkflowEvent{}, err
	}
	raw, err := packed.Unpack(stored, "")
	if err != nil {
		return events.JournaledWorkflowEvent{}, err
	}
	e, err := events.DecodeWorkflow(raw)
	if err != nil {
		return events.JournaledWorkflowEvent{}, err
	}
	return events.JournaledWorkflowEvent{WorkflowEnvelope: e, Traceparent: tp}, nil
}

// The reads below are for reports and the benchmark, not for a hot path:
// each scans every run whose id starts with prefix.

// HeadTimes returns, for the runs whose id starts with prefix and that are
// now in status, when their head last changed.
func (j *Journal) HeadTimes(ctx context.Context, prefix string, status events.WorkflowStatus) (map[string]time.Time, error) {
	rows, err := j.pool.Query(ctx, `SELECT workflow_id, updated_at FROM workflows
		WHERE starts_with(workflow_id, $1) AND status = $2`, prefix, string(status))
	if err != nil {
		return nil, fmt.Errorf("reading the runs under %q: %w", prefix, store.InterpretError(err))
	}
	out, err := store.KeyTimes(rows)
	if err != nil {
		return nil, fmt.Errorf("reading the runs under %q: %w", prefix, store.InterpretError(err))
	}
	return out, nil
}

// CountSettled returns how many runs whose id starts with prefix wait on
// nothing any more (neither running nor unwinding).
func (j *Journal) CountSettled(ctx context.Context, prefix string) (int, error) {
	var n int
	if err := j.pool.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE starts_with(workflow_id, $1)
		AND status NOT IN ('running', 'unwinding')`, prefix).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the runs under %q: %w", prefix, store.InterpretError(err))
	}
	return n, nil
}

// CountTransitions returns how many transitions after the start wrote
// events of the runs whose id starts with prefix, and in how many
// transactions: a transition's events share their occurred_at, and so do
// all the transitions of one driver round.
func (j *Journal) CountTransitions(ctx context.Context, prefix string) (transitions, transactions int64, err error) {
	if err := j.pool.QueryRow(ctx, `SELECT count(DISTINCT (workflow_id, occurred_at)), count(DISTINCT occurred_at)
		FROM workflow_events WHERE starts_with(workflow_id, $1) AND seq > 1`, prefix).Scan(&transitions, &transactions); err != nil {
		return 0, 0, fmt.Errorf("counting the transitions under %q: %w", prefix, store.InterpretError(err))
	}
	return transitions, transactions, nil
}
