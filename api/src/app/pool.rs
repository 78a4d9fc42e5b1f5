//! The GPGPUMS pool in memory, kept in step with the database by the pool generation.
//!
//! Deciding needs the whole pool; reading it from the database for every request would cost O(n)
//! per launch. So each process keeps a [`gpgpums::Pool`] and the generation it reflects. Every change
//! of bookings or inventory runs in [`App::with_pool`]: one transaction that first bumps the
//! generation (which serializes such transactions across replicas), reloads the pool if another
//! replica changed it since, lets the caller decide and write, and commits. If anything fails after
//! the pool took a change, the cached pool is dropped and reloaded next time, so memory never holds a
//! decision the database does not. (A refused placement changes nothing and costs no reload.)
//! The project quota ledger ([`gpgpums::QuotaLedger`]) lives beside the pool on the same terms:
//! quota checks happen in the booking's transaction, so replicas cannot both use the last room.
//!
//! The hosts' kinds and states are also mirrored in a [`HostDirectory`] that reads without the
//! pool's lock (held across database writes): the saga asks it where a VM may run and whether a
//! host has an agent, several times per launch, instead of reading the hosts table each time.
//! It is as current as this process's pool: another replica's drain shows here with this
//! process's next pool transaction.
//!
//! The transaction is the datastore's ([`db::PoolChange`]): the app decides on its pool and
//! writes through the change's methods, and never holds a connection.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpgpums::{
    CgpuAssignment, HostId, HostKind, HostState, Placement, Pool, ProjectId, Quota, QuotaLedger,
    RcudaEndpoint, VmHost,
};

use super::App;
use crate::db::{self, PoolChange};
use crate::error::Error;
use crate::model::GpuRecord;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug)]
pub(crate) struct PoolCache {
    inner: tokio::sync::Mutex<Cached>,
    hosts: HostDirectory,
}

/// One host as the [`HostDirectory`] knows it.
#[derive(Debug)]
struct HostSummary {
    name: HostId,
    kind: HostKind,
    state: HostState,
}

/// The hosts of this process's pool, readable without its lock; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct HostDirectory {
    /// None until this process first loads its pool.
    hosts: Mutex<Option<Arc<Directory>>>,
}

/// The schedulable hosts a VM may run on, in name order: compute-rGPU hosts only (`rgpu_only`,
/// remote locality), or any host with an agent.
pub(crate) fn vm_hosts_of<'a>(
    hosts: impl Iterator<Item = (&'a HostId, HostKind, HostState)>,
    rgpu_only: bool,
) -> Arc<[HostId]> {
    let may_run =
        |kind: HostKind| if rgpu_only { kind == HostKind::ComputeRgpu } else { kind.has_agent() };
    let mut names: Vec<HostId> = hosts
        .filter(|(_, kind, state)| *state == HostState::Schedulable && may_run(*kind))
        .map(|(name, _, _)| name.clone())
        .collect();
    names.sort_unstable();
    names.into()
}

/// One publication of the [`HostDirectory`]: the hosts, and where a VM may run, worked out once per
/// change of hosts rather than for every launch (thousands of names at a cloud's scale).
#[derive(Debug)]
struct Directory {
    /// In name order, so that a host is found without reading them all.
    hosts: Vec<HostSummary>,
    /// Schedulable compute-rGPU hosts (remote locality), in name order.
    rgpu_hosts: Arc<[HostId]>,
    /// Schedulable hosts with an agent (any locality), in name order.
    agent_hosts: Arc<[HostId]>,
}

impl HostDirectory {
    fn publish(&self, pool: &Pool) {
        let mut hosts: Vec<HostSummary> = pool
            .hosts()
            .map(|(name, kind, state)| HostSummary { name: name.clone(), kind, state })
            .collect();
        hosts.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let schedulable =
            |rgpu_only| vm_hosts_of(hosts.iter().map(|h| (&h.name, h.kind, h.state)), rgpu_only);
        let directory =
            Directory { rgpu_hosts: schedulable(true), agent_hosts: schedulable(false), hosts };
        *self.hosts.lock().expect("host directory") = Some(Arc::new(directory));
    }

    /// The host's kind and state; `None` when it is not in the directory (or none is published
    /// yet).
    pub(crate) fn host(&self, name: &HostId) -> Option<(HostKind, HostState)> {
        let directory = self.directory()?;
        let at = directory.hosts.binary_search_by(|h| h.name.cmp(name)).ok()?;
        Some((directory.hosts[at].kind, directory.hosts[at].state))
    }

    /// [`vm_hosts_of`] the published hosts.
    pub(crate) fn vm_hosts(&self, rgpu_only: bool) -> Option<Arc<[HostId]>> {
        self.directory()
            .map(|d| if rgpu_only { d.rgpu_hosts.clone() } else { d.agent_hosts.clone() })
    }

    fn directory(&self) -> Option<Arc<Directory>> {
        self.hosts.lock().expect("host directory").clone()
    }
}

#[derive(Debug)]
struct Cached {
    pool: Pool,
    /// Every project's limits and what its VMs' cGPUs hold, as of the same generation.
    quotas: QuotaLedger,
    /// The generation `pool` and `quotas` reflect; -1 when they must be reloaded.
    generation: i64,
}

impl PoolCache {
    pub(crate) fn new() -> Self {
        PoolCache {
            inner: tokio::sync::Mutex::new(Cached {
                pool: Pool::new(),
                quotas: QuotaLedger::default(),
                generation: -1,
            }),
            hosts: HostDirectory::default(),
        }
    }
}

/// Builds the pool and the quota ledger from the database's rows.
fn build(rows: db::PoolRows, default_quota: Quota) -> Result<(Pool, QuotaLedger), Error> {
    let db::PoolRows { hosts, gpus, taints, quotas: limits, cohorts, held, fences } = rows;
    let mut pool = Pool::new();
    for host in &hosts {
        pool.add_host(host.name.clone(), host.kind)?;
        pool.set_host_state(&host.name, host.state)?;
        if let Err(e) = pool.set_host_topology(&host.name, host.topology.clone()) {
            tracing::error!(host = %host.name, error = %e, "stored topology refused: the host is in no group");
        }
        if let Err(e) = pool.set_host_resources(&host.name, host.local_vms) {
            tracing::error!(host = %host.name, error = %e, "stored local-VM offer refused");
        }
    }
    // Round trips after every host, so that each measured host is known.
    for host in &hosts {
        if !host.rtt_us.is_empty() {
            pool.set_host_rtts(&host.name, host.rtt_us.iter().map(|(h, us)| (h.clone(), *us)))?;
        }
    }
    // In pool order, where a partition comes after its parent (a higher index, checked when
    // reported), so each GPU joins at the end.
    for gpu in &gpus {
        pool.add_gpu(gpu.spec())?;
        if gpu.health.is_some() {
            pool.set_gpu_health(&gpu.id, gpu.health.clone())?;
        }
    }
    for (gpu, taint) in taints {
        pool.set_gpu_taint(&gpu, Some(taint))?;
    }
    let mut quotas = QuotaLedger::new(default_quota);
    for (project, quota) in limits {
        quotas.set_limits(project, Some(quota));
    }
    for (name, members) in cohorts {
        quotas.set_cohort(name, Some(members));
    }
    let gpus: HashMap<&str, &GpuRecord> = gpus.iter().map(|g| (g.id.as_str(), g)).collect();
    for held in held {
        let vm = held.vm;
        let cgpus = match held_assignments(&held, &gpus) {
            Ok(cgpus) => cgpus,
            Err(e) => {
                tracing::error!(%vm, error = %e, "stored cGPUs on a GPU the pool does not have");
                continue;
            }
        };
        match ProjectId::new(&held.project) {
            Ok(project) => quotas.restore(vm, &project, &pool.holding(&cgpus)),
            Err(_) => tracing::error!(%vm, "stored cGPUs of a VM with an invalid project"),
        }
        // A local VM with its CPU and memory runs on its cGPUs' host: booked there again.
        let vm_host = match (&held.vm_resources, cgpus.first()) {
            (Some(_), Some(first)) => VmHost::Pinned(first.host.clone()),
            _ => VmHost::AnyAgentHost,
        };
        let placement = Placement {
            vm,
            policy: String::new(),
            vm_host,
            cgpus,
            vm_resources: held.vm_resources,
        };
        if let Err(e) = pool.restore(placement) {
            // Storage says this VM holds cGPUs that no longer fit (an inventory change behind our
            // back). Keep serving; the booking stays in the database for an operator to see.
            tracing::error!(%vm, error = %e, "stored cGPUs do not fit the pool");
        }
    }
    // Fences hold their bookings under their own holders; no project is charged for them.
    for fence in fences {
        let placement = Placement {
            vm: fence.id.holder(),
            policy: String::new(),
            vm_host: VmHost::AnyAgentHost,
            cgpus: fence.cgpus,
            vm_resources: None,
        };
        if let Err(e) = pool.restore(placement) {
            tracing::error!(fence = %fence.id, error = %e, "fenced cGPUs do not fit the pool");
        }
    }
    Ok((pool, quotas))
}

/// A VM's stored cGPUs as the pool books them, each at its GPU's host and rCUDA endpoint.
fn held_assignments(
    held: &db::HeldVm,
    gpus: &HashMap<&str, &GpuRecord>,
) -> Result<Vec<CgpuAssignment>, Error> {
    held.cgpus
        .iter()
        .map(|c| {
            let gpu = gpus
                .get(c.gpu.as_str())
                .ok_or_else(|| Error::internal(format!("no GPU {:?} in the pool", c.gpu)))?;
            Ok(CgpuAssignment {
                index: c.index,
                gpu: gpu.id.clone(),
                host: gpu.host.clone(),
                memory_mib: c.memory_mib,
                mode: c.mode,
                compute_percent: c.compute_percent,
                rcuda: RcudaEndpoint {
                    address: gpu.rcuda_address.into(),
                    port: gpu.rcuda_port,
                    gpu_number: gpu.rcuda_gpu_number,
                },
            })
        })
        .collect()
}

/// The pool and a transaction that bumped its generation; see the module docs. Dropped without
/// [`PoolTx::commit`], the transaction rolls back, and if the pool took part of a change it is
/// reloaded next time.
pub(crate) struct PoolTx<'a> {
    cached: tokio::sync::MutexGuard<'a, Cached>,
    directory: &'a HostDirectory,
    tx: Option<PoolChange>,
    changes_before: u64,
    quota_changes_before: u64,
    host_changes_before: u64,
}

impl PoolTx<'_> {
    /// The pool to decide on and the transaction to write the decision in.
    pub(crate) fn parts(&mut self) -> (&mut Pool, &mut PoolChange) {
        (&mut self.cached.pool, self.tx.as_mut().expect("open until committed"))
    }

    /// The queue's head as the transaction began (it holds the pool's lock: only this
    /// transaction changes it until it ends).
    pub(crate) fn queue_head(&self) -> Option<db::QueueHead> {
        self.tx.as_ref().expect("open until committed").queue_head()
    }

    /// Whether any request waited in the queue when this transaction began.
    pub(crate) fn queue_waits(&self) -> bool {
        self.tx.as_ref().expect("open until committed").queue_waits()
    }

    /// [`Self::parts`] with the quota ledger, which changes with the pool.
    pub(crate) fn parts_with_quotas(&mut self) -> (&mut Pool, &mut QuotaLedger, &mut PoolChange) {
        let cached = &mut *self.cached;
        (&mut cached.pool, &mut cached.quotas, self.tx.as_mut().expect("open until committed"))
    }

    pub(crate) async fn commit(mut self) -> Result<(), Error> {
        let tx = self.tx.take().expect("open until committed");
        let generation = tx.generation();
        match tx.commit().await {
            Ok(()) => {
                self.cached.generation = generation;
                if self.cached.pool.host_changes() != self.host_changes_before {
                    self.directory.publish(&self.cached.pool);
                }
                Ok(())
            }
            Err(e) => {
                self.cached.generation = -1;
                Err(e.into())
            }
        }
    }
}

impl Drop for PoolTx<'_> {
    fn drop(&mut self) {
        let changed = self.cached.pool.changes() != self.changes_before
            || self.cached.quotas.changes() != self.quota_changes_before;
        if self.tx.is_some() && changed {
            self.cached.generation = -1;
        }
    }
}

impl App {
    /// Opens a [`PoolTx`]: locks the pool, begins a transaction that bumps the generation, and
    /// reloads the pool if another replica changed it since.
    pub(crate) async fn pool_tx(&self) -> Result<PoolTx<'_>, Error> {
        let mut cached = self.pool.inner.lock().await;
        let mut tx = self.db.begin_pool_change().await?;
        let generation = tx.generation();
        if cached.generation != generation - 1 {
            let rows = tx.read_pool_rows().await?;
            self.reload(&mut cached, rows, generation - 1)?;
        }
        let changes_before = cached.pool.changes();
        let quota_changes_before = cached.quotas.changes();
        let host_changes_before = cached.pool.host_changes();
        Ok(PoolTx {
            cached,
            directory: &self.pool.hosts,
            tx: Some(tx),
            changes_before,
            quota_changes_before,
            host_changes_before,
        })
    }

    /// Runs `change` on the pool inside a [`PoolTx`] and commits it if `change` succeeds.
    pub(crate) async fn with_pool<T: Send>(
        &self,
        change: impl for<'a> FnOnce(&'a mut Pool, &'a mut PoolChange) -> BoxFuture<'a, Result<T, Error>>
            + Send,
    ) -> Result<T, Error> {
        let mut pool_tx = self.pool_tx().await?;
        let (pool, tx) = pool_tx.parts();
        let value = change(pool, tx).await?;
        pool_tx.commit().await?;
        Ok(value)
    }

    /// Replaces the cached pool with the database's, as of `generation`, and publishes its hosts.
    fn reload(
        &self,
        cached: &mut Cached,
        rows: db::PoolRows,
        generation: i64,
    ) -> Result<(), Error> {
        let started = Instant::now();
        cached.generation = -1;
        (cached.pool, cached.quotas) = build(rows, self.config.quotas.quota())?;
        if let Err(e) = cached.pool.prepare(&self.config.default_policy) {
            tracing::warn!(error = %e, "the default policy's indexes are built at the first launch");
        }
        cached.generation = generation;
        tracing::debug!(
            generation,
            build_ms = started.elapsed().as_millis() as u64,
            "pool rebuilt"
        );
        self.pool.hosts.publish(&cached.pool);
        Ok(())
    }

    /// A host's kind and state as of this process's pool (see [`HostDirectory::host`]).
    pub(crate) fn directory_host(&self, name: &HostId) -> Option<(HostKind, HostState)> {
        self.pool.hosts.host(name)
    }

    /// Where a VM may run as of this process's pool (see [`HostDirectory::vm_hosts`]).
    pub(crate) fn directory_vm_hosts(&self, rgpu_only: bool) -> Option<Arc<[HostId]>> {
        self.pool.hosts.vm_hosts(rgpu_only)
    }

    /// Reads the pool as of the latest generation.
    pub(crate) async fn read_pool<T>(&self, read: impl FnOnce(&Pool) -> T) -> Result<T, Error> {
        self.read_pool_and_quotas(|pool, _| read(pool)).await
    }

    /// Reads the pool and the quota ledger as of the latest generation.
    pub(crate) async fn read_pool_and_quotas<T>(
        &self,
        read: impl FnOnce(&Pool, &QuotaLedger) -> T,
    ) -> Result<T, Error> {
        let mut cached = self.pool.inner.lock().await;
        if cached.generation != self.db.pool_generation().await? {
            let (generation, rows) = self.db.pool_snapshot().await?;
            self.reload(&mut cached, rows, generation)?;
        }
        Ok(read(&cached.pool, &cached.quotas))
    }
}

#[cfg(test)]
mod tests {
    use gpgpums::{HostId, HostKind, HostState, Pool};

    use super::HostDirectory;

    fn host(name: &str) -> HostId {
        HostId::new(name).unwrap()
    }

    /// Hosts are registered in any order; the directory finds each by name, knows no other, and
    /// knows none before a pool is published.
    #[test]
    fn the_directory_finds_hosts_by_name_whatever_their_pool_order() {
        let directory = HostDirectory::default();
        assert_eq!(directory.host(&host("node-b")), None);

        let mut pool = Pool::new();
        let registered = [
            ("node-c", HostKind::ComputeGpu),
            ("node-a", HostKind::Compute),
            ("node-d", HostKind::ComputeRgpu),
            ("node-b", HostKind::ComputeGpu),
        ];
        for (name, kind) in registered {
            pool.add_host(host(name), kind).unwrap();
        }
        pool.set_host_state(&host("node-d"), HostState::Drained).unwrap();
        directory.publish(&pool);

        for (name, kind) in registered {
            let state = if name == "node-d" { HostState::Drained } else { HostState::Schedulable };
            assert_eq!(directory.host(&host(name)), Some((kind, state)), "{name}");
        }
        for unknown in ["node-0", "node-bb", "node-e"] {
            assert_eq!(directory.host(&host(unknown)), None, "{unknown}");
        }
    }
}
