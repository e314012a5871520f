-- The session stream and waits (docs/DESIGN.md "The session stream",
-- "Waits and approvals"; store/stream.go, store/waits.go).
--
-- stream_heads: each session's frame counter, last_seq, in a table of its
-- own rather than a column of sessions, so that the frame writes do not
-- contend with the producers' hot path (AppendEvent locks the sessions row)
-- for one row. A frame write raises it with INSERT ... ON CONFLICT DO
-- UPDATE (the row appears with the first frame) and inserts the frame with
-- the new value in the same statement: the row lock, held to commit, makes
-- Seq gap-free and frames visible in Seq order. Every transaction takes
-- it last (the driver's lock order: activation, alarms, session, events,
-- waits, stream head), so that it is never held while waiting for another.
--
-- stream_frames: the frames, (agent_uid, session_id, seq). event_id,
-- actor_epoch and attempt name the turn a frame belongs to (0 for a wait
-- frame written outside a turn); event_id is a bare id, as in host_calls.
-- No foreign key to sessions: its check would take a share lock on the
-- session row for every chunk batch; stream_heads, written with every
-- frame, references the session. body is the kind's JSON object, as text
-- (stored verbatim). stream_frames_created serves CompactStream.
--
-- waits: one row per wait a session opened (kind wait: a commit with
-- outcome wait; kind approval: a held host call), unique per session by
-- wait_id; id is an internal row id ListWaits pages by (creation order).
-- data and resolution are JSON as text (verbatim). waits_due serves
-- ExpireDueWaits, waits_agent ListWaits, waits_event the cancellation of an
-- approval with its event.

-- +goose Up
CREATE TABLE stream_heads (
    agent_uid  text   NOT NULL,
    session_id text   NOT NULL,
    last_seq   bigint NOT NULL CHECK (last_seq >= 1),
    PRIMARY KEY (agent_uid, session_id),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE TABLE stream_frames (
    agent_uid   text        NOT NULL,
    session_id  text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq >= 1),
    kind        text        NOT NULL,
    event_id    bigint      NOT NULL DEFAULT 0,
    actor_epoch bigint      NOT NULL DEFAULT 0,
    attempt     integer     NOT NULL DEFAULT 0,
    body        text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (agent_uid, session_id, seq)
);

CREATE INDEX stream_frames_created ON stream_frames (created_at);

CREATE TABLE waits (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_uid   text        NOT NULL,
    session_id  text        NOT NULL,
    wait_id     text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('wait', 'approval')),
    event_id    bigint      NOT NULL,
    wait_for    text        NOT NULL DEFAULT '',
    data        text,
    status      text        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved', 'expired', 'cancelled')),
    call_seq    integer     NOT NULL DEFAULT 0,
    call_digest text        NOT NULL DEFAULT '',
    resolution  text,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    closed_at   timestamptz,
    UNIQUE (agent_uid, session_id, wait_id),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX waits_due ON waits (expires_at) WHERE status = 'open' AND expires_at IS NOT NULL;
CREATE INDEX waits_agent ON waits (agent_uid, id);
CREATE INDEX waits_event ON waits (event_id) WHERE status = 'open';

-- +goose Down
DROP TABLE waits;
DROP TABLE stream_frames;
DROP TABLE stream_heads;
