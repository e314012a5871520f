-- The web console's reads (SQLite dialect of postgres/migrations/00008_console.sql) (docs/DESIGN.md "The web console"; store/console.go).
--
-- agent_versions: one row per version of an agent's definition, appended by
-- CreateAgent in the agent's own transaction when store.NewAgentVersion
-- says the definition changed. Existing agents get their current
-- definition as version 1.
--
-- The sessions_browse_* indexes make each filter of BrowseSessions one
-- index range in (agent_uid, session_id) order, keyset-paged. None covers a
-- column the turn path updates (turn_count, last_event_seq,
-- last_frame_seq), so a turn's session update touches none of them;
-- status, sleep_reason and pending_since change on sleep, wake and pending
-- only. Times are unix milliseconds, as in 00001.
-- activations_key_epoch serves CurrentActivation (one row per claim, not
-- per turn); turns_committed_at the overview's turns of the last minute
-- (one more index entry per committed turn).

-- +goose Up
CREATE TABLE agent_versions (
    agent_uid     TEXT        NOT NULL REFERENCES agents (agent_uid),
    -- Per agent from 1.
    version       INTEGER      NOT NULL,
    kind          TEXT        NOT NULL CHECK (kind IN ('wasm', 'plugin')),
    module_digest TEXT,
    plugin        TEXT,
    crash_policy  TEXT        NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, version)
);

INSERT INTO agent_versions (agent_uid, version, kind, module_digest, plugin, crash_policy, created_at)
SELECT agent_uid, 1, kind, module_digest, plugin, crash_policy, updated_at FROM agents;

CREATE INDEX sessions_browse_status ON sessions (status, agent_uid, session_id);
CREATE INDEX sessions_browse_sleep_reason ON sessions (sleep_reason, agent_uid, session_id) WHERE status = 'sleeping';
CREATE INDEX sessions_browse_pending ON sessions (agent_uid, session_id)
    WHERE pending_since IS NOT NULL AND status <> 'destroyed';
CREATE INDEX sessions_browse_key ON sessions (key, agent_uid, session_id) WHERE key IS NOT NULL;
CREATE INDEX activations_key_epoch ON activations (agent_uid, session_id, actor_epoch);
CREATE INDEX turns_committed_at ON turns (committed_at);

-- +goose Down
DROP INDEX turns_committed_at;
DROP INDEX activations_key_epoch;
DROP INDEX sessions_browse_key;
DROP INDEX sessions_browse_pending;
DROP INDEX sessions_browse_sleep_reason;
DROP INDEX sessions_browse_status;
DROP TABLE agent_versions;
