-- The durable lifecycle (docs/DESIGN.md "Failure, retry and crash policy"): sleep reasons and the pending
-- queue, steers attached to a turn in flight, redrives, the error chain of
-- every failed attempt, and alarms. Times are INTEGER unix milliseconds from
-- the database clock, as in 00001.

-- +goose Up
ALTER TABLE sessions ADD COLUMN sleep_reason TEXT;
ALTER TABLE sessions ADD COLUMN pending_since INTEGER;

-- steer_of: the event of the turn in flight a steer is attached to (NULL for
-- every other event); the steer closes with that turn.
ALTER TABLE actor_events ADD COLUMN steer_of INTEGER;
ALTER TABLE actor_events ADD COLUMN redrives INTEGER NOT NULL DEFAULT 0;

CREATE INDEX actor_events_dead_letter ON actor_events (agent_uid, event_id) WHERE status = 'dead_letter';
CREATE INDEX actor_events_steer ON actor_events (agent_uid, session_id, steer_of, seq) WHERE steer_of IS NOT NULL;

-- One row per failed attempt (counted or not): the event's error chain.
CREATE TABLE event_errors (
    agent_uid   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    event_id    INTEGER NOT NULL REFERENCES actor_events (event_id),
    attempt_seq INTEGER NOT NULL,
    -- attempt: the event's attempts after a counted failure, the unchanged
    -- attempts for an uncounted one.
    attempt     INTEGER NOT NULL,
    actor_epoch INTEGER NOT NULL,
    counted     INTEGER NOT NULL CHECK (counted IN (0, 1)),
    error       TEXT    NOT NULL,
    failed_at   INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, session_id, event_id, attempt_seq),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE alarms (
    agent_uid  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    due_at     INTEGER NOT NULL,
    every_ms   INTEGER NOT NULL DEFAULT 0,
    data       TEXT,
    set_at     INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, session_id, name),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX alarms_due ON alarms (due_at);

-- +goose Down
DROP INDEX alarms_due;
DROP TABLE alarms;
DROP TABLE event_errors;
DROP INDEX actor_events_steer;
DROP INDEX actor_events_dead_letter;
ALTER TABLE actor_events DROP COLUMN redrives;
ALTER TABLE actor_events DROP COLUMN steer_of;
ALTER TABLE sessions DROP COLUMN pending_since;
ALTER TABLE sessions DROP COLUMN sleep_reason;
