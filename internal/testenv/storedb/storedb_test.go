package storedb

import (
	"testing"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// BenchmarkNewDatabase compares what a test pays for a database with the
// schema: a copy of the migrated template, or an empty database migrated
// in place (what every test did before).
func BenchmarkNewDatabase(b *testing.B) {
	b.Run("template", func(b *testing.B) {
		for range b.N {
			pool := testenv.NewPool(b, New(b))
			pool.Close()
		}
	})
	b.Run("migrate", func(b *testing.B) {
		for range b.N {
			pool := testenv.NewPool(b, testenv.NewDatabase(b))
			if _, err := store.Migrate(b.Context(), pool); err != nil {
				b.Fatal(err)
			}
			pool.Close()
		}
	})
}
