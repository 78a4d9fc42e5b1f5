//! Token revocation across replicas, and agents' token renewal.
//!
//! Revoked ids live in the database; each replica reloads them on a timer
//! (`auth.revocation_refresh_secs`), so a revocation made anywhere (`gsaasd token revoke`, on any
//! machine with the database) takes effect everywhere within that time, without a database read
//! per request.

use std::sync::Arc;
use std::time::Duration;

use super::App;
use crate::auth::{TokenId, MAX_TOKEN_TTL_SECS};
use crate::db::{self, now_ms};
use crate::error::{Error, ErrorChain};

impl App {
    /// Loads the revoked token ids into the key's verifier.
    pub async fn refresh_revocations(&self) -> Result<(), Error> {
        let mut conn = self.db.conn().await?;
        let revoked = db::revoked_tokens(&mut conn, now_ms()).await?;
        self.keys.set_revoked(revoked);
        Ok(())
    }

    /// Reloads the revoked ids every `auth.revocation_refresh_secs`.
    pub fn spawn_revocation_refresher(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let app = self.clone();
        tokio::spawn(async move {
            let every = Duration::from_secs(app.config.auth.revocation_refresh_secs.max(1));
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = app.refresh_revocations().await {
                    tracing::warn!(error = %ErrorChain(&e), "cannot reload revoked tokens");
                }
            }
        })
    }

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
    let mut conn = db.conn().await?;
    db::revoke_token(&mut conn, &id.line, kept_until_ms, now).await
}
