//! Ending delegations: the Keystone trusts of launches that no longer need them, whose deletion
//! failed (Keystone down) or that a crash left (see [`crate::app::delegations`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;

#[derive(Debug)]
pub(crate) struct Delegations;

#[async_trait]
impl Task for Delegations {
    fn name(&self) -> TaskName {
        TaskName::Delegations
    }
    fn describe(&self) -> &'static str {
        "Deletes the Keystone trusts of launches that no longer need them."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let ended = app.end_stale_delegations().await?;
        Ok(Report::default().with("delegations_ended", ended))
    }
}
