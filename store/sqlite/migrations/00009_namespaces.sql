-- Namespaces (docs/DESIGN.md "Namespaces"; SQLite dialect of
-- postgres/migrations/00010_namespaces.sql). Every agent, plugin worker and
-- secret belongs to a namespace; every row that exists is in 'default'.
--
-- agents: namespace, names unique per namespace (UNIQUE (namespace, name)
-- instead of UNIQUE (name)); a plugin agent's plugin worker is of its
-- namespace (FOREIGN KEY (namespace, plugin)); a wasm agent's module is
-- visible in its namespace (FOREIGN KEY (namespace, module_digest) to
-- module_namespaces). plugin_workers and secrets: keyed by (namespace,
-- name). module_namespaces: a module is stored once by digest and visible
-- in each namespace it was uploaded to (created_at: the first upload
-- there); existing modules are visible in 'default'.
--
-- Constraints cannot be changed in place, so the three tables are rebuilt
-- as 00003_agent_kinds did it (foreign keys off around the rebuild, which
-- is a no-op inside a transaction: NO TRANSACTION and an explicit BEGIN ...
-- COMMIT, all or nothing). sessions, agent_versions and the other
-- children still say REFERENCES agents (agent_uid): after the rename they
-- name the rebuilt table.

-- +goose NO TRANSACTION
-- +goose Up
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE module_namespaces (
    namespace  TEXT    NOT NULL,
    digest     TEXT    NOT NULL REFERENCES modules (digest),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, digest)
);

INSERT INTO module_namespaces (namespace, digest, created_at)
SELECT 'default', digest, created_at FROM modules;

CREATE TABLE plugin_workers_new (
    namespace  TEXT    NOT NULL DEFAULT 'default',
    name       TEXT    NOT NULL,
    path       TEXT    NOT NULL,
    sha256     TEXT    NOT NULL,
    -- The plugin's whole environment: a JSON object of strings.
    env        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(env) AND json_type(env) = 'object'),
    processes  INTEGER NOT NULL CHECK (processes >= 1),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);

INSERT INTO plugin_workers_new (namespace, name, path, sha256, env, processes, created_at, updated_at)
SELECT 'default', name, path, sha256, env, processes, created_at, updated_at FROM plugin_workers ORDER BY rowid;

DROP TABLE plugin_workers;

ALTER TABLE plugin_workers_new RENAME TO plugin_workers;

CREATE TABLE agents_new (
    agent_uid     TEXT    NOT NULL PRIMARY KEY,
    namespace     TEXT    NOT NULL DEFAULT 'default',
    name          TEXT    NOT NULL,
    module_digest TEXT    REFERENCES modules (digest),
    crash_policy  TEXT    NOT NULL CHECK (crash_policy IN ('restart', 'sleep', 'destroy')),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    kind          TEXT    NOT NULL DEFAULT 'wasm' CHECK (kind IN ('wasm', 'plugin')),
    plugin        TEXT,
    CONSTRAINT agents_worker_binding CHECK (
        (kind = 'wasm' AND module_digest IS NOT NULL AND plugin IS NULL) OR
        (kind = 'plugin' AND plugin IS NOT NULL AND module_digest IS NULL)),
    CONSTRAINT agents_namespace_name UNIQUE (namespace, name),
    CONSTRAINT agents_plugin FOREIGN KEY (namespace, plugin) REFERENCES plugin_workers (namespace, name),
    CONSTRAINT agents_module_visible FOREIGN KEY (namespace, module_digest)
        REFERENCES module_namespaces (namespace, digest)
);

INSERT INTO agents_new (agent_uid, namespace, name, module_digest, crash_policy, created_at, updated_at, kind, plugin)
SELECT agent_uid, 'default', name, module_digest, crash_policy, created_at, updated_at, kind, plugin
FROM agents ORDER BY rowid;

DROP TABLE agents;

ALTER TABLE agents_new RENAME TO agents;

CREATE TABLE secrets_new (
    namespace  TEXT    NOT NULL DEFAULT 'default',
    name       TEXT    NOT NULL,
    sealed     BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);

INSERT INTO secrets_new (namespace, name, sealed, created_at, updated_at)
SELECT 'default', name, sealed, created_at, updated_at FROM secrets ORDER BY rowid;

DROP TABLE secrets;

ALTER TABLE secrets_new RENAME TO secrets;

COMMIT;

PRAGMA foreign_keys = ON;

-- +goose Down
-- Refused (UNIQUE constraint failed) while two namespaces hold an agent,
-- plugin worker or secret of the same name; everything else returns to the
-- one namespace.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

-- secrets gets back 00005's statement text (not a renamed table's): its
-- rows go through a copy.
CREATE TABLE secrets_old AS SELECT name, sealed, created_at, updated_at FROM secrets ORDER BY rowid;

DROP TABLE secrets;

CREATE TABLE secrets (
    name       TEXT    NOT NULL PRIMARY KEY,
    sealed     BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

INSERT INTO secrets (name, sealed, created_at, updated_at)
SELECT name, sealed, created_at, updated_at FROM secrets_old ORDER BY rowid;

DROP TABLE secrets_old;

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
SELECT agent_uid, name, module_digest, crash_policy, created_at, updated_at, kind, plugin
FROM agents ORDER BY rowid;

DROP TABLE agents;

ALTER TABLE agents_new RENAME TO agents;

CREATE TABLE plugin_workers_new (
    name       TEXT    NOT NULL PRIMARY KEY,
    path       TEXT    NOT NULL,
    sha256     TEXT    NOT NULL,
    env        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(env) AND json_type(env) = 'object'),
    processes  INTEGER NOT NULL CHECK (processes >= 1),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

INSERT INTO plugin_workers_new (name, path, sha256, env, processes, created_at, updated_at)
SELECT name, path, sha256, env, processes, created_at, updated_at FROM plugin_workers ORDER BY rowid;

DROP TABLE plugin_workers;

ALTER TABLE plugin_workers_new RENAME TO plugin_workers;

DROP TABLE module_namespaces;

COMMIT;

PRAGMA foreign_keys = ON;
