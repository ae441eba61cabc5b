-- The read model's list indexes leave out the operation key (issue #21).
-- A page is ordered by (created_at, operation_key), but created_at alone
-- nearly always decides it, so the indexes hold created_at (and the tool)
-- without the key and PostgreSQL sorts the rare rows that share a
-- microsecond (an Incremental Sort over the index): ~220 bytes per
-- operation become ~80. projector.Reader plans each list with its values
-- (a common tool reads operation_state_created_at, a rare one
-- operation_state_tool_created_at).
--
-- The journal keeps its (operation_key, seq) primary key, although the
-- head's claim already keeps the pair unique: replaced by a plain index on
-- operation_key (~95 bytes per operation instead of ~305), the relay's and
-- the executor's probes of one event became bitmap scans wherever the
-- journal had no statistics, and flat-out throughput fell by a fifth
-- (docs/benchmarks.md, session 16). A unique key tells the planner one row
-- whatever the statistics say.
--
-- Building the new indexes reads the whole read model under a lock that
-- holds its writes back (the projector retries; nothing is lost); on a
-- large table create them first, concurrently, and this migration keeps
-- them (deploy/OPERATIONS.md, "Upgrading across migration 0015"):
--   CREATE INDEX CONCURRENTLY operation_state_created_at ON operation_state (created_at);
--   CREATE INDEX CONCURRENTLY operation_state_tool_created_at ON operation_state (tool, created_at);
CREATE INDEX IF NOT EXISTS operation_state_created_at ON operation_state (created_at);
CREATE INDEX IF NOT EXISTS operation_state_tool_created_at ON operation_state (tool, created_at);
DROP INDEX IF EXISTS operation_state_created;
DROP INDEX IF EXISTS operation_state_tool;
