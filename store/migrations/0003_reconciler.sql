-- The reconciler's tables and indexes (package reconciler owns the queries).

-- webhook_deliveries deduplicates inbound callbacks (contract §7) by their
-- Standard Webhooks id, per source. The row is inserted first in the
-- transaction that applies the callback, so "recorded as delivered" and
-- "applied" commit or roll back together: a callback whose business logic
-- failed leaves no row and its retry is processed in full.
--
-- Rows only need to outlive the signature's timestamp tolerance: a replay of
-- an id whose signed timestamp is more than 5 minutes off is refused before
-- this table is read, so a row older than twice the tolerance can never match
-- an accepted delivery again. The reconciler's sweep prunes old rows
-- (received_at index) with a generous margin.
CREATE TABLE webhook_deliveries (
    source      text        NOT NULL,
    webhook_id  text        NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (source, webhook_id)
);
CREATE INDEX webhook_deliveries_received ON webhook_deliveries (received_at);

-- A callback may name the effect only by the downstream's id. Downstream ids
-- are unique per tool, not globally, so the lookup is by (tool, id). The
-- record omits downstream_id while it is empty, so the partial index holds
-- only operations that have one.
CREATE INDEX operations_downstream_id ON operations (tool, (record->>'downstream_id'))
    WHERE record->>'downstream_id' IS NOT NULL;
