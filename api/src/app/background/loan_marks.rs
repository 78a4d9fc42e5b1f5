//! Loan marks kept true: a cGPU admitted on loan (past its project's quota, on what its cohort
//! lends) is marked so at admission; once the project's other cGPUs end and it is back within its
//! quota, its oldest loans are in effect its own (a reclaim never takes them: the planner's budget
//! is what the project holds past its quota). This task takes their marks off, so the VM's view,
//! the CLI and the dashboard stop calling them borrowed. On the queue's period.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;

#[derive(Debug)]
pub(crate) struct LoanMarks;

#[async_trait]
impl Task for LoanMarks {
    fn name(&self) -> TaskName {
        TaskName::LoanMarks
    }
    fn describe(&self) -> &'static str {
        "Takes the loan mark off cGPUs whose project is back within its quota (they are its own)."
    }
    fn period(&self, config: &Config) -> Duration {
        Duration::from_secs(config.queue.serve_interval_secs.max(1))
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let loans = app.db.loans().await.map_err(Failed::from)?;
        if loans.is_empty() {
            return Ok(Report::default().with("loans", 0).with("settled", 0));
        }
        let own: Vec<(gpgpums::VmId, u32)> = app
            .read_pool_and_quotas(|pool, quotas| {
                let holds = loans.iter().map(|l| (l, gpgpums::queue::loan_holds(pool, l)));
                let (_, own) = quotas.split_loans(holds);
                own.into_iter().map(|l| (l.vm, l.index)).collect()
            })
            .await
            .map_err(Failed::from)?;
        let settled = app.db.settle_loans(&own).await.map_err(Failed::from)?;
        Ok(Report::default().with("loans", loans.len() as u64).with("settled", settled))
    }
}
