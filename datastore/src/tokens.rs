//! Revoked tokens: the ids every replica refuses.

use std::collections::HashSet;

use sqlx::{AnyConnection, Row};

use crate::error::Error;

/// Revokes the token line `id` until `expires_ms`, when no token of it can be valid any more.
/// Revoking again keeps the later of the two.
pub async fn revoke_token(
    conn: &mut AnyConnection,
    id: &str,
    expires_ms: i64,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO revoked_tokens (id, expires_ms, revoked_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET expires_ms = \
           CASE WHEN excluded.expires_ms > revoked_tokens.expires_ms \
           THEN excluded.expires_ms ELSE revoked_tokens.expires_ms END",
    )
    .bind(id)
    .bind(expires_ms)
    .bind(now_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// The revoked lines some token of which may still be valid; the rows of the others are dropped.
pub async fn revoked_tokens(
    conn: &mut AnyConnection,
    now_ms: i64,
) -> Result<HashSet<String>, Error> {
    sqlx::query("DELETE FROM revoked_tokens WHERE expires_ms < $1")
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
    let rows = sqlx::query("SELECT id FROM revoked_tokens").fetch_all(conn).await?;
    rows.iter().map(|row| Ok(row.try_get::<String, _>(0)?)).collect()
}
