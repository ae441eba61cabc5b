-- Retention: settled operations are pruned to tombstones.
--
-- A tombstone is the operation's head row in operations, kept with its key
-- after the events and the read-model row are deleted: pruned_at is set,
-- record is replaced by the tombstone's few fields, and seq moves one past
-- the last event. Keeping the tombstone in the table whose primary key
-- already is the claim of a new operation is what makes a late duplicate
-- safe without a read: the intent's INSERT … ON CONFLICT (operation_key)
-- DO NOTHING conflicts with the tombstone exactly as it did with the live
-- row, in the same statement, whatever the timing (store/prune.go walks
-- through the race).
ALTER TABLE operations ADD COLUMN pruned_at timestamptz;

-- The pruner's queue: settled operations not yet pruned, per tool (each
-- tool has its own dedup_window) and oldest first. An operation enters it
-- once, when its settling update writes the row (that update is never HOT:
-- status and updated_at are indexed already), and leaves it when pruned.
CREATE INDEX operations_settled ON operations (tool, updated_at)
    WHERE status IN ('completed', 'failed', 'compensated') AND pruned_at IS NULL;

-- Tombstone expiry (EFFECTLINE_TOMBSTONE_RETENTION). Only tombstones are in
-- it, so the write path never touches it.
CREATE INDEX operations_tombstones ON operations (pruned_at) WHERE pruned_at IS NOT NULL;
