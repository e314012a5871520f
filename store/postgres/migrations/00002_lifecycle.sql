-- The durable lifecycle (docs/DESIGN.md "Failure, retry and crash policy"): crash policies, sleep/wake, dead
-- letters with their error chains, redrive/discard, steering, cancellation
-- and alarms. Times are clock_timestamp(), as in 00001.
--
-- turns.outcome has no CHECK, so 'cancelled' (store.OutcomeCancelled) needs
-- no change; a cancelled turn's delivery_id is '' when no delivery was live.

-- +goose Up
ALTER TABLE sessions
    -- Why the session sleeps: crash, capacity, pending timeout, agent.
    ADD COLUMN sleep_reason  text,
    -- Set while the session waits for capacity on a host.
    ADD COLUMN pending_since timestamptz;

ALTER TABLE actor_events
    -- For a steer attached to a turn in flight: the event that turn
    -- handles; the steer closes with it.
    ADD COLUMN steer_of bigint,
    ADD COLUMN redrives integer NOT NULL DEFAULT 0;

-- ListDeadLetters of an agent, by event id.
CREATE INDEX actor_events_dead_letter ON actor_events (agent_uid, event_id) WHERE status = 'dead_letter';
-- Per session: the dead-letter count, ListDeadLetters of a session and the
-- "block" policy's "a dead letter before the candidate" check.
CREATE INDEX actor_events_dead_letter_seq ON actor_events (agent_uid, session_id, seq)
    WHERE status = 'dead_letter';
-- The steers attached to an event (rare: a partial index stays tiny).
CREATE INDEX actor_events_steers ON actor_events (agent_uid, session_id, steer_of) WHERE steer_of IS NOT NULL;

-- One row per failed attempt of an event, counted or not: its error chain.
CREATE TABLE event_errors (
    agent_uid   text        NOT NULL,
    session_id  text        NOT NULL,
    event_id    bigint      NOT NULL,
    -- Position in the chain, per event from 1 (a redrive resets attempts,
    -- not this).
    attempt_seq integer     NOT NULL,
    -- The event's attempts after a counted failure; its current attempts
    -- for an uncounted one.
    attempt     integer     NOT NULL,
    actor_epoch bigint      NOT NULL,
    counted     boolean     NOT NULL,
    error       text        NOT NULL,
    failed_at   timestamptz NOT NULL,
    PRIMARY KEY (agent_uid, session_id, event_id, attempt_seq),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Durable timers of a session, set by CommitTurn, fired by FireDueAlarms.
CREATE TABLE alarms (
    agent_uid  text        NOT NULL,
    session_id text        NOT NULL,
    name       text        NOT NULL,
    due_at     timestamptz NOT NULL,
    -- Repeat period; 0 for a one-shot alarm.
    every_ms   bigint      NOT NULL DEFAULT 0,
    -- What the agent attached (JSON, stored verbatim).
    data       text,
    set_at     timestamptz NOT NULL,
    PRIMARY KEY (agent_uid, session_id, name),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX alarms_due ON alarms (due_at);

-- +goose Down
DROP TABLE alarms;
DROP TABLE event_errors;
DROP INDEX actor_events_steers;
DROP INDEX actor_events_dead_letter_seq;
DROP INDEX actor_events_dead_letter;
ALTER TABLE actor_events DROP COLUMN redrives, DROP COLUMN steer_of;
ALTER TABLE sessions DROP COLUMN pending_since, DROP COLUMN sleep_reason;
