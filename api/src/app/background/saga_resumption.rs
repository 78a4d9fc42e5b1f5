//! Saga resumption: sagas with work left whose owner is gone (a gsaasd that crashed or stopped)
//! are taken over and resumed here, from the step they had persisted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::db::now_ms;

#[derive(Debug)]
pub(crate) struct SagaResumption;

#[async_trait]
impl Task for SagaResumption {
    fn name(&self) -> TaskName {
        TaskName::SagaResumption
    }
    fn describe(&self) -> &'static str {
        "Resumes sagas with work left and no live owner."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let ids = app.db.sagas_to_resume(now_ms()).await?;
        let resumed = ids.len();
        for id in ids {
            app.spawn_saga(id);
        }
        Ok(Report::default().with("sagas_resumed", resumed))
    }
}
