-- The session stream and waits (docs/DESIGN.md "The session stream",
-- "Waits and approvals"; store/stream.go, store/waits.go).
--
-- sessions.last_frame_seq: the session's frame counter. A frame write
-- raises it and inserts the frame with the new value in the same write
-- transaction; SQLite's single writer (BEGIN IMMEDIATE) makes Seq gap-free
-- and frames visible in Seq order. Added with a default: no table rebuild.
--
-- stream_frames: the frames of each session, (agent_uid, session_id, seq).
-- event_id, actor_epoch and attempt name the turn a frame belongs to (0
-- for a wait frame written outside a turn). body is the kind's JSON
-- object (TEXT). created_at is INTEGER unix milliseconds (DB clock);
-- stream_frames_created serves CompactStream, which deletes by age the
-- frames whose event is not open.
--
-- waits: one row per wait a session opened (kind wait: a commit with
-- outcome wait; kind approval: a held host call), unique per session by
-- wait_id. id is an internal row id: ListWaits pages by it (creation
-- order). data and resolution are JSON TEXT (NULL when none); expires_at
-- and closed_at are unix milliseconds (NULL when none). waits_due serves
-- ExpireDueWaits (open waits with a timeout), waits_agent ListWaits.

-- +goose Up
ALTER TABLE sessions ADD COLUMN last_frame_seq INTEGER NOT NULL DEFAULT 0;

CREATE TABLE stream_frames (
    agent_uid   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    kind        TEXT    NOT NULL,
    event_id    INTEGER NOT NULL DEFAULT 0,
    actor_epoch INTEGER NOT NULL DEFAULT 0,
    attempt     INTEGER NOT NULL DEFAULT 0,
    body        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (agent_uid, session_id, seq),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
) WITHOUT ROWID;

CREATE INDEX stream_frames_created ON stream_frames (created_at);

CREATE TABLE waits (
    id          INTEGER PRIMARY KEY,
    agent_uid   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    wait_id     TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('wait', 'approval')),
    event_id    INTEGER NOT NULL REFERENCES actor_events (event_id),
    wait_for    TEXT    NOT NULL DEFAULT '',
    data        TEXT,
    status      TEXT    NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved', 'expired', 'cancelled')),
    call_seq    INTEGER NOT NULL DEFAULT 0,
    call_digest TEXT    NOT NULL DEFAULT '',
    resolution  TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    closed_at   INTEGER,
    UNIQUE (agent_uid, session_id, wait_id),
    FOREIGN KEY (agent_uid, session_id) REFERENCES sessions (agent_uid, session_id)
);

CREATE INDEX waits_due ON waits (expires_at) WHERE status = 'open' AND expires_at IS NOT NULL;
CREATE INDEX waits_agent ON waits (agent_uid, id);
CREATE INDEX waits_event ON waits (event_id) WHERE status = 'open';

-- +goose Down
DROP TABLE waits;
DROP TABLE stream_frames;
ALTER TABLE sessions DROP COLUMN last_frame_seq;
