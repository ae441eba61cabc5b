-- The read model of workflow runs (package projector owns the queries):
-- workflow_state is to workflows what operation_state is to operations.
-- The projector keeps it from effectline.workflows and rebuilds it from
-- workflow_events; GET /v1/workflows lists from it.
--
-- It is derived data: every row is the fold of one run's events up to seq
-- (events.ApplyWorkflow), so a row with a given (workflow_id, seq) is the
-- same whoever wrote it, and an upsert only ever replaces a row with one of
-- a higher seq. The consumer group's offsets are the checkpoint.
CREATE TABLE workflow_state (
    workflow_id  text        PRIMARY KEY,
    workflow     text        NOT NULL,
    status       text        NOT NULL,
    principal    text        NOT NULL,
    -- current_step and awaiting are "" when there is none, as in the record.
    current_step text        NOT NULL DEFAULT '',
    awaiting     text        NOT NULL DEFAULT '',
    seq          bigint      NOT NULL,
    -- record is the whole events.Workflow as JSON (input, steps, escalation,
    -- decisions): what the projector folds the next event onto and what the
    -- list answers, redacted by the API.
    record       jsonb       NOT NULL,
    -- traceparent is the trace the run was started in (its first event's).
    traceparent  text        NOT NULL DEFAULT '',
    -- created_at and updated_at come from the events (occurred_at), so a
    -- rebuild reproduces them; projected_at is when this row was last written.
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    projected_at timestamptz NOT NULL DEFAULT now()
);

-- Keyset paging, newest first, over every run, under a status, and under a
-- principal (the read rule narrows a principal that reads only its own
-- runs). The id breaks ties between runs created in the same microsecond.
CREATE INDEX workflow_state_created ON workflow_state (created_at, workflow_id);
CREATE INDEX workflow_state_status ON workflow_state (status, created_at, workflow_id);
CREATE INDEX workflow_state_principal ON workflow_state (principal, created_at, workflow_id);

-- Runs recorded before this migration are in the read model at once: the
-- head of a run is the same fold the projector computes, so the projector
-- takes over at the head's seq and skips the events already in it.
INSERT INTO workflow_state (workflow_id, workflow, status, principal, current_step, awaiting, seq, record,
                            traceparent, created_at, updated_at)
SELECT w.workflow_id, w.workflow, w.status, coalesce(w.record->>'principal', ''),
       coalesce(w.record->>'current_step', ''), coalesce(w.awaiting, ''), w.seq, w.record,
       coalesce((SELECT e.traceparent FROM workflow_events e WHERE e.workflow_id = w.workflow_id AND e.seq = 1), ''),
       w.created_at, w.updated_at
  FROM workflows w;

-- The list reads workflow_state now; workflows keeps the index its own
-- reads use (the driver's sweep) and drops the one the list used.
DROP INDEX workflows_status;
