//! Releasing fences: a fence keeps a withdrawn VM's cGPUs booked while its host's agent may still
//! route to them (see [`crate::app::fences`]); each pass releases those whose agent confirmed the
//! routes gone, whose host was forgotten, or that outlived `hosts.fence_timeout_secs`.

use std::collections::BTreeMap;

use gpgpums::HostId;

use crate::app::App;
use crate::db::now_ms;
use crate::error::Error;
use crate::model::{AlertKind, FenceId};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::config::Config;

impl App {
    /// Releases the fences whose host's agent confirmed their routes gone, whose host was
    /// forgotten, or that are older than `hosts.fence_timeout_secs`: an agent that never confirms
    /// (a hostile one, or one cut off for that long) cannot keep other hosts' GPUs fenced for
    /// ever. Each host whose fences expired gets an alert. Returns how many were released.
    pub(crate) async fn release_fences(&self) -> Result<usize, Error> {
        let timeout_ms = self.config.hosts.fence_timeout_secs.saturating_mul(1000) as i64;
        let opened_before = now_ms().saturating_sub(timeout_ms);
        let any = { !self.db.releasable_fences(opened_before).await?.is_empty() };
        if !any {
            return Ok(0);
        }
        let released = self
            .with_pool(move |pool, tx| {
                Box::pin(async move {
                    let fences = tx.releasable_fences(opened_before).await?;
                    let ids: Vec<FenceId> = fences.iter().map(|f| f.id).collect();
                    tx.delete_fences(&ids).await?;
                    for id in &ids {
                        pool.release(&id.holder());
                    }
                    Ok(fences)
                })
            })
            .await?;
        let mut expired: BTreeMap<&HostId, usize> = BTreeMap::new();
        for fence in released.iter().filter(|f| f.expired) {
            *expired.entry(&fence.host).or_default() += 1;
        }
        for (host, n) in expired {
            let detail = format!(
                "its agent never confirmed the routes of {n} fence(s) withdrawn within \
                 hosts.fence_timeout_secs ({} s): their bookings were released",
                self.config.hosts.fence_timeout_secs
            );
            self.alert_host(host, AlertKind::FenceExpired, detail).await;
        }
        if !released.is_empty() {
            tracing::info!(fences = released.len(), "fences released");
            self.trigger_queue();
        }
        Ok(released.len())
    }
}

#[derive(Debug)]
pub(crate) struct Fences;

#[async_trait]
impl Task for Fences {
    fn name(&self) -> TaskName {
        TaskName::Fences
    }
    fn describe(&self) -> &'static str {
        "Releases fences whose host confirmed their routes gone, was forgotten or timed out."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let released = app.release_fences().await?;
        Ok(Report::default().with("fences_released", released))
    }
}
