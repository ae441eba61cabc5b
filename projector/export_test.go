package projector

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
)

// RebuildPaged is Rebuild with small pages, so a test can make operations
// straddle page boundaries without journaling thousands of events.
var RebuildPaged = rebuild

// OpenWritePool is the pool a running projector flushes on.
var OpenWritePool = openWritePool

// CachedSeq returns the seq of the record p has cached for key, and whether
// it has one.
func CachedSeq(p *Projector, key string) (int64, bool) {
	found, _ := p.batcher.cache.get([]string{key})
	op, ok := found[key]
	return op.Seq, ok
}

// CacheLen returns how many records p has cached.
func CacheLen(p *Projector) int {
	c := p.batcher.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ops)
}

// WriteWorkflows writes runs' records to workflow_state as a projector's
// flush does, and returns the ids it wrote.
func WriteWorkflows(ctx context.Context, pool *pgxpool.Pool, recs ...events.Workflow) ([]string, error) {
	rows := make([]workflowRow, len(recs))
	for i, r := range recs {
		rows[i] = workflowRow{rec: r}
	}
	return workflowStream{}.write(ctx, pool, rows)
}
