-- Agent kinds and plugin workers (docs/DESIGN.md "Workers"): an agent runs either a
-- wasm module (kind 'wasm', module_digest) or a registered plugin worker
-- (kind 'plugin', plugin). Existing agents become kind 'wasm'.
--
-- agents.module_digest loses its NOT NULL, which SQLite cannot do in place,
-- so the table is rebuilt (https://sqlite.org/lang_altertable.html#otheralter).
-- Dropping a parent table while foreign keys are enforced would delete its
-- rows under the children's references, and renaming a table with them
-- enforced rewrites the children's REFERENCES clauses; so foreign keys are
-- switched off around the rebuild. That pragma is a no-op inside a
-- transaction, hence NO TRANSACTION and an explicit BEGIN ... COMMIT: the
-- rebuild is still all or nothing.
--
-- The Up is safe to run again after a crash between its COMMIT and goose's
-- version row (the only statements outside the transaction are pragmas):
-- plugin_workers is created IF NOT EXISTS, and the copy reads only columns
-- that both shapes of agents have (no plugin agent can exist yet then).

-- +goose NO TRANSACTION
-- +goose Up
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE IF NOT EXISTS plugin_workers (
    name       TEXT    NOT NULL PRIMARY KEY,
    path       TEXT    NOT NULL,
    sha256     TEXT    NOT NULL,
    -- The plugin's whole environment: a JSON object of strings.
    env        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(env) AND json_type(env) = 'object'),
    processes  INTEGER NOT NULL CHECK (processes >= 1),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE agents_new (
    agent_uid     TEXT    NOT NULL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    module_digest TEXT    REFERENCES modules (digest),
    crash_policy  TEXT    NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    kind          TEXT    NOT NULL DEFAULT 'wasm' CHECK (kind IN ('wasm', 'plugin')),
    plugin        TEXT    REFERENCES plugin_workers (name),
    CONSTRAINT agents_worker_binding CHECK (
        (kind = 'wasm' AND module_digest IS NOT NULL AND plugin IS NULL) OR
        (kind = 'plugin' AND plugin IS NOT NULL AND module_digest IS NULL))
);

INSERT INTO agents_new (agent_uid, name, module_digest, crash_policy, created_at, updated_at, kind, plugin)
SELECT agent_uid, name, module_digest, crash_policy, created_at, updated_at, 'wasm', NULL
FROM agents ORDER BY rowid;

DROP TABLE agents;

-- sessions still says REFERENCES agents (agent_uid): it now names this table.
ALTER TABLE agents_new RENAME TO agents;

COMMIT;

PRAGMA foreign_keys = ON;

-- +goose Down
-- Refused (NOT NULL constraint failed: agents_new.module_digest) while a
-- plugin agent exists: its sessions would lose their agent.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE agents_new (
    agent_uid     TEXT    NOT NULL PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    module_digest TEXT    NOT NULL REFERENCES modules (digest),
    crash_policy  TEXT    NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);

INSERT INTO agents_new (agent_uid, name, module_digest, crash_policy, created_at, updated_at)
SELECT agent_uid, name, module_digest, crash_policy, created_at, updated_at
FROM agents ORDER BY rowid;

DROP TABLE agents;

ALTER TABLE agents_new RENAME TO agents;

DROP TABLE plugin_workers;

COMMIT;

PRAGMA foreign_keys = ON;
