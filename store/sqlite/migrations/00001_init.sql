-- Paddock store schema, SQLite dialect. Times are INTEGER unix milliseconds
-- taken from the database clock: CAST(unixepoch('subsec')*1000 AS INTEGER).
-- Every per-session table carries the actor key (agent_uid, session_id).

-- +goose Up
CREATE TABLE modules (
    digest      TEXT    NOT NULL PRIMARY KEY,
    abi_version INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    bytes       BLOB    NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE agents (
    agent_uid     TEXT    NOT NULL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    module_digest TEXT    NOT NULL REFERENCES modules (digest),
    crash_policy  TEXT    NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);

CREATE TABLE sessions (
    agent_uid      TEXT    NOT NULL REFERENCES agents (agent_uid),
    session_id     TEXT    NOT NULL,
    key            TEXT,
    input          BLOB,
    status         TEXT    NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'sleeping', 'destroyed')),
    crash_policy   TEXT    NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    actor_epoch    INTEGER NOT NULL DEFAULT 0,
    last_event_seq INTEGER NOT NULL DEFAULT 0,
    turn_count     INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL,
    sleep_ts       INTEGER,
    destroy_ts     INTEGER,
    PRIMARY KEY (agent_uid, session_id)
);

CREATE UNIQUE INDEX sessions_key ON sessions (agent_uid, key) WHERE key IS NOT NULL;

CREATE TABLE session_state (
    agent_uid  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    state      BLOB,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, session_id),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE actor_events (
    event_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_uid       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    kind            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    idempotency_key TEXT,
    status          TEXT    NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    binding         TEXT,
    accepted_at     INTEGER NOT NULL,
    closed_at       INTEGER,
    UNIQUE (agent_uid, session_id, seq),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE UNIQUE INDEX actor_events_idempotency ON actor_events (agent_uid, session_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- "Oldest open event of a session" (invariant 5) and RunnableSessions.
CREATE INDEX actor_events_open ON actor_events (agent_uid, session_id, seq) WHERE status = 'open';

CREATE TABLE activations (
    activation_uid   TEXT    NOT NULL PRIMARY KEY,
    agent_uid        TEXT    NOT NULL,
    session_id       TEXT    NOT NULL,
    actor_epoch      INTEGER NOT NULL,
    lease_id         TEXT    NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    current_event_id INTEGER REFERENCES actor_events (event_id),
    revision         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL
        CHECK (state IN ('starting', 'active', 'draining', 'stopped', 'failed')),
    host_id          TEXT    NOT NULL,
    created_at       INTEGER NOT NULL,
    ended_at         INTEGER,
    end_reason       TEXT,
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Invariant 1: at most one live activation per actor key, decided here.
CREATE UNIQUE INDEX activations_live ON activations (agent_uid, session_id)
    WHERE state IN ('starting', 'active', 'draining');
-- The watchdog's scan for expired leases.
CREATE INDEX activations_lease ON activations (lease_expires_at)
    WHERE state IN ('starting', 'active', 'draining');

CREATE TABLE deliveries (
    delivery_id    TEXT    NOT NULL PRIMARY KEY,
    agent_uid      TEXT    NOT NULL,
    session_id     TEXT    NOT NULL,
    activation_uid TEXT    NOT NULL REFERENCES activations (activation_uid),
    actor_epoch    INTEGER NOT NULL,
    event_id       INTEGER NOT NULL REFERENCES actor_events (event_id),
    revision       INTEGER NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('created', 'sent', 'accepted', 'send_failed', 'superseded')),
    binding        TEXT    NOT NULL DEFAULT '',
    created_at     INTEGER NOT NULL,
    sent_at        INTEGER,
    closed_at      INTEGER,
    error          TEXT,
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX deliveries_activation_event ON deliveries (activation_uid, event_id);

CREATE TABLE turns (
    agent_uid    TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    turn_no      INTEGER NOT NULL,
    -- Invariant 4: at most one commit per event.
    event_id     INTEGER NOT NULL UNIQUE REFERENCES actor_events (event_id),
    delivery_id  TEXT    NOT NULL,
    actor_epoch  INTEGER NOT NULL,
    outcome      TEXT    NOT NULL,
    committed_at INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, session_id, turn_no),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE messages (
    agent_uid  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    turn_no    INTEGER NOT NULL,
    idx        INTEGER NOT NULL,
    role       TEXT    NOT NULL,
    content    TEXT    NOT NULL,
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
