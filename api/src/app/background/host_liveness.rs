//! Host liveness: hosts whose agents stopped heartbeating for `hosts.heartbeat_timeout_secs`
//! become unavailable for new cGPUs (agent backend only), and whether any host runs its GPUs'
//! servers is read again (another replica may have registered one).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::{Config, HostsBackend};

#[derive(Debug)]
pub(crate) struct HostLiveness;

#[async_trait]
impl Task for HostLiveness {
    fn name(&self) -> TaskName {
        TaskName::HostLiveness
    }
    fn describe(&self) -> &'static str {
        "Marks hosts whose agents stopped heartbeating unavailable for new cGPUs."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let seen = app.refresh_managed_seen().await;
        let mut marked = 0;
        if app.config.hosts.backend == HostsBackend::Agent {
            let timeout = Duration::from_secs(app.config.hosts.heartbeat_timeout_secs);
            marked = app.expire_heartbeats(timeout).await?;
            if marked > 0 {
                // Their GPUs failed with them: re-homing need not wait for its own timer.
                app.tasks.trigger(TaskName::Rehome);
            }
        }
        let report = Report::default().with("hosts_marked_unavailable", marked);
        seen.map_err(|error| Failed { report: report.clone(), error })?;
        Ok(report)
    }
}
