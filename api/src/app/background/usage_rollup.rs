//! Usage roll-up: ended cGPU lifetimes are added to the usage totals (`db::usage`), so that
//! `/metrics` reads the totals and the few lifetimes since, not every one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;

#[derive(Debug)]
pub(crate) struct UsageRollup;

#[async_trait]
impl Task for UsageRollup {
    fn name(&self) -> TaskName {
        TaskName::UsageRollup
    }
    fn describe(&self) -> &'static str {
        "Adds ended cGPU lifetimes to the usage totals /metrics reads."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let rolled = app.db.roll_up_usage().await?;
        Ok(Report::default().with("usage_rolled_up", rolled))
    }
}
