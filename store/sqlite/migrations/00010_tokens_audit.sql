-- API tokens and the audit log (docs/DESIGN.md "Tokens, roles and the
-- audit log").
--
-- api_tokens: one row per token an admin created. The token's value is
-- never stored: hash is sha256 of its secret part (256 random bits, so an
-- unsalted hash is enough). A revoked token keeps its row (revoked_at) so
-- that the audit log's token ids stay explained. Times: unix ms.
--
-- audit_log: one row per mutating call, appended after it was answered;
-- at is the database clock; result is "ok" or the error code answered.

-- +goose Up
CREATE TABLE api_tokens (
    id         TEXT    NOT NULL PRIMARY KEY,
    namespace  TEXT    NOT NULL,
    role       TEXT    NOT NULL CHECK (role IN ('reader', 'client', 'operator', 'admin')),
    name       TEXT    NOT NULL DEFAULT '',
    hash       BLOB    NOT NULL CHECK (length(hash) = 32),
    created_at INTEGER NOT NULL,
    created_by TEXT    NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX api_tokens_namespace ON api_tokens (namespace, created_at, id);

CREATE TABLE audit_log (
    id        INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    token_id  TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    action    TEXT    NOT NULL,
    object    TEXT    NOT NULL,
    result    TEXT    NOT NULL,
    status    INTEGER NOT NULL
);
-- ListAudit of one namespace, newest first.
CREATE INDEX audit_log_namespace ON audit_log (namespace, id);

-- +goose Down
DROP TABLE audit_log;
DROP TABLE api_tokens;
