package projector

import (
	"context"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
)

// RebuildPaged is Rebuild with small pages, so a test can make operations
// straddle page boundaries without journaling thousands of events.
var RebuildPaged = rebuild

// LoadFolds reads operations' folds from operation_state as the projector
// does when its cache misses.
var LoadFolds = loadRecords

// StateRecordFields are the JSON names of the fold's fields that
// operation_state.record holds.
func StateRecordFields() []string { return JSONNames(reflect.TypeFor[stateRecord]()) }

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

// JSONNames are the JSON names of the struct type t's fields.
func JSONNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

// WriteOperations writes operations' folds to operation_state as a
// projector's flush does, and returns the keys it wrote.
func WriteOperations(ctx context.Context, pool *pgxpool.Pool, ops ...events.Operation) ([]string, error) {
	return upsert(ctx, pool, ops)
}
