-- Autovacuum visits the hot-row tables after a fixed number of dead rows,
-- not after a fraction of the table (issue #21).
--
-- Every operation leaves two dead versions in operations (the claim, the
-- outcome) and two in operation_state (the projector's upserts), and a
-- workflow run leaves one per transition in workflows and workflow_state.
-- By default autovacuum waits until dead rows reach 20 % of the live ones
-- (autovacuum_vacuum_scale_factor = 0.2). Live rows are the history: with
-- five million retained operations that is a million dead rows, 17 minutes
-- at 500/s, all of them in the pages the hot path is writing, and the wait
-- grows with every day of retention. Measured on a private server with
-- autovacuum on and one million operations of history (docs/benchmarks.md,
-- "Session 13"): dead rows climbed to 215,000 before the first visit.
--
-- With the scale factor 0 the threshold is the same whatever the history:
-- 10,000 dead rows, which the hot path reaches in seconds, so each table is
-- vacuumed at every autovacuum_naptime (1 minute by default) and the dead
-- rows in the hot pages stay at a minute's worth. A visit that finds dead
-- rows on fewer than 2 % of the table's pages skips the index scans
-- (PostgreSQL 14 and later), so frequent visits of a large table cost the
-- recent pages, not the whole table.
ALTER TABLE operations SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
ALTER TABLE operation_state SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
ALTER TABLE workflows SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
ALTER TABLE workflow_state SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
