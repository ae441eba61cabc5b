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

	"github.com/effectline/effectline/events"
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
	// hooks receive the committed events themselves (OnCommit). They are
	// copied on write, so a commit reads them with one atomic load and no
	// lock: the committer must not queue behind a registration.
	hooks atomic.Pointer[[]CommitHook]
}

// CommitHook receives one event a commit journaled: its operation key and
// its envelope, the bytes written to events.envelope (and relayed to
// Kafka). It runs on the committing goroutine before the appenders learn of
// their commit, so it must return at once (a map lookup for what it does
// not want), must not block, and must neither modify nor retain envelope
// beyond what it copies or decodes.
type CommitHook func(key string, envelope []byte)

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

// OnCommit registers fn to receive every event journaled through this store,
// after its commit succeeded and never for a step that conflicted or a
// transaction that failed. Events of one operation arrive in seq order when
// one process writes them, since a writer decides its next step from the
// record its commit returned, which is after the hooks ran. Through it the
// API's waiters learn of events appended in their own process without the
// relay → Kafka → consumer hop (watch.Hub.Deliver). Register before the
// store is used; registering later is safe but may miss commits in flight.
func (s *Store) OnCommit(fn CommitHook) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.hooks.Load()
	var hs []CommitHook
	if old != nil {
		hs = append(hs, *old...)
	}
	hs = append(hs, fn)
	s.hooks.Store(&hs)
}

// NotifyAppended runs the OnAppend listeners. Callers that append with
// AppendTx in a transaction of their own call it after their commit; it
// hands nothing to the OnCommit hooks (NotifyCommitted does), which is
// enough for intents: a waiter reads the record after registering, and an
// intent is the first event of its record.
func (s *Store) NotifyAppended() { s.appended() }

// NotifyCommitted is NotifyAppended that also hands the OnCommit hooks the
// events of as, which the caller appended with AppendTx or AppendBatchTx in
// a transaction it has committed; pass only steps that succeeded. The
// events are encoded again for the hooks (and only when there are any):
// events.Encode is deterministic, so the bytes are those journaled, and
// these paths (lease expiry, webhooks) are rare beside the committer's.
func (s *Store) NotifyCommitted(as ...Append) {
	s.appended()
	hs := s.hooks.Load()
	if hs == nil {
		return
	}
	for _, a := range as {
		for _, e := range a.Events {
			b, err := events.Encode(e)
			if err != nil {
				continue // it could not have been journaled either
			}
			for _, fn := range *hs {
				fn(e.OperationKey, b)
			}
		}
	}
}

// committed hands the events of the steps of ps that succeeded (res) to
// the OnCommit hooks. ps holds the envelopes as prepare encoded and the
// statement wrote them, so nothing is encoded or allocated here.
func (s *Store) committed(ps []prepared, res []AppendResult) {
	hs := s.hooks.Load()
	if hs == nil {
		return
	}
	for i := range ps {
		if res[i].Err != nil || ps[i].sql == "" {
			continue
		}
		for _, env := range ps[i].envs {
			for _, fn := range *hs {
				fn(ps[i].key, env)
			}
		}
	}
}

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
	return ConnectConfig(ctx, cfg)
}

// ConnectConfig is Connect on settings the caller parsed and adjusted
// (pgxpool.ParseConfig), such as a query tracer on cfg.ConnConfig.
func ConnectConfig(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
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
