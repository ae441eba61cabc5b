package testenv

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DatabaseURLEnv names the environment variable that points the tests at a
// PostgreSQL server other than the local default.
const DatabaseURLEnv = "EFFECTLINE_TEST_DATABASE_URL"

// defaultDatabaseURL is the local development server: trust auth, user
// postgres, reached over TCP on loopback only.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Timeouts for talking to the server. Connecting is bounded tightly because a
// test waiting on a dead server tells the developer nothing a quick failure
// would not; creating gets longer because it may queue behind the creations
// of every other test binary running at the same time.
const (
	dbConnectTimeout = 5 * time.Second
	dbCreateTimeout  = 60 * time.Second
	dbDropTimeout    = 30 * time.Second
)

// dbRetryAttempts bounds the retries of transient server refusals: CREATE
// DATABASE on SQLSTATE 55006, connecting on 53300 and 57P03.
const dbRetryAttempts = 10

// createDBLockKey is the pg_advisory_lock key that serializes CREATE DATABASE
// across test processes (go test ./... runs one binary per package in
// parallel, and the in-process mutex cannot see the others).
const createDBLockKey int64 = 0x6566666c696e65 // "effline" in ASCII

// createDBMu serializes CREATE DATABASE within this test binary. PostgreSQL
// copies template1 for every new database and refuses ("source database
// "template1" is being accessed by other users", SQLSTATE 55006) when another
// CREATE DATABASE is copying it at the same time.
var createDBMu sync.Mutex

// DatabaseURL returns the URL of the PostgreSQL server the tests use: the
// value of EFFECTLINE_TEST_DATABASE_URL when set, otherwise the local server
// at 127.0.0.1:5432. The database named in it is only used to create and drop
// per-test databases; tests never write to it.
func DatabaseURL() string {
	if u := os.Getenv(DatabaseURLEnv); u != "" {
		return u
	}
	return defaultDatabaseURL
}

// NewDatabase creates a fresh, uniquely named, empty database on the server at
// [DatabaseURL] and returns a connection URL for it (same host, user and
// parameters; only the database name differs). The database is dropped WITH
// (FORCE) when the test finishes, so connections a test forgot to close do
// not leak it.
//
// A database per test, rather than a schema or a transaction per test, is
// what lets the code under test open its own pools, run its own migrations
// and LISTEN/NOTIFY exactly as in production while tests run in parallel.
//
// If the server cannot be reached the test fails with instructions for
// starting it; it is never skipped.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, nil)
}

// newDatabase is [NewDatabase], copying tmpl's template database when tmpl
// is not nil.
func newDatabase(t testing.TB, tmpl *Template) string {
	t.Helper()

	adminURL := DatabaseURL()
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		t.Fatalf("testenv: %s must be a postgres:// URL, got %q", DatabaseURLEnv, redact(adminURL))
	}

	ctx, cancel := context.WithTimeout(context.Background(), dbCreateTimeout)
	defer cancel()

	conn := connectAdmin(t, ctx, adminURL)
	defer conn.Close(context.Background())

	source := ""
	if tmpl != nil {
		if source, err = tmpl.database(ctx, adminURL, conn); err != nil {
			t.Fatalf("testenv: preparing template database %s on %s: %v", tmpl.Name, redact(adminURL), err)
		}
	}
	name, err := createDatabase(ctx, conn, source)
	if err != nil {
		t.Fatalf("testenv: creating test database on %s: %v", redact(adminURL), err)
	}
	return dropOnCleanup(t, u, adminURL, name)
}

// dropOnCleanup registers the drop of name and returns its connection URL:
// the admin URL with only the database name changed.
func dropOnCleanup(t testing.TB, u *url.URL, adminURL, name string) string {
	t.Helper()

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dbDropTimeout)
		defer cancel()
		if err := dropDatabase(ctx, adminURL, name); err != nil {
			t.Errorf("testenv: dropping test database %s: %v", name, err)
		}
	})

	dbURL := *u
	dbURL.Path = "/" + name
	dbURL.RawPath = ""
	return dbURL.String()
}

// NewPool opens a pgx pool on url, checks that it can connect, and closes it
// when the test finishes. Cleanups run in reverse order, so a pool opened
// after [NewDatabase] is closed before its database is dropped.
func NewPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testenv: parsing database URL %s: %v", redact(url), err)
	}
	cfg.ConnConfig.ConnectTimeout = dbConnectTimeout

	ctx, cancel := context.WithTimeout(context.Background(), dbConnectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: opening pool on %s: %v", redact(url), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("testenv: pinging %s: %v", redact(url), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// connectAdmin connects to the admin database, failing the test with a
// how-to-fix message when the server is down: that is by far the most common
// reason integration tests fail on a fresh machine.
func connectAdmin(t testing.TB, ctx context.Context, adminURL string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		t.Fatalf("testenv: parsing %s: %v", redact(adminURL), err)
	}
	cfg.ConnectTimeout = dbConnectTimeout
	conn, err := connectRetrying(ctx, cfg)
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s: %v. Start it with: pg_ctlcluster $(ls /etc/postgresql) main start  (or set %s)",
			redact(adminURL), err, DatabaseURLEnv)
	}
	return conn
}

// connectRetrying connects, retrying while the server is up but temporarily
// refusing: too many clients (53300, likely when many test binaries run at
// once) or still starting up (57P03). Anything else, including a refused TCP
// connection, fails at once.
func connectRetrying(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			return conn, nil
		}
		var pgErr *pgconn.PgError
		if attempt == dbRetryAttempts || !errors.As(err, &pgErr) || (pgErr.Code != "53300" && pgErr.Code != "57P03") {
			return nil, err
		}
		select {
		case <-time.After(backoff + rand.N(backoff)):
		case <-ctx.Done():
			return nil, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// createDatabase creates a database with a random name and returns the name.
// It holds the in-process mutex and a cross-process advisory lock around the
// CREATE, and still retries on SQLSTATE 55006 because clients outside the
// test harness (psql, another tool) can be connected to template1 too.
//
// With a template, the new database is a copy of it instead of template1.
func createDatabase(ctx context.Context, conn *pgx.Conn, template string) (string, error) {
	createDBMu.Lock()
	defer createDBMu.Unlock()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", createDBLockKey); err != nil {
		return "", fmt.Errorf("taking advisory lock: %w", err)
	}
	defer func() {
		// Closing the session also releases the lock; unlocking here
		// just keeps the critical section short.
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", createDBLockKey)
	}()

	backoff := 50 * time.Millisecond
	var lastErr error
	for attempt := 0; attempt < dbRetryAttempts; attempt++ {
		name, err := randomDatabaseName()
		if err != nil {
			return "", err
		}
		stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
		if template != "" {
			stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
		}
		_, err = conn.Exec(ctx, stmt)
		if err == nil {
			return name, nil
		}
		lastErr = err
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return "", err
		}
		switch pgErr.Code {
		case "55006": // object_in_use: template1 is being copied or used.
		case "42P04": // duplicate_database: astronomically unlikely; new name.
			continue
		default:
			return "", err
		}
		// Jitter keeps processes that collided from colliding again.
		wait := backoff + rand.N(backoff)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return "", fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		}
		backoff = min(2*backoff, time.Second)
	}
	return "", fmt.Errorf("gave up after %d attempts (is something else connected to template1?): %w", dbRetryAttempts, lastErr)
}

// dropDatabase drops name using a fresh admin connection (the one used to
// create it is long closed by the time cleanups run).
func dropDatabase(ctx context.Context, adminURL, name string) error {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = dbConnectTimeout
	conn, err := connectRetrying(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// randomDatabaseName returns effectline_test_<16 hex digits>; the prefix makes
// leaked databases easy to find and drop by hand.
func randomDatabaseName() (string, error) {
	var b [8]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		return "", err
	}
	return "effectline_test_" + hex.EncodeToString(b[:]), nil
}

// redact hides any password in a connection URL before it reaches test output.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}
