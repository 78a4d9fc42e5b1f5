-- Revoked token ids (a token's `jti`, or the first id of a renewed agent token's line). Every
-- replica reloads them every few seconds; a row can go once the token would have expired anyway.
CREATE TABLE revoked_tokens (
    id TEXT PRIMARY KEY,
    expires_ms BIGINT NOT NULL,
    revoked_ms BIGINT NOT NULL
);
