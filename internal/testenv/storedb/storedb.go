// Package storedb gives a test a fresh database that already holds the
// store's schema, copied from a template migrated once per schema revision
// (see [testenv.Template]), instead of running every migration per test.
//
// It lives apart from testenv because it imports the store, and testenv
// must stay importable by the store's own tests.
package storedb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// template is keyed by a hash of every migration, so editing one (on a
// branch, say) makes a new template instead of reusing a stale one.
var template = sync.OnceValues(func() (*testenv.Template, error) {
	ms, err := store.Migrations()
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, m := range ms {
		fmt.Fprintf(h, "%d\x00%s\x00%s\x00", m.Version, m.Name, m.SQL)
	}
	return &testenv.Template{
		Name: "store",
		Key:  hex.EncodeToString(h.Sum(nil)),
		Build: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := store.Migrate(ctx, pool)
			return err
		},
	}, nil
})

// New returns the URL of a new database with every migration applied,
// dropped when the test ends, as [testenv.NewDatabase].
func New(t testing.TB) string {
	t.Helper()
	tmpl, err := template()
	if err != nil {
		t.Fatalf("storedb: reading the migrations: %v", err)
	}
	return testenv.NewDatabaseFrom(t, tmpl)
}

// NewPool is [New] and [testenv.NewPool] in one.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testenv.NewPool(t, New(t))
}
