// Package store is effectline's PostgreSQL event store: the journal of every
// operation's events, the head record of each operation, the outbox the relay
// drains, and the embedded schema migrations. Driver errors are translated
// here; pgconn never leaks out.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	// ErrNotFound: no operation under that key.
	ErrNotFound = errors.New("operation not found")
	// ErrConflict: another writer appended first; reload and decide again.
	ErrConflict = errors.New("append conflict")
	// ErrRejectedValue: PostgreSQL refused a value rather than failed: a
	// data exception (SQLSTATE class 22, such as a \u0000 inside a JSON
	// string, which jsonb cannot hold) or a program limit (class 54, such as
	// a value too large for an index entry). The same write fails the same
	// way every time, so retrying it is pointless.
	ErrRejectedValue = errors.New("value rejected by the database")
	// ErrNoDatabase: the server answered, but the database the URL names
	// does not exist (SQLSTATE 3D000). Starting a server will not help;
	// creating the database will.
	ErrNoDatabase = errors.New("the database does not exist")
)

// ConflictError says which append lost the race.
type ConflictError struct {
	OperationKey string
	ExpectedSeq  int64
}

func (e *ConflictError) Error() string {
	if e.ExpectedSeq == 0 {
		return fmt.Sprintf("append conflict: operation %s already exists", e.OperationKey)
	}
	return fmt.Sprintf("append conflict: operation %s is no longer at seq %d", e.OperationKey, e.ExpectedSeq)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// IsConflict reports whether err is a lost append race.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// Store is the event store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// commits counts the synchronous commits this store made for appends,
	// the figure the benchmark reports per operation.
	commits atomic.Int64

	mu        sync.Mutex
	listeners []func()
}

// New returns a store on pool. The caller owns the pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// SyncCommits returns how many synchronous commits Append and AppendBatch
// have made. Appends inside a caller's transaction are the caller's to count.
func (s *Store) SyncCommits() int64 { return s.commits.Load() }

// Pool returns the connection pool, for components that own their own queries.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// OnAppend registers fn to run after every commit that appended events
// through this store. The relay uses it to wake at once for events written in
// its own process, without paying a NOTIFY per transaction.
func (s *Store) OnAppend(fn func()) {
	s.mu.Lock()
	s.listeners = append(s.listeners, fn)
	s.mu.Unlock()
}

// NotifyAppended runs the OnAppend listeners. Callers that append with
// AppendTx in a transaction of their own call it after their commit.
func (s *Store) NotifyAppended() { s.appended() }

func (s *Store) appended() {
	s.mu.Lock()
	ls := s.listeners
	s.mu.Unlock()
	for _, fn := range ls {
		fn()
	}
}

// Connect opens a pool on url and checks that the server answers.
func Connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "3D000" {
			return nil, fmt.Errorf("connecting to PostgreSQL at %s:%d: %w: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, ErrNoDatabase, err)
		}
		return nil, fmt.Errorf("connecting to PostgreSQL at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// InterpretError translates a driver error into the store's sentinels
// (ErrNotFound, ErrConflict, ErrRejectedValue), keeping the driver's error
// in the chain for logs; any other error is returned as it is. Components
// that run statements on their own tables (the projector's read model) pass
// their errors through it, so no package but this one inspects the driver's
// error types.
func InterpretError(err error) error { return interpretError(err) }

// interpretError translates driver errors at the store boundary.
func interpretError(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "23505":
		return fmt.Errorf("%w: %s", ErrConflict, pgErr.ConstraintName)
	case len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "54"):
		return fmt.Errorf("%w: %w", ErrRejectedValue, err)
	}
	return err
}
