-- [1/6] A revoked token line stays revoked for as long as any token of it could be valid.
--
-- A revocation was kept until the token it was given expired, while the line's renewed tokens
-- lived on: once the row was dropped, they worked again. Now it is kept a year and a day past
-- the revocation (the longest a token lives, and a day for replicas to reload); rows kept
-- under the old rule get as long.
UPDATE revoked_tokens SET expires_ms = revoked_ms + 31708800000
WHERE expires_ms < revoked_ms + 31708800000;
