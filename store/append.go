package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/jackc/pgx/v5"
)

// DefaultTopicPrefix is the contract's topic prefix.
const DefaultTopicPrefix = "effectline."

// Append is one atomic step of an operation: events decided from Base, to be
// written only if the operation is still at Base.Seq.
type Append struct {
	// Base is the record the writer decided from; the zero Operation for a
	// new operation (then the first event must be intent.recorded).
	Base   events.Operation
	Events []events.Envelope
	// Traceparent is the W3C trace context the events belong to.
	Traceparent string
	// TopicPrefix is prepended to the topic suffixes of events.TopicsFor.
	// Empty means DefaultTopicPrefix: an outbox row naming a topic that
	// does not exist would stall the relay behind it.
	TopicPrefix string
	// IntentEventID, when set, makes the append also require that the
	// operation's journaled intent is this event. It lets a writer decide
	// from an intent message alone (Base = the fold of that intent) without
	// reading the head first: if the key holds another intent, the append
	// conflicts instead of building on the wrong arguments.
	IntentEventID string
	// Unhurried appends do not wake the in-process relay: their events go
	// out with the next append that does, or the relay's next poll. The
	// executor's claims use it, so at a trickle an attempt.started is
	// published together with its outcome a few milliseconds later: one
	// relay cycle and one read-model write instead of two of each. Under
	// load other commits wake the relay anyway and the two mostly go out
	// apart (about two read-model updates per operation measured, flat out
	// and at 500/s). A claim is durable
	// at commit either way; only the read model's in_progress lags, by at
	// most the relay's poll interval.
	Unhurried bool
}

// Next folds a.Events onto a.Base: the record the append produces.
func (a Append) Next() (events.Operation, error) {
	op := a.Base
	for _, e := range a.Events {
		next, err := events.Apply(op, e)
		if err != nil {
			return a.Base, err
		}
		op = next
	}
	return op, nil
}

// appendSQL writes one step in one statement, so many steps can share one
// transaction (one commit) without savepoints: the head row is updated only
// if its seq is still the expected one, and the events and outbox rows are
// inserted only if that update happened. Data-modifying CTEs always run to
// completion and see one snapshot, so the EXISTS guards are exact.
const appendSQL = `
WITH head AS (
    UPDATE operations
       SET status = $3, seq = $4, lease_until = $5, due_at = $6, record = $7, updated_at = $8,
           body = $17, downstream_id = $18
     WHERE operation_key = $1 AND seq = $2
    RETURNING 1` + appendRowsSQL

// appendAfterIntentSQL is appendSQL that also requires the operation's
// intent (seq 1) to be the event $19.
const appendAfterIntentSQL = `
WITH head AS (
    UPDATE operations
       SET status = $3, seq = $4, lease_until = $5, due_at = $6, record = $7, updated_at = $8,
           body = $17, downstream_id = $18
     WHERE operation_key = $1 AND seq = $2
       AND EXISTS (SELECT 1 FROM events i WHERE i.operation_key = $1 AND i.seq = 1 AND i.event_id = $19)
    RETURNING 1` + appendRowsSQL

// createSQL is appendSQL for the first step of a new operation.
const createSQL = `
WITH head AS (
    INSERT INTO operations (operation_key, tool, effect_class, payload_hash, status, seq,
                            lease_until, due_at, record, body, downstream_id, principal, created_at, updated_at)
    VALUES ($1, $19, $20, $21, $3, $4, $5, $6, $7, $17, $18, $22, $8, $8)
    ON CONFLICT (operation_key) DO NOTHING
    RETURNING $2::bigint` + appendRowsSQL

// appendRowsSQL ends every append: the events and their outbox rows,
// written only if the head CTE wrote its row. The outbox rows name their
// slot with a subquery the statement's plan runs once, not through the
// column's default, outbox_current_slot(): a SQL function with a FROM
// is not inlined, so the default ran a query of its own, set up anew in
// every statement, for every outbox row (a one-row insert 13 µs instead
// of 1.5; flat out +16 % without it, docs/benchmarks.md, session 16;
// store TestAppendsNameTheOutboxSlotThemselves). Both read
// the same row in the same snapshot; which slot is current matters only
// for speed (store/rotate.go).
const appendRowsSQL = `
), ev AS (
    INSERT INTO events (operation_key, seq, event_id, type, envelope, traceparent, occurred_at)
    SELECT $1, u.seq, u.event_id, u.type, u.envelope, $9, u.occurred_at
      FROM unnest($10::bigint[], $11::text[], $12::text[], $13::bytea[], $14::timestamptz[])
           AS u(seq, event_id, type, envelope, occurred_at)
     WHERE EXISTS (SELECT 1 FROM head)
), ob AS (
    INSERT INTO outbox (operation_key, seq, topic, slot)
    SELECT $1, o.seq, o.topic, (SELECT slot FROM outbox_slot) FROM unnest($15::bigint[], $16::text[]) AS o(seq, topic)
     WHERE EXISTS (SELECT 1 FROM head)
)
SELECT count(*) FROM head`

// EventIDColumn is what events.event_id holds for the event seq whose id
// is id: the id for the intent (seq 1), the one SQL reads
// (appendAfterIntentSQL), and "" after it. Every event's id is in its
// envelope; leaving the column empty for the rest saves two ids (~74
// bytes) per operation.
func EventIDColumn(seq int64, id string) string {
	if seq == 1 {
		return id
	}
	return ""
}

// prepared is an append turned into statement arguments.
type prepared struct {
	sql  string
	args []any
	next events.Operation
	key  string
	base int64
	// envs are the encoded events, as the statement writes them: what the
	// OnCommit hooks receive once the step committed.
	envs [][]byte
}

func prepare(a Append) (prepared, error) {
	if len(a.Events) == 0 {
		return prepared{}, errors.New("append: no events")
	}
	next, err := a.Next()
	if err != nil {
		return prepared{}, fmt.Errorf("append to %s: %w", a.Events[0].OperationKey, err)
	}
	head, err := storedHead(next)
	if err != nil {
		return prepared{}, fmt.Errorf("append to %s: encoding the record: %w", next.Key, err)
	}
	n := len(a.Events)
	seqs, ids, types := make([]int64, n), make([]string, n), make([]string, n)
	envs, stored, times := make([][]byte, n), make([][]byte, n), make([]time.Time, n)
	prefix := a.TopicPrefix
	if prefix == "" {
		prefix = DefaultTopicPrefix
	}
	var obSeqs []int64
	var obTopics []string
	for i, e := range a.Events {
		b, err := events.Encode(e)
		if err != nil {
			return prepared{}, fmt.Errorf("append to %s: %w", next.Key, err)
		}
		seqs[i], ids[i], types[i], envs[i], times[i] = e.Seq, EventIDColumn(e.Seq, e.EventID), StoredEventType(e.Type), b, e.OccurredAt
		stored[i] = StoredEnvelope(b, next.Key)
		for _, t := range events.TopicsFor(e.Type) {
			obSeqs = append(obSeqs, e.Seq)
			obTopics = append(obTopics, prefix+t)
		}
	}
	var lease any
	if next.Status == events.StatusInProgress && next.LeaseUntil != nil {
		lease = *next.LeaseUntil
	}
	var due any
	if next.DueAt != nil {
		due = *next.DueAt
	}
	args := []any{next.Key, a.Base.Seq, string(next.Status), next.Seq, lease, due, head.record, next.UpdatedAt,
		a.Traceparent, seqs, ids, types, stored, times, obSeqs, obTopics, head.body, head.downstreamID}
	sql := appendSQL
	switch {
	case a.Base.Seq == 0:
		sql = createSQL
		args = append(args, next.Tool, string(next.EffectClass), next.PayloadHash, head.principal)
	case a.IntentEventID != "":
		sql = appendAfterIntentSQL
		args = append(args, a.IntentEventID)
	}
	return prepared{sql: sql, args: args, next: next, key: next.Key, base: a.Base.Seq, envs: envs}, nil
}

func (p prepared) result(count int64) (events.Operation, error) {
	if count == 0 {
		return events.Operation{}, &ConflictError{OperationKey: p.key, ExpectedSeq: p.base}
	}
	return p.next, nil
}

// Append writes one step in its own transaction and returns the new record.
// A lost race returns a *ConflictError.
func (s *Store) Append(ctx context.Context, a Append) (events.Operation, error) {
	var (
		op events.Operation
		p  prepared
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		op, p, err = appendTx(ctx, tx, a)
		return err
	})
	if err != nil {
		return events.Operation{}, err
	}
	s.commits.Add(1)
	s.appended()
	s.committed([]prepared{p}, []AppendResult{{Op: op}})
	return op, nil
}

// AppendTx writes one step inside the caller's transaction: the step exists
// if and only if the caller commits. After committing, the caller calls
// NotifyCommitted (or NotifyAppended) itself.
func AppendTx(ctx context.Context, tx pgx.Tx, a Append) (events.Operation, error) {
	op, _, err := appendTx(ctx, tx, a)
	return op, err
}

func appendTx(ctx context.Context, tx pgx.Tx, a Append) (events.Operation, prepared, error) {
	p, err := prepare(a)
	if err != nil {
		return events.Operation{}, p, err
	}
	var count int64
	if err := tx.QueryRow(ctx, p.sql, p.args...).Scan(&count); err != nil {
		return events.Operation{}, p, fmt.Errorf("append to %s: %w", p.key, interpretError(err))
	}
	op, err := p.result(count)
	return op, p, err
}

// AppendResult is the outcome of one append of a batch.
type AppendResult struct {
	Op  events.Operation
	Err error
}

// AppendBatch writes many steps in one transaction and one commit. Each step
// succeeds or conflicts on its own; an error of the transaction as a whole
// fails every step. Two steps from the same base of one operation may share
// a batch: the second conflicts, as it would in its own transaction.
func (s *Store) AppendBatch(ctx context.Context, as []Append) []AppendResult {
	res, _ := s.appendBatchCommitted(ctx, as)
	return res
}

// appendBatchCommitted is AppendBatch that also says whether the batch
// committed, so the committer counts only commits that happened.
func (s *Store) appendBatchCommitted(ctx context.Context, as []Append) ([]AppendResult, bool) {
	// One round trip: a pipelined batch ending in a single Sync runs as one
	// implicit transaction, so the steps commit together or not at all,
	// without the two extra round trips of BEGIN and COMMIT.
	res, ps, err := appendBatch(ctx, s.pool, as, true)
	if err != nil {
		for i := range res {
			if res[i].Err == nil {
				res[i] = AppendResult{Err: err}
			}
		}
		return res, false
	}
	s.commits.Add(1)
	for i, a := range as {
		if !a.Unhurried && res[i].Err == nil {
			s.appended()
			break
		}
	}
	// Before the appenders are answered: a writer's next step of the same
	// operation then reaches the hooks after this one.
	s.committed(ps, res)
	return res, true
}

// AppendBatchTx writes many steps inside the caller's transaction,
// pipelined in one round trip. Each step succeeds or conflicts on its own
// (a *ConflictError in its result). An error of the statement stream as a
// whole is returned as err; the transaction is then aborted and the caller
// must roll back.
func AppendBatchTx(ctx context.Context, tx pgx.Tx, as []Append) ([]AppendResult, error) {
	res, _, err := appendBatch(ctx, tx, as, false)
	return res, err
}

type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// intentProbePlanningSQL starts an append batch that is its own
// transaction and holds an append after an intent, whose EXISTS reads the
// intent's event by key (noBitmapScans).
const intentProbePlanningSQL = `SELECT ` + noBitmapScans

// appendBatch queues as in one pipelined batch on q; own says the batch is
// its own transaction, not part of a caller's, so a setting it makes for
// its plans ends with it.
func appendBatch(ctx context.Context, q batchSender, as []Append, own bool) ([]AppendResult, []prepared, error) {
	res := make([]AppendResult, len(as))
	ps := make([]prepared, len(as))
	var b pgx.Batch
	if own && slices.ContainsFunc(as, func(a Append) bool { return a.IntentEventID != "" }) {
		b.Queue(intentProbePlanningSQL)
	}
	settings := b.Len()
	for i, a := range as {
		p, err := prepare(a)
		if err != nil {
			res[i].Err = err
			continue
		}
		ps[i] = p
		b.Queue(p.sql, p.args...)
	}
	steps := b.Len() - settings
	if steps == 0 {
		return res, ps, nil
	}
	br := q.SendBatch(ctx, &b)
	for range settings {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return clearDone(res, ps), ps, fmt.Errorf("appending %d steps: %w", steps, interpretError(err))
		}
	}
	for i := range as {
		if res[i].Err != nil {
			continue
		}
		var count int64
		if err := br.QueryRow().Scan(&count); err != nil {
			_ = br.Close()
			return clearDone(res, ps), ps, fmt.Errorf("append to %s: %w", ps[i].key, interpretError(err))
		}
		res[i].Op, res[i].Err = ps[i].result(count)
	}
	if err := br.Close(); err != nil {
		return clearDone(res, ps), ps, fmt.Errorf("appending %d steps: %w", steps, interpretError(err))
	}
	return res, ps, nil
}

// clearDone forgets the results of the steps that were sent, when the batch
// as a whole failed: none of them committed. Steps refused before sending
// keep their own error.
func clearDone(res []AppendResult, ps []prepared) []AppendResult {
	for i := range res {
		if ps[i].sql != "" {
			res[i] = AppendResult{}
		}
	}
	return res
}

// JSONBSafe replaces the escape \u0000 in JSON text with \ufffd. PostgreSQL's
// jsonb cannot hold NUL, and a tool's response containing one must not make
// the journal refuse the outcome of an effect that happened. Only derived
// copies go through it (the head record, the read model): the journal keeps
// the exact bytes in events.envelope.
func JSONBSafe(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u0000`)) {
		return b
	}
	// An escaped backslash before "u0000" is literal text, not NUL; walk
	// the escapes so that case is left alone.
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+1 < len(b) {
			if b[i+1] == 'u' && i+5 < len(b) && string(b[i+2:i+6]) == "0000" {
				out = append(out, `\ufffd`...)
				i += 5
				continue
			}
			out = append(out, b[i], b[i+1])
			i++
			continue
		}
		out = append(out, b[i])
	}
	return out
}
