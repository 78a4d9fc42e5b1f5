//! The reconciler: one idempotent pass that converges whatever drifted, run on a timer and on demand.
//!
//! It takes no input and is never told what changed; each pass looks at everything:
//! - this process's pool catches up with the database (a start loads it in its first pass);
//! - hosts whose agents stopped heartbeating become unavailable for new cGPUs;
//! - every host whose agent does not hold the latest table (a failed push, an agent that restarted
//!   without its state, a table lost behind its back) gets its table again;
//! - VMs whose servers were deleted or moved outside GSaaS are terminated, or their routes follow
//!   them (see [`super::drift`]);
//! - with `hosts.auto_rehome`, the cGPUs of failed GPUs move to healthy ones (see
//!   [`super::rehome`]), and lost cGPUs whose GPU works again go live;
//! - fences whose host's agent confirmed their routes gone are released (see [`crate::app::fences`]);
//! - ended cGPU lifetimes are added to the usage totals (`db::usage`), so that `/metrics` reads
//!   the totals and the few lifetimes since, not every one;
//! - sagas with work left and no live owner (a crashed gsaasd) are resumed.
//!
//! The next pass is the retry; a pass records what it did and its first error for `/readyz`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpgpums::HostId;
use tokio::sync::Notify;
use tokio::task::JoinSet;

pub use gsaas_api_types::ReconcilerStatus;

use crate::app::App;
use crate::config::HostsBackend;
use crate::db::{self, now_ms};
use crate::error::{Error, ErrorChain};
use crate::metrics::inc;

#[derive(Debug, Default)]
pub(crate) struct Reconciler {
    trigger: Notify,
    status: Mutex<ReconcilerStatus>,
}

impl App {
    /// Asks for a pass as soon as possible.
    pub fn trigger_reconcile(&self) {
        self.reconciler.trigger.notify_one();
    }

    pub fn reconciler_status(&self) -> ReconcilerStatus {
        self.reconciler.status.lock().expect("reconciler status").clone()
    }

    /// Runs passes forever: every `reconcile_interval_secs`, and when triggered.
    pub fn spawn_reconciler(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let app = self.clone();
        self.spawn_background(async move {
            let interval = Duration::from_secs(app.config.hosts.reconcile_interval_secs.max(1));
            loop {
                app.reconcile_once().await;
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = app.reconciler.trigger.notified() => {}
                }
            }
        })
    }

    /// One pass; see the module docs.
    pub async fn reconcile_once(self: &Arc<Self>) -> ReconcilerStatus {
        let mut status =
            ReconcilerStatus { last_pass_ms: Some(now_ms()), ..self.reconciler_status() };
        status.passes += 1;
        status.last_error = None;
        inc(&self.metrics.reconciler_runs);
        let mut first_error: Option<Error> = None;
        let mut note = |e: Error| {
            tracing::warn!(error = %ErrorChain(&e), "reconciler");
            first_error.get_or_insert(e);
        };

        // Another replica may have registered a host that runs its GPUs' servers.
        if let Err(e) = self.refresh_managed_seen().await {
            note(e);
        }
        status.hosts_marked_unavailable = 0;
        if self.config.hosts.backend == HostsBackend::Agent {
            let timeout = Duration::from_secs(self.config.hosts.heartbeat_timeout_secs);
            match self.expire_heartbeats(timeout).await {
                Ok(n) => status.hosts_marked_unavailable = n,
                Err(e) => note(e),
            }
        }

        let started = std::time::Instant::now();
        // This process's pool, current with the database: a start loads it here, so the first
        // pass ends with every launch ready to be decided in memory.
        if let Err(e) = self.read_pool(|_| ()).await {
            note(e);
        }
        let loaded_at = started.elapsed();
        status.tables_pushed = 0;
        match self.hosts().await {
            Ok(hosts) => {
                let hosts = hosts.into_iter().filter(|h| h.kind.has_agent() && !h.forgotten);
                let (pushed, errors) = self.push_behind_or_drifted(hosts.collect()).await;
                status.tables_pushed = pushed;
                errors.into_iter().for_each(&mut note);
            }
            Err(e) => note(e),
        }

        let pushed_at = started.elapsed();
        (status.servers_deleted, status.servers_moved) = (0, 0);
        match self.follow_cloud().await {
            Ok(drift) => {
                (status.servers_deleted, status.servers_moved) = (drift.deleted, drift.moved)
            }
            Err(e) => note(e),
        }

        let followed_at = started.elapsed();
        (status.cgpus_rehomed, status.cgpus_lost, status.cgpus_recovered) = (0, 0, 0);
        match self.rehome_failed().await {
            Ok(done) => {
                status.cgpus_rehomed = done.moved;
                status.cgpus_lost = done.lost;
                status.cgpus_recovered = done.recovered;
            }
            Err(e) => note(e),
        }

        status.fences_released = 0;
        match self.release_fences().await {
            Ok(n) => status.fences_released = n,
            Err(e) => note(e),
        }

        status.usage_rolled_up = 0;
        match self.db.roll_up_usage().await {
            Ok(n) => status.usage_rolled_up = n,
            Err(e) => note(e),
        }

        status.delegations_ended = 0;
        match self.end_stale_delegations().await {
            Ok(n) => status.delegations_ended = n,
            Err(e) => note(e),
        }

        status.sagas_resumed = 0;
        let resumable = async {
            let mut conn = self.db.conn().await?;
            db::sagas_to_resume(&mut conn, now_ms()).await
        };
        match resumable.await {
            Ok(ids) => {
                for id in ids {
                    self.spawn_saga(id);
                    status.sagas_resumed += 1;
                }
            }
            Err(e) => note(e),
        }

        tracing::debug!(
            pool_ms = loaded_at.as_millis() as u64,
            tables_ms = (pushed_at - loaded_at).as_millis() as u64,
            cloud_ms = (followed_at - pushed_at).as_millis() as u64,
            rest_ms = (started.elapsed() - followed_at).as_millis() as u64,
            "reconciler pass"
        );
        if let Some(e) = first_error {
            inc(&self.metrics.reconciler_errors);
            status.last_error = Some(e.to_string());
        }
        *self.reconciler.status.lock().expect("reconciler status") = status.clone();
        status
    }

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
