-- The read side: operation_state is the public read model the projector
-- maintains from effectline.outcomes and the query API reads.
--
-- It is derived data: every row is the fold of one operation's events up to
-- last_seq, so it can be dropped and rebuilt from the event store at any
-- time, and a row with a given (operation_key, last_seq) is the same whoever
-- wrote it. That is what lets the projector write without locks: an upsert
-- only ever replaces a row with one of a higher last_seq.
--
-- There is no checkpoint table: the consumer group's Kafka offsets are the
-- checkpoint, and last_seq makes redelivery harmless.
CREATE TABLE operation_state (
    operation_key    text        PRIMARY KEY,
    tool             text        NOT NULL,
    effect_class     text        NOT NULL,
    payload_hash     text        NOT NULL,
    principal        text        NOT NULL,
    status           text        NOT NULL,
    phase            text        NOT NULL,
    attempt          integer     NOT NULL,
    lease_until      timestamptz,
    result           jsonb,
    -- Empty strings, not NULL, mean "none yet", as in events.Operation.
    downstream_id    text        NOT NULL DEFAULT '',
    undo_ref         text        NOT NULL DEFAULT '',
    last_error_class text        NOT NULL DEFAULT '',
    compensations    integer     NOT NULL DEFAULT 0,
    evidence         integer     NOT NULL DEFAULT 0,
    escalation       jsonb,
    last_seq         bigint      NOT NULL,
    -- record is the whole events.Operation as JSON: what the projector folds
    -- the next event onto, and what a rebuild is compared against.
    record           jsonb       NOT NULL,
    -- created_at and updated_at come from the events (occurred_at), so a
    -- rebuild reproduces them; projected_at is when this row was last written.
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    projected_at     timestamptz NOT NULL DEFAULT now()
);

-- Keyset paging, newest first, over everything and under each filter. The
-- key breaks ties between operations created in the same microsecond.
CREATE INDEX operation_state_created ON operation_state (created_at, operation_key);
CREATE INDEX operation_state_status ON operation_state (status, created_at, operation_key);
CREATE INDEX operation_state_tool ON operation_state (tool, created_at, operation_key);
