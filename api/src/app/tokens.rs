//! Revoking tokens, and agents' token renewal. Each replica reloads the revoked ids on a timer
//! ([`super::background::revocations`]).

use std::time::Duration;

use super::App;
use crate::auth::{TokenId, MAX_TOKEN_TTL_SECS};
use crate::db::{self, now_ms};
use crate::error::Error;

impl App {
    /// A new token for the agent presenting `token`, in the same line.
    pub fn renew_agent_token(&self, token: &str) -> Result<String, Error> {
        let ttl = Duration::from_secs(self.config.auth.agent_token_ttl_secs);
        self.keys.renew_agent_token(token, ttl)
    }
}

/// How long a revocation is kept after it is made: as long as any token of its line could still
/// be valid. Every token lives at most [`MAX_TOKEN_TTL_SECS`] from its issue, and none of a
/// revoked line is issued after the revocation, but by a replica that has not reloaded the
/// revocations yet (a day covers that many times over).
pub const REVOCATION_KEPT_MS: i64 = (MAX_TOKEN_TTL_SECS as i64 + 24 * 3600) * 1000;

/// Records in `db` that the token line `id` is revoked: what `gsaasd token revoke` does. The
/// revocation outlives the token it was given (the line may have been renewed since; the token
/// may have expired already): see [`REVOCATION_KEPT_MS`].
pub async fn revoke(db: &db::Db, id: &TokenId) -> Result<(), Error> {
    let now = now_ms();
    let token_expires_ms = i64::try_from(id.expires.saturating_mul(1000)).unwrap_or(i64::MAX);
    let kept_until_ms = token_expires_ms.max(now.saturating_add(REVOCATION_KEPT_MS));
    Ok(db.revoke_token(&id.line, kept_until_ms, now).await?)
}
