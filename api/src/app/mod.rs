//! The application layer: everything between the HTTP handlers and the datastore.
//!
//! - [`pool`]: the in-memory GPGPUMS pool kept in step with the database, and the one way to change
//!   bookings or inventory (inside a transaction that bumps the pool generation).
//! - [`batch`]: group commit, which writes what many callers queued at once in a few statements;
//!   [`bookings`] (reservations and releases of cGPUs), the saga's VM writes, reads of VMs and the
//!   database side of route pushes go through it.
//! - [`vms`]: launch and terminate, as requests.
//! - [`sagas`]: the sagas that run after a request returns (launch, attach, detach, terminate; one
//!   file each), resumable after a crash.
//! - [`hosts`]: host registration, heartbeats, drain, route tables pushed to agents.
//! - [`servers`]: the servers hosts run per cGPU (`[gpu_servers] managed`): started before a
//!   cGPU is routed, their ports recorded and routed to, stopped when the cGPU leaves.
//! - [`alerts`]: what a host's agent tried that admins should know of.
//! - [`gpus`]: GPU taints, by admins or after an agent refused routes to a GPU.
//! - [`fences`]: bookings kept while a host that cannot be reached may still route to them.
//! - [`background`]: work on a timer and on trigger, one file per task, one driver: the
//!   reconciler's tasks (drift, re-homing, fences, ...), the queue's rounds, token revocations,
//!   the usage log's folding, the notifications' outbox.
//! - [`queue`]: the queue as requests and views see it.
//! - [`redact`]: failure reasons as tenants may read them (no host, GPU or rCUDA server named).
//! - [`tokens`]: revoking tokens; agents' token renewal.
//! - [`watch`]: waiting for a VM to settle (long-polling).

pub mod alerts;
pub mod background;
pub mod batch;
pub mod bookings;
pub mod cohorts;
pub mod delegations;
pub mod elastic;
pub mod fences;
pub mod fields;
pub mod gpus;
pub mod hosts;
pub mod pool;
pub mod queue;
pub mod quotas;
pub mod redact;
mod rendered;
pub mod sagas;
pub mod servers;
pub mod sessions;
mod shared;
pub mod tokens;
pub mod usage;
pub mod vms;
pub mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpgpums::{HostId, VmId};
use tokio::sync::Notify;

use crate::agents::{HostAgents, InProcessAgents};
use crate::auth::{HasKeys, Keys};
use crate::cloud::sim::SimCloud;
use crate::cloud::Cloud;
use crate::config::Config;
use crate::db::{Backend, Db, Written};
use crate::lanes::LaneThread;
use crate::metrics::Metrics;
use crate::model::VmRecord;
use crate::openstack::TokenValidator;
use crate::policy::LivePolicy;

pub use background::reconciler::ReconcilerStatus;

/// The service: configuration, storage, side-effect backends and shared state.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub db: Db,
    pub keys: Keys,
    /// Who may do what (`[auth] policy_file` over the defaults).
    pub policy: LivePolicy,
    pub cloud: Arc<dyn Cloud>,
    pub agents: Arc<dyn HostAgents>,
    /// The simulated cloud when it is the backend: it learns of hosts as they register.
    pub sim: Option<Arc<SimCloud>>,
    in_process_agents: Option<Arc<InProcessAgents>>,
    keystone: Option<Arc<TokenValidator>>,
    /// Where notifications are published, if anywhere.
    pub broker: Option<Arc<dyn crate::notifier::Broker>>,
    pub metrics: Metrics,
    /// The pool and VM gauges of `/metrics`, computed at most once per refresh period.
    gauges: crate::metrics::GaugeCache,
    /// The usage counters of `/metrics`, never shown lower than before.
    usage_counters: crate::metrics::UsageCounters,
    pool: pool::PoolCache,
    /// This process's id as a saga owner.
    instance: String,
    /// Sagas running in this process and what only they carry.
    sagas: SagaRegistry,
    /// Serializes this process's pushes to each host, and lets one push stand for the pushes
    /// requested before it read the host's routes (see [`App::push_routes`]).
    host_locks: Mutex<HashMap<HostId, Arc<HostPushes>>>,
    /// The background tasks, their triggers and how each last went.
    tasks: background::driver::Driver,
    /// When this process last looked at the cloud's changed servers (see [`background::drift`]).
    cloud_seen: Mutex<Option<std::time::SystemTime>>,
    /// Whether some GPU's host runs its servers (see [`servers`]): until one does, launches
    /// and releases skip the servers' work.
    managed_seen: std::sync::atomic::AtomicBool,
    /// Requests waiting for a VM to settle.
    watchers: watch::VmWatchers,
    /// Each VM's view as last rendered, while its versions hold.
    rendered: rendered::RenderedViews,
    /// Group commit: the batched reads and writes, their tasks and the SQLite writer lane.
    batchers: Batchers,
    /// Where background work runs on PostgreSQL (see [`crate::lanes`]). On SQLite one
    /// connection serves both lanes, so background work stays on the requests' runtime.
    background: Option<LaneThread>,
}

/// Group commit (see [`batch`]): one batcher per kind of batched read or write, the tasks that
/// write them, and where those run on SQLite.
#[derive(Debug)]
struct Batchers {
    /// Reservations and releases of cGPUs.
    bookings: batch::Batcher<bookings::Booking, bookings::Booked>,
    /// Reads of VMs with their cGPUs.
    vm_reads: batch::Batcher<VmId, Option<Box<vms::VmDetails>>>,
    /// The cGPUs those reads found, which the next reads skip while unchanged.
    read_cgpus: vms::ReadCgpus,
    /// Reads of what VMs' views show besides the VMs.
    view_extras: batch::Batcher<VmId, queue::ViewExtras>,
    /// The sagas' and terminations' conditional VM writes.
    vm_writes: batch::Batcher<vms::BatchedVmWrite, (VmRecord, Written)>,
    /// New generations of hosts' route tables.
    route_tables: batch::Batcher<HostId, hosts::TableRead>,
    /// Generations the hosts' agents confirmed.
    applied_generations: batch::Batcher<(HostId, u64), ()>,
    /// The batch writers' tasks.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Where the batch tasks run on SQLite.
    writer: Option<LaneThread>,
}

/// The sagas running in this process (see [`sagas`]), and what only they carry.
#[derive(Debug, Default)]
struct SagaRegistry {
    /// Each running saga, with the signal that wakes it for a termination.
    running: Mutex<HashMap<VmId, RunningSaga>>,
    /// The tenants' cloud credentials of launches whose server is not created yet: kept in memory
    /// only, for the saga that creates the server as the tenant. Not a saga parameter: a secret
    /// is never stored. A saga resumed elsewhere, or a queued launch, creates the server through
    /// the launch's delegation instead (see `delegations`).
    tenant_tokens: Mutex<HashMap<VmId, crate::cloud::TenantToken>>,
}

impl App {
    /// Builds the service and starts its batch writers (inside a tokio runtime).
    pub fn new(
        mut config: Config,
        db: Db,
        keys: Keys,
        policy: LivePolicy,
        backends: Backends,
    ) -> Result<Arc<App>, std::io::Error> {
        let background = match db.backend() {
            Backend::Sqlite => None,
            Backend::Postgres => Some(LaneThread::background()?),
        };
        let lane = background.is_some();
        let writer = match db.backend() {
            Backend::Sqlite => Some(LaneThread::writer()?),
            Backend::Postgres => None,
        };
        config.apply_cloud_defaults();
        let tasks = background::driver::Driver::new(background::tasks(backends.broker.is_some()));
        let app = Arc::new(App {
            config,
            db,
            keys,
            cloud: backends.cloud,
            agents: backends.agents,
            sim: backends.sim,
            in_process_agents: backends.in_process_agents,
            keystone: backends.keystone,
            broker: backends.broker,
            policy,
            metrics: Metrics::default(),
            gauges: crate::metrics::GaugeCache::default(),
            usage_counters: crate::metrics::UsageCounters::default(),
            pool: pool::PoolCache::new(),
            instance: uuid::Uuid::new_v4().to_string(),
            sagas: SagaRegistry::default(),
            host_locks: Mutex::new(HashMap::new()),
            tasks,
            cloud_seen: Mutex::new(None),
            managed_seen: std::sync::atomic::AtomicBool::new(false),
            watchers: watch::VmWatchers::default(),
            rendered: rendered::RenderedViews::default(),
            batchers: Batchers {
                bookings: batch::Batcher::shared(),
                vm_reads: batch::Batcher::for_lanes(lane),
                read_cgpus: vms::ReadCgpus::default(),
                view_extras: batch::Batcher::for_lanes(lane),
                vm_writes: batch::Batcher::for_lanes(lane),
                route_tables: batch::Batcher::for_lanes(lane),
                applied_generations: batch::Batcher::for_lanes(lane),
                tasks: Mutex::new(Vec::new()),
                writer,
            },
            background,
        });
        let main = tokio::runtime::Handle::current();
        let requests = app.batchers.writer.as_ref().map_or(&main, |writer| writer.runtime());
        let background =
            app.background.as_ref().map(|lane| (lane.runtime(), batch::MAX_BACKGROUND_BATCH));
        let this = Arc::downgrade(&app);
        let tasks = [
            app.batchers.bookings.start(
                requests,
                background,
                this.clone(),
                bookings::write_bookings,
            ),
            app.batchers.vm_reads.start(requests, background, this.clone(), vms::read_vms),
            app.batchers.view_extras.start(
                requests,
                background,
                this.clone(),
                queue::read_view_extras,
            ),
            app.batchers.vm_writes.start(requests, background, this.clone(), vms::write_vms),
            app.batchers.route_tables.start(
                requests,
                background,
                this.clone(),
                hosts::read_route_tables,
            ),
            app.batchers.applied_generations.start(
                requests,
                background,
                this,
                hosts::write_applied_generations,
            ),
        ]
        .concat();
        *app.batchers.tasks.lock().expect("batch tasks") = tasks;
        Ok(app)
    }

    /// Starts the background tasks' loops: the reconciler's first pass at once, in its order.
    pub fn start_background_tasks(self: &Arc<Self>) {
        let app = self.clone();
        let first = async move {
            app.reconcile_once().await;
        };
        background::driver::Driver::start(self, first, &background::reconciler::PASS);
    }

    /// Stops the background tasks' loops where they stand.
    pub fn stop_background_tasks(&self) {
        self.tasks.stop();
    }

    /// Every background task of this process as admins see it.
    pub fn background_tasks(&self) -> Vec<gsaas_api_types::BackgroundTaskView> {
        self.tasks.views(&self.config)
    }

    /// Activates the background task `name` now and waits for it; `None` when this process runs
    /// no such task.
    pub async fn activate_background_task(
        self: &Arc<Self>,
        name: &str,
    ) -> Option<gsaas_api_types::BackgroundTaskView> {
        let task = background::driver::TaskName::parse(name)?;
        self.tasks.activate(self, task).await?.ok();
        self.background_tasks().into_iter().find(|t| t.name == name)
    }

    /// Starts background work in the background lane (see [`crate::lanes`]).
    pub(crate) fn spawn_background<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.background {
            Some(lane) => lane.runtime().spawn(work),
            None => tokio::spawn(work),
        }
    }

    fn host_lock(&self, host: &HostId) -> Arc<HostPushes> {
        self.host_locks.lock().expect("host locks").entry(host.clone()).or_default().clone()
    }
}

/// The side-effect backends an [`App`] uses; the simulated ones also by their concrete types, for
/// inspection.
#[derive(Debug)]
pub struct Backends {
    pub cloud: Arc<dyn Cloud>,
    pub agents: Arc<dyn HostAgents>,
    pub sim: Option<Arc<SimCloud>>,
    pub in_process_agents: Option<Arc<InProcessAgents>>,
    /// Validates tenants' Keystone tokens (auth mode `keystone`).
    pub keystone: Option<Arc<TokenValidator>>,
    /// Where notifications are published (`[notifications] transport_url`).
    pub broker: Option<Arc<dyn crate::notifier::Broker>>,
}

#[derive(Debug)]
struct RunningSaga {
    wake: Arc<Notify>,
    task: Option<tokio::task::AbortHandle>,
    /// Someone asked for the saga while it ran (a termination just as it finished): run it once
    /// more before leaving, or that request would be lost until the reconciler's next pass.
    again: bool,
}

/// Route pushes to one host: `ticket` counts requests; the lock holds the highest ticket whose
/// change a successful push is known to include.
#[derive(Debug, Default)]
struct HostPushes {
    ticket: std::sync::atomic::AtomicU64,
    covered: tokio::sync::Mutex<u64>,
}

impl App {
    /// The in-process agents, when they are the hosts' backend.
    pub fn in_process_agents(&self) -> Option<&InProcessAgents> {
        self.in_process_agents.as_deref()
    }

    /// Stops every saga task and batch writer of this process where it stands, as a crash would
    /// (tests).
    pub fn abort_sagas(&self) {
        for (_, saga) in self.sagas.running.lock().expect("running sagas").drain() {
            if let Some(task) = saga.task {
                task.abort();
            }
        }
        for task in self.batchers.tasks.lock().expect("batch tasks").drain(..) {
            task.abort();
        }
    }
}

impl App {
    /// Everything `/metrics` serves: live counters and histograms, then the (cached) gauges.
    pub async fn render_metrics(&self) -> Result<String, crate::error::Error> {
        let max_age = std::time::Duration::from_millis(self.config.metrics.gauge_refresh_ms);
        let gauges = self
            .gauges
            .get(max_age, || async {
                let (states, vms, queue, fenced) = {
                    let states = self.db.vm_state_counts().await?;
                    let queue = self.db.queue_lengths().await?;
                    let fenced = self.db.fenced_per_gpu().await?;
                    (states, self.db.counted_vms(None).await?, queue, fenced)
                };
                let mut gauges = self
                    .read_pool_and_quotas(|pool, quotas| {
                        let mut gauges = crate::metrics::render_pool(pool);
                        gauges.push_str(&crate::metrics::render_quotas(quotas, &vms));
                        gauges
                    })
                    .await?;
                gauges.push_str(&crate::metrics::render_vm_states(&states));
                gauges.push_str(&crate::metrics::render_queue(&queue));
                gauges.push_str(&crate::metrics::render_fenced(&fenced));
                let waiting = self.db.waiting_notification_count().await?;
                gauges.push_str(&crate::metrics::render_notifications_waiting(waiting));
                self.fold_usage().await?;
                let totals = self.db.usage_totals(crate::db::now_ms()).await?;
                let totals: Vec<_> = totals
                    .into_iter()
                    .map(|(project, t)| ((project, t.model, t.mode), t.cgpu_ms, t.memory_mib_ms))
                    .collect();
                gauges.push_str(&self.usage_counters.render(&totals));
                Ok::<_, crate::error::Error>(gauges)
            })
            .await?;
        let mut out = String::with_capacity(gauges.len() + 8192);
        self.metrics.render(&mut out);
        self.tasks.render(&mut out);
        self.render_reconciler(&mut out);
        out.push_str(&gauges);
        Ok(out)
    }
}

impl HasKeys for Arc<App> {
    fn keys(&self) -> &Keys {
        &self.keys
    }

    fn keystone(&self) -> Option<&TokenValidator> {
        self.keystone.as_deref()
    }
}
