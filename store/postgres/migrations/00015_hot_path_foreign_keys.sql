-- The tables written once or more per turn no longer carry foreign keys to
-- sessions (or, for messages, to turns). Each such key was checked by an
-- RI trigger: an SPI query and a FOR KEY SHARE lock on the parent row per
-- inserted row, three per deferred commit and one per append. On the bench
-- (paddock bench --store postgres --n 20000 --keys 1000 --producers 8,
-- three interleaved pairs) they cost 13 % of the database's CPU per turn
-- (0.39 ms against 0.45) and 6-10 % of turns/s; perf put the triggers at
-- 9 % of the turns lane's backend.
--
-- What the keys guarded holds by construction: a session row is never
-- deleted, and each of these rows is inserted by a statement that reads or
-- updates its parent in the same statement (an append updates the session
-- row it inserts the event of; a commit updates sessions.turn_count and
-- inserts the turn and its messages from that row; a delivery, a stream
-- head and a state are written for a session whose live activation the
-- statement locked). The PostgreSQL tests check for orphans after every
-- case (store/postgres/postgres_test.go, noOrphans), so a statement that
-- broke this would fail them. The tables written rarely (alarms, waits,
-- host_calls, event_errors, the catalog) keep theirs, and so does SQLite,
-- whose foreign key checks are an index probe.

-- +goose Up
ALTER TABLE actor_events DROP CONSTRAINT actor_events_agent_uid_session_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_agent_uid_session_id_fkey;
ALTER TABLE turns DROP CONSTRAINT turns_agent_uid_session_id_fkey;
ALTER TABLE messages DROP CONSTRAINT messages_agent_uid_session_id_turn_no_fkey;
ALTER TABLE stream_heads DROP CONSTRAINT stream_heads_agent_uid_session_id_fkey;
ALTER TABLE session_state DROP CONSTRAINT session_state_agent_uid_session_id_fkey;

-- +goose Down
ALTER TABLE actor_events ADD CONSTRAINT actor_events_agent_uid_session_id_fkey
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_agent_uid_session_id_fkey
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id);
ALTER TABLE turns ADD CONSTRAINT turns_agent_uid_session_id_fkey
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id);
ALTER TABLE messages ADD CONSTRAINT messages_agent_uid_session_id_turn_no_fkey
    FOREIGN KEY (agent_uid, session_id, turn_no) REFERENCES turns (agent_uid, session_id, turn_no);
ALTER TABLE stream_heads ADD CONSTRAINT stream_heads_agent_uid_session_id_fkey
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id);
ALTER TABLE session_state ADD CONSTRAINT session_state_agent_uid_session_id_fkey
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id);
