-- API tokens and the audit log (docs/DESIGN.md "Tokens, roles and the
-- audit log").
--
-- api_tokens: one row per token an admin created. The token's value is
-- never stored: hash is sha256 of its secret part (256 random bits, so an
-- unsalted hash is enough). A revoked token keeps its row (revoked_at) so
-- that the audit log's token ids stay explained.
--
-- audit_log: one row per mutating call, appended after it was answered;
-- at is the database clock; result is "ok" or the error code answered.

-- +goose Up
CREATE TABLE api_tokens (
    id         text        NOT NULL PRIMARY KEY,
    namespace  text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('reader', 'client', 'operator', 'admin')),
    name       text        NOT NULL DEFAULT '',
    hash       bytea       NOT NULL CHECK (length(hash) = 32),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by text        NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX api_tokens_namespace ON api_tokens (namespace, created_at, id);

CREATE TABLE audit_log (
    id        bigserial   NOT NULL PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    token_id  text        NOT NULL,
    namespace text        NOT NULL,
    action    text        NOT NULL,
    object    text        NOT NULL,
    result    text        NOT NULL,
    status    integer     NOT NULL
);
-- ListAudit of one namespace, newest first.
CREATE INDEX audit_log_namespace ON audit_log (namespace, id);

-- +goose Down
DROP TABLE audit_log;
DROP TABLE api_tokens;
