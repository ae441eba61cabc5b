-- The read model's list by status indexes only what is not completed
-- (issue #21). operation_state_status held every operation, about 123
-- bytes each, and nearly all of a long history is completed; a list of
-- completed operations reads operation_state_created newest first and
-- keeps the completed ones, which is nearly every row it reads. Every
-- other status (pending, in progress, escalated, failed, ...) is the
-- minority a filter is for, and keeps an index.
--
-- The partial index is used only when the statement names the status as
-- a literal (a generic plan cannot prove $1 <> 'completed'), so
-- projector.Reader writes the validated status into the statement.
--
-- Building it reads the whole table under a lock that holds writes to the
-- read model back (the projector retries; nothing is lost); on a large
-- table, create it first with
--   CREATE INDEX CONCURRENTLY operation_state_unsettled ON operation_state (status, created_at, operation_key)
--       WHERE status <> 'completed';
-- and this migration keeps it.
CREATE INDEX IF NOT EXISTS operation_state_unsettled ON operation_state (status, created_at, operation_key)
    WHERE status <> 'completed';
DROP INDEX IF EXISTS operation_state_status;
