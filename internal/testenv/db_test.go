package testenv

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestDatabaseURLDefault(t *testing.T) {
	t.Setenv(DatabaseURLEnv, "")
	if got := DatabaseURL(); got != "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" {
		t.Errorf("DatabaseURL() = %q", got)
	}
	t.Setenv(DatabaseURLEnv, "postgres://u@127.0.0.1:6543/x")
	if got := DatabaseURL(); got != "postgres://u@127.0.0.1:6543/x" {
		t.Errorf("DatabaseURL() with env = %q", got)
	}
}

// TestNewDatabaseParallel creates databases from many parallel tests at
// once (the template1 contention case) and checks they are isolated, usable
// and dropped afterwards.
func TestNewDatabaseParallel(t *testing.T) {
	const n = 12
	var (
		mu    sync.Mutex
		names []string
	)
	t.Run("group", func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				dbURL := NewDatabase(t)
				u, err := url.Parse(dbURL)
				if err != nil {
					t.Fatal(err)
				}
				if u.Host != "127.0.0.1:5432" && DatabaseURL() == defaultDatabaseURL {
					t.Errorf("database URL host = %q", u.Host)
				}
				if u.Query().Get("sslmode") != "disable" && DatabaseURL() == defaultDatabaseURL {
					t.Errorf("database URL lost its parameters: %q", dbURL)
				}

				pool := NewPool(t, dbURL)
				var name string
				if err := pool.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(name, "effectline_test_") || "/"+name != u.Path {
					t.Errorf("current_database() = %q, URL path %q", name, u.Path)
				}
				// Same table name everywhere: only works if isolated.
				if _, err := pool.Exec(t.Context(), "CREATE TABLE t (id int)"); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(t.Context(), "INSERT INTO t VALUES ($1)", i); err != nil {
					t.Fatal(err)
				}
				var count int
				if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM t").Scan(&count); err != nil || count != 1 {
					t.Errorf("count = %d, err %v; want 1 row", count, err)
				}
				mu.Lock()
				names = append(names, name)
				mu.Unlock()
			})
		}
	})
	if t.Failed() {
		return
	}
	if len(names) != n {
		t.Fatalf("got %d databases, want %d", len(names), n)
	}

	conn, err := pgx.Connect(t.Context(), DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = ANY($1)", names).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d test databases were not dropped on cleanup", left)
	}
}

// TestNewDatabaseDropsWithOpenConnections checks that a connection the test
// forgot to close does not stop cleanup from dropping the database.
func TestNewDatabaseDropsWithOpenConnections(t *testing.T) {
	var name string
	t.Run("leaky", func(t *testing.T) {
		dbURL := NewDatabase(t)
		conn, err := pgx.Connect(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		// Deliberately never closed.
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	conn, err := pgx.Connect(t.Context(), DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s survived cleanup", name)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, so the failure path of a helper can itself be tested.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (*fatalRecorder) Helper()        {}
func (*fatalRecorder) Cleanup(func()) {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestNewDatabaseUnreachable(t *testing.T) {
	// Port 1 on loopback: nothing listens there, so the connection is
	// refused immediately.
	bad := "postgres://postgres:secret@127.0.0.1:1/postgres?sslmode=disable"
	t.Setenv(DatabaseURLEnv, bad)

	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewDatabase(rec)
		t.Error("NewDatabase returned instead of failing the test")
	}()
	<-done

	for _, want := range []string{
		"PostgreSQL is not reachable at postgres://postgres:xxxxx@127.0.0.1:1/postgres?sslmode=disable: ",
		"Start it with: pg_ctlcluster $(ls /etc/postgresql) main start  (or set EFFECTLINE_TEST_DATABASE_URL)",
	} {
		if !strings.Contains(rec.msg, want) {
			t.Errorf("failure message %q does not contain %q", rec.msg, want)
		}
	}
	if strings.Contains(rec.msg, "secret") {
		t.Errorf("failure message leaks the password: %q", rec.msg)
	}
}

// TestNewDatabaseFrom copies one template into parallel tests: each copy
// has the template's table, writes to one stay out of the others, and the
// template is built once per process.
func TestNewDatabaseFrom(t *testing.T) {
	var builds atomic.Int32
	key := make([]byte, 8)
	if _, err := cryptorand.Read(key); err != nil {
		t.Fatal(err)
	}
	tmpl := &Template{Name: "testenv", Key: hex.EncodeToString(key), Build: func(ctx context.Context, pool *pgxpool.Pool) error {
		builds.Add(1)
		_, err := pool.Exec(ctx, "CREATE TABLE built (id int)")
		return err
	}}
	t.Cleanup(func() {
		// The template is keyed by a random key: nothing will copy it again.
		ctx := context.Background()
		conn := connectAdmin(t, ctx, DatabaseURL())
		defer conn.Close(ctx)
		name := pgx.Identifier{"effectline_tmpl_testenv_" + tmpl.Key[:16]}.Sanitize()
		for _, stmt := range []string{"ALTER DATABASE " + name + " WITH IS_TEMPLATE false", "DROP DATABASE " + name} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				t.Errorf("dropping the template: %v", err)
			}
		}
	})
	t.Run("group", func(t *testing.T) {
		for i := range 6 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				pool := NewPool(t, NewDatabaseFrom(t, tmpl))
				if _, err := pool.Exec(t.Context(), "INSERT INTO built VALUES ($1)", i); err != nil {
					t.Fatal(err)
				}
				var count int
				if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM built").Scan(&count); err != nil || count != 1 {
					t.Errorf("count = %d, err %v; want 1 row", count, err)
				}
			})
		}
	})
	if n := builds.Load(); n != 1 {
		t.Errorf("template built %d times, want 1", n)
	}
}
