-- A destroyed session's key is free again (Rivet's rule): get-or-create
-- and create of that key make a new session. The partial unique index on
-- (agent_uid, key) now covers only sessions that are not destroyed; a
-- destroyed session keeps its key for the record. CreateSession's
-- ON CONFLICT names the same predicate.
--
-- The Down restores the index over every keyed session; it fails when a
-- destroyed key was reused meanwhile (two sessions of an agent with one
-- key), which is the data the old rule cannot hold.

-- +goose Up
DROP INDEX sessions_key;
CREATE UNIQUE INDEX sessions_key ON sessions (agent_uid, key) WHERE key IS NOT NULL AND status <> 'destroyed';

-- +goose Down
DROP INDEX sessions_key;
CREATE UNIQUE INDEX sessions_key ON sessions (agent_uid, key) WHERE key IS NOT NULL;
