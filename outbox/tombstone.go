package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// prunedAmong returns the tombstones of the keys whose append conflicted
// but which hold no live operation: operations pruned after their tool's
// dedup window. The tombstone answers for them, so a late retry of the
// agent's step is the no-op it would have been while the operation lived.
func prunedAmong(ctx context.Context, tx pgx.Tx, conflicted []string, live map[string]events.Operation) (map[string]store.Tombstone, error) {
	var missing []string
	for _, k := range conflicted {
		if _, ok := live[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	return store.TombstonesTx(ctx, tx, missing)
}
