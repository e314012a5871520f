-- The CHECK constraints of the tables every turn writes — and of the
-- journal and the waits, which a turn with host calls or a wait writes —
-- become domains. PostgreSQL re-reads a table's CHECK constraints from
-- their text form (stringToNode), plans and compiles them once per
-- statement that inserts into or updates the table, and evaluates all of
-- them on every UPDATE, whichever columns it sets. A turn is about four
-- statements writing seven tables, and a profile of the bench's pipe
-- backend put that re-reading and planning at 6-8 % of its CPU. A domain's
-- constraint is read and planned once per connection (the type cache) and
-- checked only where a value of the column is assigned: the lease
-- renewal, which sets no state, checks none. The rules are unchanged
-- (docs/DESIGN.md "State machines").
--
-- The upgrade rewrites no table: each column moves to its domain while
-- the domain has no constraint yet (binary-coercible, so only the indexes
-- that name the column are rebuilt), then the domain's check is added NOT
-- VALID and validated (one scan of each table, no rewrite), and only then
-- is the table's CHECK dropped: no moment without the rule.

-- +goose Up
CREATE DOMAIN session_status AS text;
CREATE DOMAIN crash_policy AS text;
CREATE DOMAIN event_status AS text;
CREATE DOMAIN traceparent AS text;
CREATE DOMAIN activation_state AS text;
CREATE DOMAIN delivery_state AS text;
CREATE DOMAIN stream_seq AS bigint;
CREATE DOMAIN journal_seq AS integer;
CREATE DOMAIN host_call_kind AS text;
CREATE DOMAIN request_digest AS text;
CREATE DOMAIN wait_kind AS text;
CREATE DOMAIN wait_status AS text;
ALTER TABLE sessions ALTER COLUMN status TYPE session_status;
ALTER TABLE sessions ALTER COLUMN crash_policy TYPE crash_policy;
ALTER TABLE actor_events ALTER COLUMN status TYPE event_status;
ALTER TABLE actor_events ALTER COLUMN traceparent TYPE traceparent;
ALTER TABLE activations ALTER COLUMN state TYPE activation_state;
ALTER TABLE deliveries ALTER COLUMN state TYPE delivery_state;
ALTER TABLE stream_frames ALTER COLUMN seq TYPE stream_seq;
ALTER TABLE stream_heads ALTER COLUMN last_seq TYPE stream_seq;
ALTER TABLE host_calls ALTER COLUMN seq TYPE journal_seq;
ALTER TABLE host_calls ALTER COLUMN kind TYPE host_call_kind;
ALTER TABLE host_calls ALTER COLUMN request_digest TYPE request_digest;
ALTER TABLE waits ALTER COLUMN kind TYPE wait_kind;
ALTER TABLE waits ALTER COLUMN status TYPE wait_status;
ALTER DOMAIN session_status ADD CONSTRAINT session_status_check CHECK (VALUE IN ('active', 'sleeping', 'destroyed')) NOT VALID;
ALTER DOMAIN session_status VALIDATE CONSTRAINT session_status_check;
ALTER DOMAIN crash_policy ADD CONSTRAINT crash_policy_check CHECK (VALUE IN ('restart', 'sleep', 'destroy')) NOT VALID;
ALTER DOMAIN crash_policy VALIDATE CONSTRAINT crash_policy_check;
ALTER DOMAIN event_status ADD CONSTRAINT event_status_check CHECK (VALUE IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded')) NOT VALID;
ALTER DOMAIN event_status VALIDATE CONSTRAINT event_status_check;
ALTER DOMAIN traceparent ADD CONSTRAINT traceparent_check CHECK (length(VALUE) <= 256) NOT VALID;
ALTER DOMAIN traceparent VALIDATE CONSTRAINT traceparent_check;
ALTER DOMAIN activation_state ADD CONSTRAINT activation_state_check CHECK (VALUE IN ('starting', 'active', 'draining', 'stopped', 'failed')) NOT VALID;
ALTER DOMAIN activation_state VALIDATE CONSTRAINT activation_state_check;
ALTER DOMAIN delivery_state ADD CONSTRAINT delivery_state_check CHECK (VALUE IN ('created', 'sent', 'accepted', 'send_failed', 'superseded')) NOT VALID;
ALTER DOMAIN delivery_state VALIDATE CONSTRAINT delivery_state_check;
ALTER DOMAIN stream_seq ADD CONSTRAINT stream_seq_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN stream_seq VALIDATE CONSTRAINT stream_seq_check;
ALTER DOMAIN journal_seq ADD CONSTRAINT journal_seq_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN journal_seq VALIDATE CONSTRAINT journal_seq_check;
ALTER DOMAIN host_call_kind ADD CONSTRAINT host_call_kind_check CHECK (VALUE IN ('http', 'model')) NOT VALID;
ALTER DOMAIN host_call_kind VALIDATE CONSTRAINT host_call_kind_check;
ALTER DOMAIN request_digest ADD CONSTRAINT request_digest_check CHECK (VALUE <> '') NOT VALID;
ALTER DOMAIN request_digest VALIDATE CONSTRAINT request_digest_check;
ALTER DOMAIN wait_kind ADD CONSTRAINT wait_kind_check CHECK (VALUE IN ('wait', 'approval')) NOT VALID;
ALTER DOMAIN wait_kind VALIDATE CONSTRAINT wait_kind_check;
ALTER DOMAIN wait_status ADD CONSTRAINT wait_status_check CHECK (VALUE IN ('open', 'resolved', 'expired', 'cancelled')) NOT VALID;
ALTER DOMAIN wait_status VALIDATE CONSTRAINT wait_status_check;
ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions DROP CONSTRAINT sessions_crash_policy_check;
ALTER TABLE actor_events DROP CONSTRAINT actor_events_status_check;
ALTER TABLE actor_events DROP CONSTRAINT actor_events_traceparent_check;
ALTER TABLE activations DROP CONSTRAINT activations_state_check;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE stream_frames DROP CONSTRAINT stream_frames_seq_check;
ALTER TABLE stream_heads DROP CONSTRAINT stream_heads_last_seq_check;
ALTER TABLE host_calls DROP CONSTRAINT host_calls_seq_check;
ALTER TABLE host_calls DROP CONSTRAINT host_calls_kind_check;
ALTER TABLE host_calls DROP CONSTRAINT host_calls_request_digest_check;
ALTER TABLE waits DROP CONSTRAINT waits_kind_check;
ALTER TABLE waits DROP CONSTRAINT waits_status_check;

-- +goose Down
ALTER TABLE sessions ADD CONSTRAINT sessions_status_check CHECK (status IN ('active', 'sleeping', 'destroyed'));
ALTER TABLE sessions ADD CONSTRAINT sessions_crash_policy_check CHECK (crash_policy IN ('restart', 'sleep', 'destroy'));
ALTER TABLE actor_events ADD CONSTRAINT actor_events_status_check CHECK (status IN ('open', 'done', 'cancelled', 'dead_letter', 'discarded'));
ALTER TABLE actor_events ADD CONSTRAINT actor_events_traceparent_check CHECK (length(traceparent) <= 256);
ALTER TABLE activations ADD CONSTRAINT activations_state_check CHECK (state IN ('starting', 'active', 'draining', 'stopped', 'failed'));
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check CHECK (state IN ('created', 'sent', 'accepted', 'send_failed', 'superseded'));
ALTER TABLE stream_frames ADD CONSTRAINT stream_frames_seq_check CHECK (seq >= 1);
ALTER TABLE stream_heads ADD CONSTRAINT stream_heads_last_seq_check CHECK (last_seq >= 1);
ALTER TABLE host_calls ADD CONSTRAINT host_calls_seq_check CHECK (seq >= 1);
ALTER TABLE host_calls ADD CONSTRAINT host_calls_kind_check CHECK (kind IN ('http', 'model'));
ALTER TABLE host_calls ADD CONSTRAINT host_calls_request_digest_check CHECK (request_digest <> '');
ALTER TABLE waits ADD CONSTRAINT waits_kind_check CHECK (kind IN ('wait', 'approval'));
ALTER TABLE waits ADD CONSTRAINT waits_status_check CHECK (status IN ('open', 'resolved', 'expired', 'cancelled'));
ALTER TABLE sessions ALTER COLUMN status TYPE text;
ALTER TABLE sessions ALTER COLUMN crash_policy TYPE text;
ALTER TABLE actor_events ALTER COLUMN status TYPE text;
ALTER TABLE actor_events ALTER COLUMN traceparent TYPE text;
ALTER TABLE activations ALTER COLUMN state TYPE text;
ALTER TABLE deliveries ALTER COLUMN state TYPE text;
ALTER TABLE stream_frames ALTER COLUMN seq TYPE bigint;
ALTER TABLE stream_heads ALTER COLUMN last_seq TYPE bigint;
ALTER TABLE host_calls ALTER COLUMN seq TYPE integer;
ALTER TABLE host_calls ALTER COLUMN kind TYPE text;
ALTER TABLE host_calls ALTER COLUMN request_digest TYPE text;
ALTER TABLE waits ALTER COLUMN kind TYPE text;
ALTER TABLE waits ALTER COLUMN status TYPE text;
DROP DOMAIN wait_status;
DROP DOMAIN wait_kind;
DROP DOMAIN request_digest;
DROP DOMAIN host_call_kind;
DROP DOMAIN journal_seq;
DROP DOMAIN stream_seq;
DROP DOMAIN delivery_state;
DROP DOMAIN activation_state;
DROP DOMAIN traceparent;
DROP DOMAIN event_status;
DROP DOMAIN crash_policy;
DROP DOMAIN session_status;
