-- The host-call journal and secrets (docs/DESIGN.md invariants 12 and 13).
--
-- host_calls: one row per host call an attempt made and recorded under its
-- fences (RecordHostCall). The rows of an event not set aside are its
-- journal proper, at most one per seq (the partial unique index
-- host_calls_live); a later attempt that diverges sets the rows from there
-- on aside, keeping them for the record. started_at is the host's clock (a
-- record: AgentTokensSince sums by it), created_at the database's; both
-- INTEGER unix milliseconds.
--
-- turns gets the model-token usage of its event's journal, summed by
-- CommitTurn. New tables and added columns with defaults: no table
-- rebuild.
--
-- secrets: values sealed by the host (the store never sees a plain one).

-- +goose Up
CREATE TABLE host_calls (
    id             INTEGER PRIMARY KEY,
    agent_uid      TEXT    NOT NULL,
    session_id     TEXT    NOT NULL,
    event_id       INTEGER NOT NULL REFERENCES actor_events (event_id),
    seq            INTEGER NOT NULL CHECK (seq >= 1),
    actor_epoch    INTEGER NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('http', 'model')),
    destination    TEXT    NOT NULL,
    request_digest TEXT    NOT NULL CHECK (request_digest <> ''),
    result         BLOB    NOT NULL,
    error_code     TEXT    NOT NULL DEFAULT '',
    status         INTEGER NOT NULL DEFAULT 0,
    started_at     INTEGER NOT NULL,
    duration_ms    INTEGER NOT NULL DEFAULT 0,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    replays        INTEGER NOT NULL DEFAULT 0,
    replayed_epoch INTEGER NOT NULL DEFAULT 0,
    set_aside      INTEGER NOT NULL DEFAULT 0 CHECK (set_aside IN (0, 1)),
    created_at     INTEGER NOT NULL,
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Invariant 12: one live journal row per (event, seq).
CREATE UNIQUE INDEX host_calls_live ON host_calls (event_id, seq) WHERE set_aside = 0;
-- HostCalls reads every row of an event, set-aside ones included.
CREATE INDEX host_calls_event ON host_calls (event_id, seq, id);
-- AgentTokensSince.
CREATE INDEX host_calls_agent_started ON host_calls (agent_uid, started_at);

ALTER TABLE turns ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;

CREATE TABLE secrets (
    name       TEXT    NOT NULL PRIMARY KEY,
    sealed     BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- +goose Down
DROP TABLE secrets;
ALTER TABLE turns DROP COLUMN output_tokens;
ALTER TABLE turns DROP COLUMN input_tokens;
DROP TABLE host_calls;
