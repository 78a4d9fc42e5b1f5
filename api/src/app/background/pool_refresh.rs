//! Pool refresh: this process's pool catches up with the database, so a start (its first pass)
//! ends with every launch ready to be decided in memory, and a replica follows the others' writes
//! between its own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;

#[derive(Debug)]
pub(crate) struct PoolRefresh;

#[async_trait]
impl Task for PoolRefresh {
    fn name(&self) -> TaskName {
        TaskName::PoolRefresh
    }
    fn describe(&self) -> &'static str {
        "Brings this process's GPU pool up to the database's latest generation."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        app.read_pool(|_| ()).await?;
        Ok(Report::default())
    }
}
