//! Route tables: every host whose agent does not hold the latest table gets it again (a failed
//! push, an agent that restarted without its state, a table lost behind its back). Agents are
//! asked which generation they hold, [`PUSHES_IN_FLIGHT`] at a time, and pushed to alike.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::HostId;
use tokio::task::JoinSet;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::error::{Error, ErrorChain};

/// Pushes to the hosts whose agents are behind or drifted.
#[derive(Debug)]
pub(crate) struct RouteTables;

#[async_trait]
impl Task for RouteTables {
    fn name(&self) -> TaskName {
        TaskName::RouteTables
    }
    fn describe(&self) -> &'static str {
        "Pushes its route table to every host whose agent is behind gsaasd or holds another one."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let hosts = app.hosts().await?;
        let hosts = hosts.into_iter().filter(|h| h.kind.has_agent() && !h.forgotten);
        let (pushed, errors) = app.push_behind_or_drifted(hosts.collect()).await;
        let report = Report::default().with("tables_pushed", pushed);
        let mut errors = errors.into_iter();
        let Some(error) = errors.next() else { return Ok(report) };
        for other in errors {
            tracing::warn!(error = %ErrorChain(&other), "route tables");
        }
        Err(Failed { report, error })
    }
}

impl App {
    /// Pushes its table to each host whose agent is behind gsaasd or holds another table than
    /// gsaasd believes, [`PUSHES_IN_FLIGHT`] hosts at a time: how many were pushed, and what
    /// failed. Where at least half the hosts need their table (a start, with agents that keep no
    /// state) every table is read at once beforehand, which at a million cGPUs costs about what
    /// reading a third of them 64 hosts at a time does; otherwise each push reads its own
    /// (batched together).
    async fn push_behind_or_drifted(
        self: &Arc<Self>,
        hosts: Vec<crate::model::HostRecord>,
    ) -> (usize, Vec<Error>) {
        let checked = hosts.len();
        let (behind, mut errors) = self.behind_or_drifted(hosts).await;
        let mut ahead = HashMap::new();
        if !behind.is_empty() && behind.len() * 2 >= checked {
            match self.read_tables_ahead(&behind).await {
                Ok(tables) => ahead = tables,
                Err(e) => {
                    tracing::debug!(error = %ErrorChain(&e), "reading every table at once failed; each push reads its own");
                }
            }
        }
        let pushes = in_flight(behind, "a route push", |host| {
            let (app, table) = (self.clone(), ahead.remove(&host));
            async move { app.push_routes_from(&host, table).await }
        });
        let mut pushed = 0;
        for push in pushes.await {
            match push {
                Ok(()) => pushed += 1,
                Err(e) => errors.push(e),
            }
        }
        (pushed, errors)
    }

    /// The hosts whose agents are behind gsaasd or hold another table than gsaasd believes,
    /// [`PUSHES_IN_FLIGHT`] agents asked at a time, and the agents that did not answer.
    async fn behind_or_drifted(
        self: &Arc<Self>,
        hosts: Vec<crate::model::HostRecord>,
    ) -> (Vec<HostId>, Vec<Error>) {
        // A hung agent (it accepts connections and never answers) is given as long as a push
        // is, not the HTTP client's 30 s: a pass waits for its slowest check, and every host's
        // expiry, re-homing and fences wait for the pass.
        let timeout = Duration::from_millis(self.config.launch.agent_timeout_ms);
        let checks = in_flight(hosts, "an agent check", |host| {
            let app = self.clone();
            async move {
                let applied = tokio::time::timeout(timeout, app.agents.applied_generation(&host))
                    .await
                    .map_err(|_| {
                        let why = format!("host {} did not answer within {timeout:?}", host.name);
                        Error::unavailable("host agent", why)
                    })?;
                let drifted = match applied {
                    Ok(applied) => applied.unwrap_or(0) != host.applied_generation,
                    Err(e) => return Err(Error::unavailable("host agent", e)),
                };
                let behind = host.applied_generation < host.routes_generation;
                Ok((behind || drifted).then_some(host.name))
            }
        });
        let (mut behind, mut errors) = (Vec::new(), Vec::new());
        for check in checks.await {
            match check {
                Ok(Some(host)) => behind.push(host),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        // In name order, as the hosts came: the pushes go out in a stable order.
        behind.sort_unstable();
        (behind, errors)
    }
}

/// Runs `task` on each item, each in a task of its own, [`PUSHES_IN_FLIGHT`] at a time; what they
/// return, in the order they end (`what` names one in the error of a task that panicked).
async fn in_flight<T, O, Task>(
    items: impl IntoIterator<Item = T>,
    what: &str,
    mut task: impl FnMut(T) -> Task,
) -> Vec<Result<O, Error>>
where
    Task: std::future::Future<Output = Result<O, Error>> + Send + 'static,
    O: Send + 'static,
{
    let (mut items, mut running, mut ended) = (items.into_iter(), JoinSet::new(), Vec::new());
    loop {
        while running.len() < PUSHES_IN_FLIGHT {
            let Some(item) = items.next() else { break };
            running.spawn(task(item));
        }
        match running.join_next().await {
            None => break,
            Some(Ok(result)) => ended.push(result),
            Some(Err(e)) => ended.push(Err(Error::internal(format!("{what} failed: {e}")))),
        }
    }
    ended
}

/// How many hosts one reconciler pass checks and pushes to at once.
const PUSHES_IN_FLIGHT: usize = 64;
