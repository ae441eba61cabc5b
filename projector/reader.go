package projector

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// Reader queries operation_state. The records it returns hold what the
// table's columns hold: every field of the contract, the phase, the
// compensation and evidence counts and the escalation. The args and the
// executor's bookkeeping (lease owner, due time, downstream key, attempt
// times) are left out; the event store's head record has them. Result is
// the stored response as PostgreSQL's jsonb keeps it: the same JSON value,
// not necessarily the same bytes (key order and whitespace are normalized).
type Reader struct {
	pool *pgxpool.Pool
}

// NewReader returns a reader on the database that holds operation_state.
func NewReader(pool *pgxpool.Pool) *Reader { return &Reader{pool: pool} }

const stateColumns = `operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
       lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
       escalation, last_seq, created_at, updated_at`

// Get returns the record of one operation, or store.ErrNotFound (it may
// not have been projected yet).
func (r *Reader) Get(ctx context.Context, key string) (events.Operation, error) {
	rows, err := r.pool.Query(ctx, `SELECT `+stateColumns+` FROM operation_state WHERE operation_key = $1`, key)
	if err != nil {
		return events.Operation{}, fmt.Errorf("reading operation %s: %w", key, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanState)
	if errors.Is(err, pgx.ErrNoRows) {
		return events.Operation{}, fmt.Errorf("reading operation %s: %w", key, store.ErrNotFound)
	}
	if err != nil {
		return events.Operation{}, fmt.Errorf("reading operation %s: %w", key, err)
	}
	return s, nil
}

// List returns a page of operations, newest first: ordered by created_at
// descending, ties broken by operation_key descending. Paging is by keyset,
// so a page costs the same however deep it is, and an operation created
// while a client pages does not shift the pages it has not read yet (it
// appears before the first page). Each operation appears on exactly one page
// as long as its created_at does not change, which it never does.
func (r *Reader) List(ctx context.Context, f events.ListFilter) (events.ListPage, error) {
	limit, err := pageLimit(f.Limit)
	if err != nil {
		return events.ListPage{}, err
	}
	sql, args, err := listStatement(f, limit)
	if err != nil {
		return events.ListPage{}, err
	}

	rows, err := r.pool.Query(ctx, sql, append([]any{listExecMode}, args...)...)
	if err != nil {
		return events.ListPage{}, fmt.Errorf("listing operations: %w", err)
	}
	items, err := pgx.CollectRows(rows, scanState)
	if err != nil {
		return events.ListPage{}, fmt.Errorf("listing operations: %w", err)
	}
	p := events.ListPage{Items: items}
	if len(items) > limit {
		p.Items = items[:limit]
		last := p.Items[limit-1]
		p.NextCursor = encodeCursor(cursor{CreatedAt: last.CreatedAt, Key: last.Key})
	}
	if p.Items == nil {
		p.Items = []events.Operation{}
	}
	return p, nil
}

// listExecMode runs a list as PostgreSQL's unnamed statement, planned with
// its values every time, never as a generic plan of a statement kept
// prepared. The right index depends on the values: the partial index
// operation_state_unsettled (migration 0014) serves a status other than
// completed, which a generic plan of status = $1 cannot prove; a tool
// with few operations is read through operation_state_tool_created_at and
// a common one through operation_state_created_at, which only the
// statistics of that tool can tell (migration 0015). A list is planned in
// a fraction of a millisecond and is not on the effects' path.
const listExecMode = pgx.QueryExecModeExec

// listStatement is List's query for f.
func listStatement(f events.ListFilter, limit int) (string, []any, error) {
	if f.Status != "" && !f.Status.Valid() {
		return "", nil, &events.FilterError{Field: "status", Reason: fmt.Sprintf("unknown status %q", f.Status)}
	}
	var q pageQuery
	q.eq("status", string(f.Status))
	q.eq("tool", f.Tool)
	q.eq("principal", f.Principal)
	if err := q.after(f.Cursor, "operation_key"); err != nil {
		return "", nil, err
	}
	sql, args := q.statement(`SELECT `+stateColumns+` FROM operation_state`, "operation_key", limit)
	return sql, args, nil
}

// pageQuery builds a keyset page's statement from the filters present
// rather than with "$1 IS NULL OR …" guards, so each shape gets a plan that
// uses its index even when the statement is cached as a generic plan.
type pageQuery struct {
	conds []string
	args  []any
}

func (q *pageQuery) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// eq filters on col = v when v is set.
func (q *pageQuery) eq(col, v string) {
	if v != "" {
		q.conds = append(q.conds, col+" = "+q.arg(v))
	}
}

// after starts the page after cursor (when set), in the order of
// (created_at, key) descending.
func (q *pageQuery) after(cursor, key string) error {
	if cursor == "" {
		return nil
	}
	c, err := decodeCursor(cursor)
	if err != nil {
		return err
	}
	q.conds = append(q.conds, "(created_at, "+key+") < ("+q.arg(c.CreatedAt)+", "+q.arg(c.Key)+")")
	return nil
}

// statement is selectFrom with the filters, newest first, and one row more
// than the page, which says whether another page follows.
func (q *pageQuery) statement(selectFrom, key string, limit int) (string, []any) {
	sql := selectFrom
	if len(q.conds) > 0 {
		sql += ` WHERE ` + strings.Join(q.conds, " AND ")
	}
	sql += ` ORDER BY created_at DESC, ` + key + ` DESC LIMIT ` + q.arg(limit+1)
	return sql, q.args
}

func pageLimit(n int) (int, error) {
	switch {
	case n < 0:
		return 0, &events.FilterError{Field: "limit", Reason: "must not be negative"}
	case n == 0:
		return events.DefaultListLimit, nil
	case n > events.MaxListLimit:
		return events.MaxListLimit, nil
	}
	return n, nil
}

func scanState(row pgx.CollectableRow) (events.Operation, error) { return scanStateAnd(row) }

// scanStateAnd is scanState for a statement that selects more after
// stateColumns, into extra.
func scanStateAnd(row pgx.CollectableRow, extra ...any) (events.Operation, error) {
	var (
		s                    events.Operation
		class, status, phase string
		attempt, comps, evid int32
		result, escalation   []byte
	)
	err := row.Scan(append([]any{&s.Key, &s.Tool, &class, &s.PayloadHash, &s.Principal, &status, &phase, &attempt,
		&s.LeaseUntil, &result, &s.DownstreamID, &s.UndoRef, &s.LastErrorClass, &comps, &evid,
		&escalation, &s.Seq, &s.CreatedAt, &s.UpdatedAt}, extra...)...)
	if err != nil {
		return events.Operation{}, err
	}
	s.EffectClass, s.Status, s.Phase = events.EffectClass(class), events.Status(status), events.Phase(phase)
	s.Attempt, s.Compensations, s.Evidence = int(attempt), int(comps), int(evid)
	if result != nil {
		s.Result = json.RawMessage(result)
	}
	if escalation != nil {
		s.Escalation = &events.EscalationData{}
		if err := json.Unmarshal(escalation, s.Escalation); err != nil {
			return events.Operation{}, fmt.Errorf("decoding the escalation of %s: %w", s.Key, err)
		}
	}
	s.CreatedAt, s.UpdatedAt = s.CreatedAt.UTC(), s.UpdatedAt.UTC()
	if s.LeaseUntil != nil {
		l := s.LeaseUntil.UTC()
		s.LeaseUntil = &l
	}
	return s, nil
}

// cursor is the position after the last item of a page. created_at is the
// column's value (microseconds), so the comparison in List is exact.
type cursor struct {
	CreatedAt time.Time `json:"t"`
	Key       string    `json:"k"`
}

// encodeCursor makes the cursor opaque to clients: base64url of its JSON.
// It is a position, not a capability: it carries no filter, and a client
// that edits it only moves its own position.
func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c) // a time and a string always encode.
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	bad := func(reason string) (cursor, error) {
		return cursor{}, &events.FilterError{Field: "cursor", Reason: reason}
	}
	if len(s) > maxCursorLen {
		return bad("too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return bad("not a cursor from a previous page")
	}
	var c cursor
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return bad("not a cursor from a previous page")
	}
	if c.CreatedAt.IsZero() || c.Key == "" {
		return bad("incomplete")
	}
	return c, nil
}

// maxCursorLen bounds a cursor before it is decoded: the longest operation
// key with every byte JSON-escaped (6 bytes each), the timestamp and the
// braces, in base64.
const maxCursorLen = (events.MaxOperationKeyBytes*6+64)*4/3 + 4

// ListWorkflows returns a page of workflow runs from workflow_state, newest
// first: ordered by created_at descending, ties broken by workflow_id
// descending, paged by keyset like List. The status, the principal and the
// page are all applied in the query, so a page narrowed to one principal
// holds limit of its runs whenever it has that many.
func (r *Reader) ListWorkflows(ctx context.Context, f events.WorkflowFilter) (events.WorkflowPage, error) {
	limit, err := pageLimit(f.Limit)
	if err != nil {
		return events.WorkflowPage{}, err
	}
	if f.Status != "" && !f.Status.Valid() {
		return events.WorkflowPage{}, &events.FilterError{Field: "status", Reason: fmt.Sprintf("unknown status %q", f.Status)}
	}
	// Planned on its index (workflow_state_status, _principal or _created)
	// for each shape, as in List.
	var q pageQuery
	q.eq("status", string(f.Status))
	q.eq("principal", f.Principal)
	if err := q.after(f.Cursor, "workflow_id"); err != nil {
		return events.WorkflowPage{}, err
	}
	sql, args := q.statement(`SELECT record, created_at FROM workflow_state`, "workflow_id", limit)

	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return events.WorkflowPage{}, fmt.Errorf("listing workflows: %w", err)
	}
	type item struct {
		rec events.Workflow
		at  time.Time
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (item, error) {
		var (
			raw []byte
			it  item
		)
		if err := row.Scan(&raw, &it.at); err != nil {
			return item{}, err
		}
		if err := json.Unmarshal(raw, &it.rec); err != nil {
			return item{}, fmt.Errorf("decoding a workflow state: %w", err)
		}
		return it, nil
	})
	if err != nil {
		return events.WorkflowPage{}, fmt.Errorf("listing workflows: %w", err)
	}
	p := events.WorkflowPage{Items: make([]events.Workflow, 0, min(len(items), limit))}
	for _, it := range items[:min(len(items), limit)] {
		p.Items = append(p.Items, it.rec)
	}
	if len(items) > limit {
		// The cursor holds the column's value (microseconds), not the
		// record's nanoseconds, so the next page's comparison is exact.
		last := items[limit-1]
		p.NextCursor = encodeCursor(cursor{CreatedAt: last.at, Key: last.rec.WorkflowID})
	}
	return p, nil
}
