-- The outbox becomes three rotating partitions that are truncated once
-- drained (issue #21).
--
-- Every event costs the outbox one insert and one delete per topic, so a
-- plain table fills its primary-key index with dead entries faster than
-- autovacuum removes them: the relay's ORDER BY id claim walked ~100k of
-- them (300–500 ms a claim instead of 2–10), more while a long ANALYZE held
-- back the xmin horizon, and VACUUM never shrinks the indexes (225 MB of
-- index for 6,838 live rows once). TRUNCATE gives a partition's heap and
-- indexes back at once, whatever the horizon; it needs the partition to be
-- empty, which is what rotating gives it.
--
-- Writers put their rows in the current slot (the DEFAULT of slot reads
-- outbox_slot); store.RotateOutbox moves the current slot on, to a
-- partition already truncated, and truncates the partitions that are not
-- current once the relay has drained them. The proof that a truncate never
-- takes a row is in store/rotate.go; it rests on the lock, not on which
-- slot is current.

-- outbox_slot names the current slot: one row, updated only by
-- store.RotateOutbox (under its advisory lock), so it stays one page.
CREATE TABLE outbox_slot (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    slot       smallint    NOT NULL CHECK (slot BETWEEN 0 AND 2),
    rotated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_slot (slot) VALUES (0);

-- A DEFAULT cannot hold a subquery; a function can. STABLE: it reads the
-- inserting statement's snapshot, so every row of one statement gets the
-- same slot. A writer whose snapshot predates a rotation gets the old slot,
-- which is still a partition the relay reads (see store/rotate.go).
CREATE FUNCTION outbox_current_slot() RETURNS smallint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS 'SELECT slot FROM outbox_slot';

-- The old table moves aside with its indexes, so the new one can take the
-- names; its rows are copied into slot 0, the current one, and it goes.
-- The lock first: on a live database, writers and relays wait for this
-- migration's commit instead of writing rows the copy would miss, and then
-- find the new table by name.
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
ALTER TABLE outbox RENAME TO outbox_v1;
ALTER INDEX outbox_pkey RENAME TO outbox_v1_pkey;
ALTER INDEX outbox_operation_key_topic_seq_key RENAME TO outbox_v1_key;

-- PostgreSQL 15 has no identity column on a partitioned table: a sequence
-- of the table's own, picked up where the old identity stopped.
CREATE SEQUENCE outbox_ids AS bigint;

-- The partition key must be in every unique index, so the primary key is
-- (id, slot); each partition's copy of it serves the claim's ORDER BY id
-- (a Merge Append over the three). (operation_key, topic, seq) is no longer
-- unique across partitions; it never carried a guarantee of its own (the
-- events primary key makes an event's rows once, in the statement that
-- writes the event), and the order guard and the pruner probe it per
-- partition.
CREATE TABLE outbox (
    id            bigint      NOT NULL DEFAULT nextval('outbox_ids'),
    operation_key text        NOT NULL,
    seq           bigint      NOT NULL,
    topic         text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    slot          smallint    NOT NULL DEFAULT outbox_current_slot(),
    CONSTRAINT outbox_pkey PRIMARY KEY (id, slot)
) PARTITION BY LIST (slot);
ALTER SEQUENCE outbox_ids OWNED BY outbox.id;
CREATE INDEX outbox_key ON outbox (operation_key, topic, seq);

CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES IN (0);
CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES IN (1);
CREATE TABLE outbox_2 PARTITION OF outbox FOR VALUES IN (2);

INSERT INTO outbox (id, operation_key, seq, topic, created_at, slot)
SELECT id, operation_key, seq, topic, created_at, 0 FROM outbox_v1;
SELECT setval('outbox_ids', coalesce((SELECT max(id) FROM outbox_v1), 0) + 1, false);

DROP TABLE outbox_v1;
