-- Paddock store schema, PostgreSQL dialect. Times are timestamptz taken from
-- the database clock, clock_timestamp() (not now(), which is the start of the
-- transaction). Every per-session table carries the actor key
-- (agent_uid, session_id) so that the store can be sharded by it.
--
-- Foreign keys: only those that carry the actor key (to sessions, and
-- messages to turns), which a store sharded by actor key (Citus) can keep.
-- References by a bare id (deliveries.activation_uid, deliveries.event_id,
-- turns.event_id, activations.current_event_id) are written only inside the
-- fenced transactions, which read the referenced row under lock first; a
-- foreign key there would cost a lookup and a KEY SHARE lock per write on
-- the turn path (measured: ~150 us of server time per turn, ~10%) and could
-- not be kept by a store sharded by actor key.

-- +goose Up
CREATE TABLE modules (
    digest      text        NOT NULL PRIMARY KEY,
    abi_version integer     NOT NULL,
    size        bigint      NOT NULL,
    bytes       bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE agents (
    agent_uid     text        NOT NULL PRIMARY KEY,
    name          text        NOT NULL UNIQUE,
    module_digest text        NOT NULL REFERENCES modules (digest),
    crash_policy  text        NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE sessions (
    agent_uid      text        NOT NULL REFERENCES agents (agent_uid),
    session_id     text        NOT NULL,
    key            text,
    input          bytea,
    status         text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'sleeping', 'destroyed')),
    crash_policy   text        NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    -- The highest epoch issued for this actor key (invariant 2).
    actor_epoch    bigint      NOT NULL DEFAULT 0,
    last_event_seq bigint      NOT NULL DEFAULT 0,
    turn_count     bigint      NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    sleep_ts       timestamptz,
    destroy_ts     timestamptz,
    PRIMARY KEY (agent_uid, session_id)
);

CREATE UNIQUE INDEX sessions_key ON sessions (agent_uid, key) WHERE key IS NOT NULL;

CREATE TABLE session_state (
    agent_uid  text        NOT NULL,
    session_id text        NOT NULL,
    state      bytea,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (agent_uid, session_id),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE actor_events (
    event_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_uid       text        NOT NULL,
    session_id      text        NOT NULL,
    -- Acceptance order within the session, assigned under the session row
    -- lock from sessions.last_event_seq.
    seq             bigint      NOT NULL,
    kind            text        NOT NULL,
    -- The signal body, stored verbatim (text, not jsonb, which would
    -- normalise it).
    payload         text        NOT NULL,
    idempotency_key text,
    status          text        NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_error      text,
    binding         text,
    accepted_at     timestamptz NOT NULL,
    closed_at       timestamptz,
    UNIQUE (agent_uid, session_id, seq),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Invariant 7: one event per idempotency key and session.
CREATE UNIQUE INDEX actor_events_idempotency ON actor_events (agent_uid, session_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- "Oldest open event of a session" (invariant 5), open counts, RunnableSessions.
CREATE INDEX actor_events_open ON actor_events (agent_uid, session_id, seq) WHERE status = 'open';

CREATE TABLE activations (
    activation_uid   text        NOT NULL PRIMARY KEY,
    agent_uid        text        NOT NULL,
    session_id       text        NOT NULL,
    actor_epoch      bigint      NOT NULL,
    lease_id         text        NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    current_event_id bigint,
    revision         bigint      NOT NULL DEFAULT 0,
    state            text        NOT NULL
        CHECK (state IN ('starting', 'active', 'draining', 'stopped', 'failed')),
    host_id          text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at         timestamptz,
    end_reason       text,
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Invariant 1: at most one live activation per actor key, decided here
-- (ClaimActivation names this index as its ON CONFLICT arbiter).
CREATE UNIQUE INDEX activations_live ON activations (agent_uid, session_id)
    WHERE state IN ('starting', 'active', 'draining');
-- The watchdog's scan for expired leases.
CREATE INDEX activations_lease ON activations (lease_expires_at)
    WHERE state IN ('starting', 'active', 'draining');

CREATE TABLE deliveries (
    delivery_id    text        NOT NULL PRIMARY KEY,
    agent_uid      text        NOT NULL,
    session_id     text        NOT NULL,
    activation_uid text        NOT NULL,
    actor_epoch    bigint      NOT NULL,
    event_id       bigint      NOT NULL,
    revision       bigint      NOT NULL,
    state          text        NOT NULL
        CHECK (state IN ('created', 'sent', 'accepted', 'send_failed', 'superseded')),
    binding        text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at        timestamptz,
    closed_at      timestamptz,
    error          text,
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX deliveries_activation_event ON deliveries (activation_uid, event_id);

CREATE TABLE turns (
    agent_uid    text        NOT NULL,
    session_id   text        NOT NULL,
    turn_no      bigint      NOT NULL,
    -- Invariant 4: at most one commit per event.
    event_id     bigint      NOT NULL UNIQUE,
    delivery_id  text        NOT NULL,
    actor_epoch  bigint      NOT NULL,
    outcome      text        NOT NULL,
    committed_at timestamptz NOT NULL,
    PRIMARY KEY (agent_uid, session_id, turn_no),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE messages (
    agent_uid  text    NOT NULL,
    session_id text    NOT NULL,
    turn_no    bigint  NOT NULL,
    idx        integer NOT NULL,
    role       text    NOT NULL,
    content    text    NOT NULL,
    PRIMARY KEY (agent_uid, session_id, turn_no, idx),
    FOREIGN KEY (agent_uid, session_id, turn_no) REFERENCES turns (agent_uid, session_id, turn_no)
);

-- +goose Down
DROP TABLE messages;
DROP TABLE turns;
DROP TABLE deliveries;
DROP TABLE activations;
DROP TABLE actor_events;
DROP TABLE session_state;
DROP TABLE sessions;
DROP TABLE agents;
DROP TABLE modules;
