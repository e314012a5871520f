-- The CHECK constraints of the tables every turn writes become domains.
-- PostgreSQL re-reads a table's CHECK constraints from their text form
-- (stringToNode), plans and compiles them once per statement that inserts
-- into or updates the table, and evaluates all of them on every UPDATE,
-- whichever columns it sets. A turn is about four statements writing seven
-- tables, and a profile of the bench's pipe backend put that re-reading
-- and planning at 5-8 % of its CPU. A domain's constraint is read and
-- planned once per backend (the type cache) and checked only where a value
-- of the column is assigned: the lease renewal, which sets no state, checks
-- none. The rules are unchanged (docs/DESIGN.md "What a turn costs").

-- +goose Up
CREATE DOMAIN session_status AS text CHECK (VALUE IN ('active', 'sleeping', 'destroyed'));
CREATE DOMAIN crash_policy AS text CHECK (VALUE IN ('restart', 'sleep', 'destroy'));
CREATE DOMAIN event_status AS text CHECK (VALUE IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded'));
CREATE DOMAIN traceparent AS text CHECK (length(VALUE) <= 256);
CREATE DOMAIN activation_state AS text CHECK (VALUE IN ('starting', 'active', 'draining', 'stopped', 'failed'));
CREATE DOMAIN delivery_state AS text CHECK (VALUE IN ('created', 'sent', 'accepted', 'send_failed', 'superseded'));
CREATE DOMAIN stream_seq AS bigint CHECK (VALUE >= 1);
ALTER TABLE sessions DROP CONSTRAINT sessions_crash_policy_check, DROP CONSTRAINT sessions_status_check,
    ALTER COLUMN status TYPE session_status, ALTER COLUMN crash_policy TYPE crash_policy;
ALTER TABLE actor_events DROP CONSTRAINT actor_events_status_check, DROP CONSTRAINT actor_events_traceparent_check,
    ALTER COLUMN status TYPE event_status, ALTER COLUMN traceparent TYPE traceparent;
ALTER TABLE activations DROP CONSTRAINT activations_state_check, ALTER COLUMN state TYPE activation_state;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check, ALTER COLUMN state TYPE delivery_state;
ALTER TABLE stream_frames DROP CONSTRAINT stream_frames_seq_check, ALTER COLUMN seq TYPE stream_seq;
ALTER TABLE stream_heads DROP CONSTRAINT stream_heads_last_seq_check, ALTER COLUMN last_seq TYPE stream_seq;

-- +goose Down
ALTER TABLE stream_heads ALTER COLUMN last_seq TYPE bigint,
    ADD CONSTRAINT stream_heads_last_seq_check CHECK (last_seq >= 1);
ALTER TABLE stream_frames ALTER COLUMN seq TYPE bigint, ADD CONSTRAINT stream_frames_seq_check CHECK (seq >= 1);
ALTER TABLE deliveries ALTER COLUMN state TYPE text, ADD CONSTRAINT deliveries_state_check
    CHECK (state IN ('created', 'sent', 'accepted', 'send_failed', 'superseded'));
ALTER TABLE activations ALTER COLUMN state TYPE text, ADD CONSTRAINT activations_state_check
    CHECK (state IN ('starting', 'active', 'draining', 'stopped', 'failed'));
ALTER TABLE actor_events ALTER COLUMN status TYPE text, ALTER COLUMN traceparent TYPE text,
    ADD CONSTRAINT actor_events_status_check CHECK (status IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded')),
    ADD CONSTRAINT actor_events_traceparent_check CHECK (length(traceparent) <= 256);
ALTER TABLE sessions ALTER COLUMN status TYPE text, ALTER COLUMN crash_policy TYPE text,
    ADD CONSTRAINT sessions_status_check CHECK (status IN ('active', 'sleeping', 'destroyed')),
    ADD CONSTRAINT sessions_crash_policy_check CHECK (crash_policy IN ('restart', 'sleep', 'destroy'));
DROP DOMAIN stream_seq;
DROP DOMAIN delivery_state;
DROP DOMAIN activation_state;
DROP DOMAIN traceparent;
DROP DOMAIN event_status;
DROP DOMAIN crash_policy;
DROP DOMAIN session_status;
