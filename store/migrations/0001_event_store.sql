-- The write side: every event of every operation, the head of each
-- operation's stream, and the outbox the relay drains to Kafka.

-- operations is the head of each stream: the fold of its events, kept in the
-- same transaction as every append. Its seq column is the claim: an append
-- updates the row only where seq still equals the seq the writer decided on.
-- It stays lean on purpose (three partial indexes, small rows apart from the
-- record), because every attempt updates it.
CREATE TABLE operations (
    operation_key text        PRIMARY KEY,
    tool          text        NOT NULL,
    effect_class  text        NOT NULL,
    payload_hash  text        NOT NULL,
    status        text        NOT NULL,
    seq           bigint      NOT NULL,
    lease_until   timestamptz,
    due_at        timestamptz,
    record        jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);

-- The executor's due-time poller: retries, compensations, intents nobody
-- picked up. Only rows with work scheduled are in the index.
CREATE INDEX operations_due ON operations (due_at) WHERE due_at IS NOT NULL;
-- The reconciler's sweep of abandoned attempts.
CREATE INDEX operations_lease ON operations (lease_until) WHERE status = 'in_progress';
-- The reconciler's queue of unknown outcomes.
CREATE INDEX operations_unresolved ON operations (updated_at) WHERE status = 'needs_reconciliation';

-- events is the journal. (operation_key, seq) is unique, so appending the
-- next event of an operation is the atomic claim of its next step.
-- envelope holds the exact bytes published to Kafka.
CREATE TABLE events (
    operation_key text        NOT NULL,
    seq           bigint      NOT NULL,
    event_id      uuid        NOT NULL UNIQUE,
    type          text        NOT NULL,
    envelope      bytea       NOT NULL,
    traceparent   text        NOT NULL DEFAULT '',
    occurred_at   timestamptz NOT NULL,
    PRIMARY KEY (operation_key, seq)
);

-- outbox holds one row per event and topic still to be published. Rows are
-- deleted once Kafka acknowledged them, so the table stays as small as the
-- relay's backlog and its SKIP LOCKED scan does not decay as history grows.
-- id orders the scan for fairness only; it is never used as a cursor
-- (identity values commit out of order).
CREATE TABLE outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_key text        NOT NULL,
    seq           bigint      NOT NULL,
    topic         text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (operation_key, topic, seq)
);
