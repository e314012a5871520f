-- The host-call journal and secrets (docs/DESIGN.md invariants 12 and 13).
--
-- host_calls: one row per host call an attempt made and recorded under its
-- fences (RecordHostCall). The rows of an event not set aside are its
-- journal proper, at most one per seq (the partial unique index
-- host_calls_live); a later attempt that diverges sets the rows from there
-- on aside, keeping them for the record. event_id references its event by
-- a bare id without a foreign key, like turns.event_id (00001's header:
-- written only inside the fenced transaction, which checks the event is
-- open in the statement that writes); the actor key does reference the
-- session. started_at is the host's clock (a record: AgentTokensSince
-- sums by it), created_at the database's.
--
-- turns gets the model-token usage of its event's journal, summed by
-- CommitTurn in the statement that inserts the turn.
--
-- secrets: values sealed by the host (the store never sees a plain one).

-- +goose Up
CREATE TABLE host_calls (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_uid      text        NOT NULL,
    session_id     text        NOT NULL,
    event_id       bigint      NOT NULL,
    seq            integer     NOT NULL CHECK (seq >= 1),
    actor_epoch    bigint      NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('http', 'model')),
    destination    text        NOT NULL,
    request_digest text        NOT NULL CHECK (request_digest <> ''),
    result         bytea       NOT NULL,
    error_code     text        NOT NULL DEFAULT '',
    status         integer     NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL,
    duration_ms    bigint      NOT NULL DEFAULT 0,
    input_tokens   bigint      NOT NULL DEFAULT 0,
    output_tokens  bigint      NOT NULL DEFAULT 0,
    replays        integer     NOT NULL DEFAULT 0,
    replayed_epoch bigint      NOT NULL DEFAULT 0,
    set_aside      boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

-- Invariant 12: one live journal row per (event, seq).
CREATE UNIQUE INDEX host_calls_live ON host_calls (event_id, seq) WHERE NOT set_aside;
-- HostCalls reads every row of an event, set-aside ones included.
CREATE INDEX host_calls_event ON host_calls (event_id, seq, id);
-- AgentTokensSince.
CREATE INDEX host_calls_agent_started ON host_calls (agent_uid, started_at);

ALTER TABLE turns
    ADD COLUMN input_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0;

CREATE TABLE secrets (
    name       text        NOT NULL PRIMARY KEY,
    sealed     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- +goose Down
DROP TABLE secrets;
ALTER TABLE turns DROP COLUMN output_tokens, DROP COLUMN input_tokens;
DROP TABLE host_calls;
