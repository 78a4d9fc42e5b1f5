//! Token revocation across replicas. Revoked ids live in the database; each replica reloads them
//! on a timer (`auth.revocation_refresh_secs`), so a revocation made anywhere (`gsaasd token
//! revoke`, on any machine with the database) takes effect everywhere within that time, without
//! a database read per request.

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
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
}
