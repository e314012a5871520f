-- The two time indexes written on every turn are BRIN, not B-tree:
-- stream_frames_created (CompactStream: frames created before a time) and
-- turns_committed_at (the console overview: turns of the last minute).
-- Both columns are a clock_timestamp() taken at insert, so they follow the
-- heap's physical order and a block-range summary (min, max per 128 pages)
-- answers both queries. A B-tree entry per row cost each turn three index
-- insertions (two frames, one turn) of its ~15; a BRIN insertion into a
-- range not yet summarized writes nothing, and autosummarize summarizes a
-- range once it fills (autovacuum's work item). CompactStream no longer
-- orders its candidates: any frames past the cut-off may go first.

-- +goose Up
DROP INDEX stream_frames_created;
CREATE INDEX stream_frames_created ON stream_frames USING brin (created_at) WITH (autosummarize = on);
DROP INDEX turns_committed_at;
CREATE INDEX turns_committed_at ON turns USING brin (committed_at) WITH (autosummarize = on);

-- +goose Down
DROP INDEX turns_committed_at;
CREATE INDEX turns_committed_at ON turns (committed_at);
DROP INDEX stream_frames_created;
CREATE INDEX stream_frames_created ON stream_frames (created_at);
