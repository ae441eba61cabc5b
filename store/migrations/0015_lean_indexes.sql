-- Indexes that hold what reads need and no more (issue #21): a retained
-- operation cost ~2,370 bytes of disk, ~630 of them in three indexes that
-- repeat the 40-character operation key once per entry.
--
-- The journal: events' primary key (operation_key, seq) was ~305 bytes per
-- operation, one entry per event. It was a backstop, not the guard: an
-- event is inserted only by the statement that moves the operation's head
-- row from the seq its writer read (store/append.go: the INSERT runs only
-- WHERE EXISTS the head's UPDATE … WHERE seq = $2, or the head's INSERT …
-- ON CONFLICT DO NOTHING for seq 1), and the head is one row per key under
-- its own primary key, so two writers of the same seq cannot both commit.
-- A plain index on operation_key serves every read (an operation's events,
-- the relay's probe of one event, the rebuild's keyset walk) and
-- PostgreSQL stores a key's three entries once with three row pointers:
-- ~95 bytes per operation.
--
-- Without a primary key, logical replication could not publish the
-- pruner's deletes; REPLICA IDENTITY FULL lets it (it costs WAL only
-- where wal_level = logical, and only for those deletes).
--
-- The read model: a page is ordered by (created_at, operation_key), but
-- created_at alone nearly always decides it, so the indexes hold
-- created_at (and the tool) without the key and PostgreSQL sorts the rare
-- rows that share a microsecond (an Incremental Sort over the index):
-- ~220 bytes per operation become ~65.
--
-- Building the new indexes reads the whole tables under a lock that holds
-- writes back (the writers retry; nothing is lost); on large tables create
-- them first, concurrently, and this migration keeps them
-- (deploy/OPERATIONS.md, "Upgrading across 0015"):
--   CREATE INDEX CONCURRENTLY events_operation_key ON events (operation_key);
--   CREATE INDEX CONCURRENTLY operation_state_created_at ON operation_state (created_at);
--   CREATE INDEX CONCURRENTLY operation_state_tool_created_at ON operation_state (tool, created_at);
CREATE INDEX IF NOT EXISTS events_operation_key ON events (operation_key);
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_pkey;
ALTER TABLE events REPLICA IDENTITY FULL;

CREATE INDEX IF NOT EXISTS operation_state_created_at ON operation_state (created_at);
CREATE INDEX IF NOT EXISTS operation_state_tool_created_at ON operation_state (tool, created_at);
DROP INDEX IF EXISTS operation_state_created;
DROP INDEX IF EXISTS operation_state_tool;
