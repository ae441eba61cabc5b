package store

import (
	"context"
	"time"
)

// PruneCandidates and PruneKeys are the two halves of PruneSettledPage, so
// that a test can change a candidate between the read and the prune.
func (s *Store) PruneCandidates(ctx context.Context, tool string, after PruneCursor, settledBefore time.Time, limit int) ([]string, error) {
	keys, _, err := s.pruneCandidates(ctx, tool, after, settledBefore, limit)
	return keys, err
}

func (s *Store) PruneKeys(ctx context.Context, keys []string, settledBefore, now time.Time) (int, error) {
	return s.pruneKeys(ctx, keys, settledBefore, now)
}
