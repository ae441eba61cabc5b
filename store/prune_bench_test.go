package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/internal/testenv"
	"github.com/effectline/effectline/store"
)

// BenchmarkPrune measures pruning alone: b.N settled operations, each with
// three events of about 600 bytes and a read-model row (generated in SQL,
// not timed), pruned to tombstones by PruneSettled in pages of 100, 500
// or 2,000 candidates. ns/op is per pruned operation.
//
//	go test -run '^$' -bench Prune -benchtime 20000x ./store
func BenchmarkPrune(b *testing.B) {
	for _, batch := range []int{100, 500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			pool := testenv.NewPool(b, testenv.NewDatabase(b))
			ctx := context.Background()
			if _, err := store.Migrate(ctx, pool); err != nil {
				b.Fatal(err)
			}
			if err := generateSettled(ctx, pool, b.N); err != nil {
				b.Fatal(err)
			}
			s := store.New(pool)
			now := time.Now()
			b.ResetTimer()
			total := 0
			for total < b.N {
				n, err := s.PruneSettled(ctx, "payments.charge", now, now, batch)
				if err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					b.Fatalf("pruned %d of %d", total, b.N)
				}
				total += n
			}
		})
	}
}

// generateSettled writes n completed operations of payments.charge as the
// pipeline leaves them: head row, three events, a read-model row, no
// outbox rows. The updated_at values spread over the past hour.
func generateSettled(ctx context.Context, pool *pgxpool.Pool, n int) error {
	stmts := []string{
		`INSERT INTO operations (operation_key, tool, effect_class, payload_hash, status, seq, record, created_at, updated_at)
		 SELECT 'bench/' || i, 'payments.charge', 'irreversible', md5(i::text) || md5(i::text), 'completed', 3,
		        jsonb_build_object('operation_key', 'bench/' || i, 'tool', 'payments.charge', 'principal', 'billing-agent',
		                           'status', 'completed', 'downstream_id', 'ch_' || i, 'result', jsonb_build_object('id', 'ch_' || i, 'amount', 4200)),
		        now() - interval '1 hour', now() - interval '1 hour' + i * interval '1 ms'
		   FROM generate_series(1, $1) i`,
		`INSERT INTO events (operation_key, seq, event_id, type, envelope, occurred_at)
		 SELECT 'bench/' || i, s, gen_random_uuid()::text, 'attempt.succeeded', convert_to(repeat('x', 600), 'UTF8'), now()
		   FROM generate_series(1, $1) i, generate_series(1, 3) s`,
		`INSERT INTO operation_state (operation_key, tool, effect_class, payload_hash, principal, status, phase, attempt,
		                              last_seq, record, created_at, updated_at)
		 SELECT operation_key, tool, effect_class, payload_hash, 'billing-agent', status, 'attempt', 1, seq, record, created_at, updated_at
		   FROM operations`,
		`VACUUM ANALYZE operations, events, operation_state`,
	}
	for _, sql := range stmts {
		var err error
		if !strings.Contains(sql, "$1") {
			_, err = pool.Exec(ctx, sql)
		} else {
			_, err = pool.Exec(ctx, sql, n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
