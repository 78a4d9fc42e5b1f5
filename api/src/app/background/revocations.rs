//! Token revocation across replicas. Revoked ids live in the database; each replica reloads them
//! on a timer (`auth.revocation_refresh_secs`), so a revocation made anywhere (`gsaasd token
//! revoke`, on any machine with the database) takes effect everywhere within that time, without
//! a database read per request.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::db::now_ms;
use crate::error::Error;

impl App {
    /// Loads the revoked token ids into the key's verifier.
    pub async fn refresh_revocations(&self) -> Result<(), Error> {
        let revoked = self.db.revoked_tokens(now_ms()).await?;
        self.keys.set_revoked(revoked);
        Ok(())
    }
}

#[derive(Debug)]
pub(crate) struct Revocations;

#[async_trait]
impl Task for Revocations {
    fn name(&self) -> TaskName {
        TaskName::Revocations
    }
    fn describe(&self) -> &'static str {
        "Reloads the revoked token ids, wherever they were revoked."
    }
    fn period(&self, config: &Config) -> Duration {
        Duration::from_secs(config.auth.revocation_refresh_secs.max(1))
    }
    /// A start loads them before it serves.
    fn at_start(&self) -> bool {
        false
    }
    /// Every request's token check reads what it loads.
    fn on_request_lane(&self) -> bool {
        true
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        app.refresh_revocations().await?;
        Ok(Report::default())
    }
}
