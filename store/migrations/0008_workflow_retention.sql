-- Retention of workflow runs (package workflow owns the queries,
-- workflow/prune.go): a settled run (completed, unwound, abandoned) is
-- pruned to a tombstone, as a settled operation is (0005_retention.sql).
--
-- The tombstone is the run's head row in workflows, kept with its id after
-- its events and its read-model row are deleted: pruned_at is set, record
-- is cut down to the tombstone's few fields, seq moves one past the last
-- event and awaiting is cleared. A late duplicate start is an INSERT … ON
-- CONFLICT (workflow_id) DO NOTHING into workflows, so it conflicts with
-- the tombstone exactly as it did with the live row, whatever the timing,
-- and never starts the run again.
ALTER TABLE workflows ADD COLUMN pruned_at timestamptz;

-- The pruner's queue: settled runs not yet pruned, per workflow (each
-- workflow's retention follows the dedup windows of its tools) and oldest
-- first. A run enters it once, with the transition that settles it (an
-- update that is never HOT: updated_at is indexed by workflows_active
-- already), and leaves it when pruned. Keep the statuses in step with
-- settledRunPredicate in workflow/prune.go, or the planner cannot use it.
CREATE INDEX workflows_settled ON workflows (workflow, updated_at)
    WHERE status IN ('completed', 'unwound', 'abandoned') AND pruned_at IS NULL;

-- Tombstone expiry (EFFECTLINE_TOMBSTONE_RETENTION); only tombstones are
-- in it.
CREATE INDEX workflows_tombstones ON workflows (pruned_at) WHERE pruned_at IS NOT NULL;
