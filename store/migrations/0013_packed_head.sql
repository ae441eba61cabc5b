-- The head's record and the read model's, packed (issue #21). A settled operation's record was
-- ~637 bytes of jsonb, the largest thing a retained operation keeps; packed
-- against a dictionary of head records (store/packed) it is ~177 bytes.
-- jsonb cannot hold packed bytes, so compact rows write the record to a new
-- bytea column, body, and leave record NULL; plain rows (a rolling upgrade,
-- EFFECTLINE_ROW_FORMAT=plain) and rows written before keep it in record and
-- leave body NULL. Readers take whichever is set (store.Head).
--
-- SQL that read the record needs what it read in columns of its own:
-- principal (a tombstone keeps it) and downstream_id (callbacks that name
-- only the downstream's id, and a tombstone). downstream_id is NULL while
-- the downstream has given none, so the new index holds only operations
-- that have one (operations_downstream_id held every operation, because
-- the record writes "downstream_id": "" while unknown). Lookups ask both
-- indexes; the old one stops growing with the first compact write of each
-- row and empties as retention prunes the rows written before.
--
-- Adding nullable columns and a NOT VALID check rewrites nothing. Building
-- operations_downstream reads the whole table under a lock that holds
-- writes back (1.8 s for 500,000 rows on the benchmark machine); on a
-- large table, create it first with
--   ALTER TABLE operations ADD COLUMN IF NOT EXISTS downstream_id text;
--   CREATE INDEX CONCURRENTLY operations_downstream ON operations (tool, downstream_id)
--       WHERE downstream_id IS NOT NULL;
-- and this migration keeps both (deploy/OPERATIONS.md).
ALTER TABLE operations
    ALTER COLUMN record DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS body bytea,
    ADD COLUMN IF NOT EXISTS principal text,
    ADD COLUMN IF NOT EXISTS downstream_id text,
    ADD CONSTRAINT operations_record_or_body CHECK (record IS NOT NULL OR body IS NOT NULL) NOT VALID;

CREATE INDEX IF NOT EXISTS operations_downstream ON operations (tool, downstream_id)
    WHERE downstream_id IS NOT NULL;

-- The read model's record (the projector's bookkeeping, ~229 bytes of
-- jsonb) likewise: packed into body (~103 bytes), record NULL, in compact
-- rows. Nothing in SQL reads it.
ALTER TABLE operation_state
    ALTER COLUMN record DROP NOT NULL,
    ADD COLUMN body bytea,
    ADD CONSTRAINT operation_state_record_or_body CHECK (record IS NOT NULL OR body IS NOT NULL) NOT VALID;
