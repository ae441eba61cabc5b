-- The workflow journal (package workflow owns the queries): the head of each
-- workflow run and its events, like operations and events for operations.

-- workflows is the head of each run: the fold of its events, updated in the
-- same transaction as every append, under the row's lock. awaiting is the
-- operation the run waits on (a step, or an undo); the driver's sweep joins
-- it to operations to find runs whose operation settled.
CREATE TABLE workflows (
    workflow_id text        PRIMARY KEY,
    workflow    text        NOT NULL,
    input_hash  text        NOT NULL,
    status      text        NOT NULL,
    seq         bigint      NOT NULL,
    awaiting    text,
    record      jsonb       NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
-- The driver's sweep reads only the runs that wait on an operation.
CREATE INDEX workflows_active ON workflows (updated_at) WHERE awaiting IS NOT NULL;
CREATE INDEX workflows_status ON workflows (status, created_at, workflow_id);

-- workflow_events is the journal of the runs. (workflow_id, seq) is unique,
-- so appending the next event is the claim of the next transition.
-- published is the outbox flag for effectline.workflows; the partial index
-- holds only the backlog.
CREATE TABLE workflow_events (
    workflow_id text        NOT NULL,
    seq         bigint      NOT NULL,
    event_id    text        NOT NULL,
    type        text        NOT NULL,
    envelope    bytea       NOT NULL,
    traceparent text        NOT NULL DEFAULT '',
    occurred_at timestamptz NOT NULL,
    published   boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (workflow_id, seq)
);
CREATE INDEX workflow_events_unpublished ON workflow_events (workflow_id, seq) WHERE NOT published;
