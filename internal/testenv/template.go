package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Template is a database prepared once and copied for every test that asks
// for it, so a schema's migrations run once per server instead of once per
// test: a copy (CREATE DATABASE … TEMPLATE) is a file-level clone and costs
// the same as the empty database [NewDatabase] makes.
//
// The template database on the server is named after Name and Key, so test
// binaries built from different revisions of the schema (two branches
// tested on one server) never share one. Declare a Template once, in a
// package-level variable: its memo of the server-side name lives in it.
type Template struct {
	// Name is a short label for the schema ("store"), part of the database
	// name; letters, digits and underscores.
	Name string
	// Key identifies the schema's content, e.g. a hash of the migrations;
	// the first 16 characters are part of the database name.
	Key string
	// Build applies the schema to an empty database.
	Build func(ctx context.Context, pool *pgxpool.Pool) error

	once sync.Once
	name string
	err  error
}

// NewDatabaseFrom is [NewDatabase] with the new database a copy of tmpl: the
// first call in the process builds the template on the server unless a
// previous test binary left one with the same name and key; later calls
// only copy it.
func NewDatabaseFrom(t testing.TB, tmpl *Template) string {
	t.Helper()
	return newDatabase(t, tmpl)
}

// database returns the server-side name of the template database, building
// it on the first call.
func (tp *Template) database(ctx context.Context, adminURL string, conn *pgx.Conn) (string, error) {
	tp.once.Do(func() { tp.name, tp.err = tp.ensure(ctx, adminURL, conn) })
	return tp.name, tp.err
}

// ensure finds or builds the template under the lock that serializes
// CREATE DATABASE across test processes, so two binaries starting together
// build it once. It is built under a random name and renamed when complete:
// a binary killed halfway leaves a stray database, never a half-migrated
// template. The finished template refuses connections, because PostgreSQL
// cannot copy a database someone is connected to.
func (tp *Template) ensure(ctx context.Context, adminURL string, conn *pgx.Conn) (string, error) {
	if tp.Build == nil || tp.Name == "" || tp.Key == "" {
		return "", errors.New("a template needs a Name, a Key and a Build function")
	}
	key := tp.Key
	if len(key) > 16 {
		key = key[:16]
	}
	name := "effectline_tmpl_" + tp.Name + "_" + key

	createDBMu.Lock()
	defer createDBMu.Unlock()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", createDBLockKey); err != nil {
		return "", fmt.Errorf("taking advisory lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", createDBLockKey)
	}()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}

	building, err := randomDatabaseName()
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	if err := tp.buildIn(ctx, adminURL, building); err != nil {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()+" WITH (FORCE)")
		return "", err
	}
	for _, stmt := range []string{
		"ALTER DATABASE " + pgx.Identifier{building}.Sanitize() + " RENAME TO " + pgx.Identifier{name}.Sanitize(),
		"ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return "", err
		}
	}
	return name, nil
}

// buildIn runs Build on the database name and closes every connection it
// opened: the rename and every later copy need the database unused.
func (tp *Template) buildIn(ctx context.Context, adminURL, name string) error {
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Database = name
	cfg.ConnConfig.ConnectTimeout = dbConnectTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return tp.Build(ctx, pool)
}
