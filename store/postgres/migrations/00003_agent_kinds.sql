-- Agent kinds and plugin workers (docs/DESIGN.md "Workers"): an agent runs either a
-- wasm module (kind 'wasm', module_digest) or a registered plugin worker
-- (kind 'plugin', plugin). Existing agents become kind 'wasm' (the column
-- default; PostgreSQL 11+ adds it without rewriting the table).

-- +goose Up
CREATE TABLE plugin_workers (
    name       text        NOT NULL PRIMARY KEY,
    path       text        NOT NULL,
    sha256     text        NOT NULL,
    -- The plugin's whole environment: a JSON object of strings, stored as
    -- text like the sqlite driver's.
    env        text        NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(env::jsonb) = 'object'),
    processes  integer     NOT NULL CHECK (processes >= 1),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE agents
    ADD COLUMN kind text NOT NULL DEFAULT 'wasm' CHECK (kind IN ('wasm', 'plugin')),
    ADD COLUMN plugin text REFERENCES plugin_workers (name),
    ALTER COLUMN module_digest DROP NOT NULL,
    ADD CONSTRAINT agents_worker_binding CHECK (
        (kind = 'wasm' AND module_digest IS NOT NULL AND plugin IS NULL) OR
        (kind = 'plugin' AND plugin IS NOT NULL AND module_digest IS NULL));

-- +goose Down
-- Refused (module_digest contains null values) while a plugin agent exists.
ALTER TABLE agents
    DROP CONSTRAINT agents_worker_binding,
    ALTER COLUMN module_digest SET NOT NULL,
    DROP COLUMN plugin,
    DROP COLUMN kind;
DROP TABLE plugin_workers;
