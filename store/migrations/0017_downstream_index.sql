-- The index of the operations the downstream knows by id leaves out the
-- tool (issue #21): `operations_downstream (tool, downstream_id)` becomes
-- `operations_by_downstream_id (downstream_id)`, ~60 → ~40 bytes per
-- operation that has a downstream id. A downstream's ids are its own and
-- nearly never shared across tools, so the callback lookup
-- (store.LockByDownstreamIDTx: tool = $1 AND downstream_id = $2) reads the
-- one or few rows with that id and checks the tool on them.
--
-- Building the index reads the whole head table under a lock that holds
-- appends back; on a large table build it first, concurrently, and this
-- migration keeps it (deploy/OPERATIONS.md, "Upgrading across migration
-- 0017"):
--   CREATE INDEX CONCURRENTLY operations_by_downstream_id ON operations (downstream_id)
--       WHERE downstream_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_by_downstream_id ON operations (downstream_id)
    WHERE downstream_id IS NOT NULL;
DROP INDEX IF EXISTS operations_downstream;
