-- events.event_id held a UUID under a unique constraint. The contract asks
-- producers for a non-empty event id, nothing more, and effectline cannot
-- stop a producer from reusing one; either way the intent's first append
-- failed for good (a type error or a unique violation), so the message came
-- back forever and stalled its partition. Nothing reads events by event_id:
-- (operation_key, seq) identifies an event and is what consumers deduplicate
-- by. The id is kept as the producer wrote it, and appends lose an index.
ALTER TABLE events DROP CONSTRAINT events_event_id_key;
ALTER TABLE events ALTER COLUMN event_id TYPE text;
