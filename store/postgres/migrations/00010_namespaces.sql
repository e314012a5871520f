-- Namespaces (docs/DESIGN.md "Namespaces"). Every agent, plugin worker and
-- secret belongs to a namespace; every row that exists is in 'default'
-- (the column default: PostgreSQL 11+ adds it without rewriting a table).
--
-- agents: names unique per namespace (agents_namespace_name_key instead of
-- agents_name_key); a plugin agent's plugin worker is of its namespace
-- (agents_plugin_fkey on (namespace, plugin)); a wasm agent's module is
-- visible in its namespace (agents_module_visible_fkey to
-- module_namespaces). plugin_workers and secrets: keyed by (namespace,
-- name). module_namespaces: a module is stored once by digest and visible
-- in each namespace it was uploaded to (created_at: the first upload
-- there); existing modules are visible in 'default'.

-- +goose Up
CREATE TABLE module_namespaces (
    namespace  text        NOT NULL,
    digest     text        NOT NULL REFERENCES modules (digest),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (namespace, digest)
);

INSERT INTO module_namespaces (namespace, digest, created_at)
SELECT 'default', digest, created_at FROM modules;

ALTER TABLE agents DROP CONSTRAINT agents_plugin_fkey;

ALTER TABLE plugin_workers
    ADD COLUMN namespace text NOT NULL DEFAULT 'default',
    DROP CONSTRAINT plugin_workers_pkey,
    ADD PRIMARY KEY (namespace, name);

ALTER TABLE agents
    ADD COLUMN namespace text NOT NULL DEFAULT 'default',
    DROP CONSTRAINT agents_name_key,
    ADD CONSTRAINT agents_namespace_name_key UNIQUE (namespace, name),
    ADD CONSTRAINT agents_plugin_fkey FOREIGN KEY (namespace, plugin) REFERENCES plugin_workers (namespace, name),
    ADD CONSTRAINT agents_module_visible_fkey FOREIGN KEY (namespace, module_digest)
        REFERENCES module_namespaces (namespace, digest);

ALTER TABLE secrets
    ADD COLUMN namespace text NOT NULL DEFAULT 'default',
    DROP CONSTRAINT secrets_pkey,
    ADD PRIMARY KEY (namespace, name);

-- +goose Down
-- Refused (duplicate key) while two namespaces hold an agent, plugin
-- worker or secret of the same name.
ALTER TABLE secrets
    DROP CONSTRAINT secrets_pkey,
    DROP COLUMN namespace,
    ADD PRIMARY KEY (name);

ALTER TABLE agents
    DROP CONSTRAINT agents_module_visible_fkey,
    DROP CONSTRAINT agents_plugin_fkey,
    DROP CONSTRAINT agents_namespace_name_key,
    DROP COLUMN namespace,
    ADD CONSTRAINT agents_name_key UNIQUE (name);

ALTER TABLE plugin_workers
    DROP CONSTRAINT plugin_workers_pkey,
    DROP COLUMN namespace,
    ADD PRIMARY KEY (name);

ALTER TABLE agents ADD CONSTRAINT agents_plugin_fkey FOREIGN KEY (plugin) REFERENCES plugin_workers (name);

DROP TABLE module_namespaces;
