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
)

// Page sizes of List.
const (
	DefaultLimit = 50
	MaxLimit     = 500
)

var (
	// ErrNotFound: no operation under that key in the read model (it may not
	// have been projected yet).
	ErrNotFound = errors.New("operation not found")
	// ErrInvalidFilter is wrapped by every *FilterError.
	ErrInvalidFilter = errors.New("invalid filter")
)

// FilterError says which part of a List filter is wrong; the HTTP API
// answers it with 400.
type FilterError struct {
	Field  string // "status", "limit" or "cursor"
	Reason string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("invalid filter: %s: %s", e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidFilter) true.
func (e *FilterError) Unwrap() error { return ErrInvalidFilter }

// IsInvalidFilter reports whether err is a *FilterError.
func IsInvalidFilter(err error) bool {
	var fe *FilterError
	return errors.As(err, &fe)
}

// State is one row of operation_state: the operation record of DESIGN §3 as
// the read model holds it. The JSON names are the contract's field names.
type State struct {
	OperationKey string             `json:"operation_key"`
	Tool         string             `json:"tool"`
	EffectClass  events.EffectClass `json:"effect_class"`
	PayloadHash  string             `json:"payload_hash"`
	Principal    string             `json:"principal"`
	Status       events.Status      `json:"status"`
	Phase        events.Phase       `json:"phase"`
	Attempt      int                `json:"attempt"`
	LeaseUntil   *time.Time         `json:"lease_until"`
	// Result is the stored response as PostgreSQL's jsonb keeps it: the same
	// JSON value, not necessarily the same bytes (key order and whitespace
	// are normalized).
	Result         json.RawMessage `json:"result"`
	DownstreamID   string          `json:"downstream_id"`
	UndoRef        string          `json:"undo_ref"`
	LastErrorClass string          `json:"last_error_class"`
	Compensations  int             `json:"compensations"`
	// Evidence counts events kept without changing the state: late outcomes
	// of lost leases and rejected intents.
	Evidence int `json:"evidence"`
	// Escalation is the evidence an approver decides on, while escalated.
	Escalation  *events.EscalationData `json:"escalation,omitempty"`
	LastSeq     int64                  `json:"last_seq"`
	CreatedAt   time.Time              `json:"created_at"`
	UpdatedAt   time.Time              `json:"updated_at"`
	ProjectedAt time.Time              `json:"projected_at"`
}

// Filter selects and pages List. The zero Filter lists every operation,
// DefaultLimit at a time.
type Filter struct {
	// Status, when set, keeps operations in that status.
	Status events.Status
	// Tool, when set, keeps operations of that tool.
	Tool string
	// Principal, when set, keeps operations that principal submitted: the
	// list of a principal that may read only its own.
	Principal string
	// Limit is the page size: DefaultLimit when zero, at most MaxLimit.
	Limit int
	// Cursor is the NextCursor of the previous page; empty for the first.
	Cursor string
}

// Page is one page of List.
type Page struct {
	Items []State `json:"items"`
	// NextCursor continues after the last item; empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Reader queries operation_state.
type Reader struct {
	pool *pgxpool.Pool
}

// NewReader returns a reader on the database that holds operation_state.
func NewReader(pool *pgxpool.Pool) *Reader { return &Reader{pool: pool} }

const stateColumns = `operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
       lease_until, result, downstream_id, undo_ref, last_error_class, compensations, evidence,
       escalation, last_seq, created_at, updated_at, projected_at`

// Get returns the state of one operation, or ErrNotFound.
func (r *Reader) Get(ctx context.Context, key string) (State, error) {
	rows, err := r.pool.Query(ctx, `SELECT `+stateColumns+` FROM operation_state WHERE operation_key = $1`, key)
	if err != nil {
		return State{}, fmt.Errorf("reading operation %s: %w", key, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanState)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, fmt.Errorf("reading operation %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return State{}, fmt.Errorf("reading operation %s: %w", key, err)
	}
	return s, nil
}

// List returns a page of operations, newest first: ordered by created_at
// descending, ties broken by operation_key descending. Paging is by keyset,
// so a page costs the same however deep it is, and an operation created
// while a client pages does not shift the pages it has not read yet (it
// appears before the first page). Each operation appears on exactly one page
// as long as its created_at does not change, which it never does.
func (r *Reader) List(ctx context.Context, f Filter) (Page, error) {
	limit, err := pageLimit(f.Limit)
	if err != nil {
		return Page{}, err
	}
	if f.Status != "" && !f.Status.Valid() {
		return Page{}, &FilterError{Field: "status", Reason: fmt.Sprintf("unknown status %q", f.Status)}
	}
	// The WHERE clause is built from the filters present rather than with
	// "$1 IS NULL OR …" guards, so each shape gets a plan that uses its
	// index even when the statement is cached as a generic plan.
	var (
		conds []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Status != "" {
		conds = append(conds, "status = "+arg(string(f.Status)))
	}
	if f.Tool != "" {
		conds = append(conds, "tool = "+arg(f.Tool))
	}
	if f.Principal != "" {
		conds = append(conds, "principal = "+arg(f.Principal))
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return Page{}, err
		}
		conds = append(conds, "(created_at, operation_key) < ("+arg(c.CreatedAt)+", "+arg(c.Key)+")")
	}
	sql := `SELECT ` + stateColumns + ` FROM operation_state`
	if len(conds) > 0 {
		sql += ` WHERE ` + strings.Join(conds, " AND ")
	}
	// One row more than the page says whether another page follows.
	sql += ` ORDER BY created_at DESC, operation_key DESC LIMIT ` + arg(limit+1)

	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return Page{}, fmt.Errorf("listing operations: %w", err)
	}
	items, err := pgx.CollectRows(rows, scanState)
	if err != nil {
		return Page{}, fmt.Errorf("listing operations: %w", err)
	}
	p := Page{Items: items}
	if len(items) > limit {
		p.Items = items[:limit]
		last := p.Items[limit-1]
		p.NextCursor = encodeCursor(cursor{CreatedAt: last.CreatedAt, Key: last.OperationKey})
	}
	if p.Items == nil {
		p.Items = []State{}
	}
	return p, nil
}

func pageLimit(n int) (int, error) {
	switch {
	case n < 0:
		return 0, &FilterError{Field: "limit", Reason: "must not be negative"}
	case n == 0:
		return DefaultLimit, nil
	case n > MaxLimit:
		return MaxLimit, nil
	}
	return n, nil
}

func scanState(row pgx.CollectableRow) (State, error) {
	var (
		s                    State
		class, status, phase string
		attempt, comps, evid int32
		result, escalation   []byte
	)
	err := row.Scan(&s.OperationKey, &s.Tool, &class, &s.PayloadHash, &s.Principal, &status, &phase, &attempt,
		&s.LeaseUntil, &result, &s.DownstreamID, &s.UndoRef, &s.LastErrorClass, &comps, &evid,
		&escalation, &s.LastSeq, &s.CreatedAt, &s.UpdatedAt, &s.ProjectedAt)
	if err != nil {
		return State{}, err
	}
	s.EffectClass, s.Status, s.Phase = events.EffectClass(class), events.Status(status), events.Phase(phase)
	s.Attempt, s.Compensations, s.Evidence = int(attempt), int(comps), int(evid)
	if result != nil {
		s.Result = json.RawMessage(result)
	}
	if escalation != nil {
		s.Escalation = &events.EscalationData{}
		if err := json.Unmarshal(escalation, s.Escalation); err != nil {
			return State{}, fmt.Errorf("decoding the escalation of %s: %w", s.OperationKey, err)
		}
	}
	s.CreatedAt, s.UpdatedAt, s.ProjectedAt = s.CreatedAt.UTC(), s.UpdatedAt.UTC(), s.ProjectedAt.UTC()
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
		return cursor{}, &FilterError{Field: "cursor", Reason: reason}
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
