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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use gpgpums::{
    CgpuAssignment, HostId, HostKind, HostState, Placement, Pool, Quota, QuotaLedger,
    RcudaEndpoint, Usage, VmHost,
};

use super::App;
use crate::db::{self, WriteTx};
use crate::error::Error;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug)]
pub(crate) struct PoolCache {
    inner: tokio::sync::Mutex<Cached>,
    hosts: HostDirectory,
}

/// One host as the [`HostDirectory`] knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostSummary {
    pub name: HostId,
    pub kind: HostKind,
    pub state: HostState,
}

/// The hosts of this process's pool, readable without its lock; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct HostDirectory {
    /// None until this process first loads its pool.
    hosts: Mutex<Option<Arc<[HostSummary]>>>,
}

impl HostDirectory {
    fn publish(&self, pool: &Pool) {
        let hosts: Arc<[HostSummary]> = pool
            .hosts()
            .map(|(name, kind, state)| HostSummary { name: name.clone(), kind, state })
            .collect();
        *self.hosts.lock().expect("host directory") = Some(hosts);
    }

    pub(crate) fn get(&self) -> Option<Arc<[HostSummary]>> {
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

/// Builds the pool and the quota ledger from the database.
async fn load(tx: &mut WriteTx, default_quota: Quota) -> Result<(Pool, QuotaLedger), Error> {
    let mut pool = Pool::new();
    for host in db::hosts(tx).await? {
        pool.add_host(host.name.clone(), host.kind)?;
        pool.set_host_state(&host.name, host.state)?;
    }
    let gpus = db::gpus(tx).await?;
    for gpu in &gpus {
        pool.add_gpu(gpu.spec())?;
        if gpu.health.is_some() {
            pool.set_gpu_health(&gpu.id, gpu.health.clone())?;
        }
    }
    for (gpu, taint) in db::gpu_taints(tx).await? {
        pool.set_gpu_taint(&gpu, Some(taint))?;
    }
    let mut quotas = QuotaLedger::new(default_quota);
    for (project, quota) in db::quotas(tx).await? {
        quotas.set_limits(project, Some(quota));
    }
    let projects: std::collections::HashMap<_, _> =
        db::projects_of_vms_with_cgpus(tx).await?.into_iter().collect();
    for (vm, cgpus) in db::all_cgpus(tx).await? {
        match projects.get(&vm) {
            Some(project) => quotas.restore(vm, project, Usage::of_cgpus(&assignments(&cgpus))),
            None => tracing::error!(%vm, "stored cGPUs of a VM without a project"),
        }
        let placement = Placement {
            vm,
            policy: String::new(),
            vm_host: VmHost::AnyAgentHost,
            cgpus: assignments(&cgpus),
        };
        if let Err(e) = pool.restore(placement) {
            // Storage says this VM holds cGPUs that no longer fit (an inventory change behind our
            // back). Keep serving; the booking stays in the database for an operator to see.
            tracing::error!(%vm, error = %e, "stored cGPUs do not fit the pool");
        }
    }
    // Fences hold their bookings under their own holders; no project is charged for them.
    for fence in db::fences(tx).await? {
        let placement = Placement {
            vm: fence.id.holder(),
            policy: String::new(),
            vm_host: VmHost::AnyAgentHost,
            cgpus: fence.cgpus,
        };
        if let Err(e) = pool.restore(placement) {
            tracing::error!(fence = %fence.id, error = %e, "fenced cGPUs do not fit the pool");
        }
    }
    Ok((pool, quotas))
}

/// Stored cGPUs as the pool books them.
fn assignments(cgpus: &[crate::model::CgpuRecord]) -> Vec<CgpuAssignment> {
    cgpus
        .iter()
        .map(|c| CgpuAssignment {
            index: c.index,
            gpu: c.gpu.clone(),
            host: c.host.clone(),
            memory_mib: c.memory_mib,
            mode: c.mode,
            rcuda: RcudaEndpoint {
                address: c.rcuda_address.into(),
                port: c.rcuda_port,
                gpu_number: c.rcuda_gpu_number,
            },
        })
        .collect()
}

/// The pool and a transaction that bumped its generation; see the module docs. Dropped without
/// [`PoolTx::commit`], the transaction rolls back, and if the pool took part of a change it is
/// reloaded next time.
pub(crate) struct PoolTx<'a> {
    cached: tokio::sync::MutexGuard<'a, Cached>,
    directory: &'a HostDirectory,
    tx: Option<WriteTx>,
    generation: i64,
    changes_before: u64,
    quota_changes_before: u64,
    host_changes_before: u64,
}

impl PoolTx<'_> {
    /// The pool to decide on and the transaction to write the decision in.
    pub(crate) fn parts(&mut self) -> (&mut Pool, &mut WriteTx) {
        (&mut self.cached.pool, self.tx.as_mut().expect("open until committed"))
    }

    /// [`Self::parts`] with the quota ledger, which changes with the pool.
    pub(crate) fn parts_with_quotas(&mut self) -> (&mut Pool, &mut QuotaLedger, &mut WriteTx) {
        let cached = &mut *self.cached;
        (&mut cached.pool, &mut cached.quotas, self.tx.as_mut().expect("open until committed"))
    }

    pub(crate) async fn commit(mut self) -> Result<(), Error> {
        let tx = self.tx.take().expect("open until committed");
        match tx.commit().await {
            Ok(()) => {
                self.cached.generation = self.generation;
                if self.cached.pool.host_changes() != self.host_changes_before {
                    self.directory.publish(&self.cached.pool);
                }
                Ok(())
            }
            Err(e) => {
                self.cached.generation = -1;
                Err(e)
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
        let mut tx = self.db.begin().await?;
        let generation = db::bump_generation(&mut tx).await?;
        if cached.generation != generation - 1 {
            self.reload(&mut cached, &mut tx, generation - 1).await?;
        }
        let changes_before = cached.pool.changes();
        let quota_changes_before = cached.quotas.changes();
        let host_changes_before = cached.pool.host_changes();
        Ok(PoolTx {
            cached,
            directory: &self.pool.hosts,
            tx: Some(tx),
            generation,
            changes_before,
            quota_changes_before,
            host_changes_before,
        })
    }

    /// Runs `change` on the pool inside a [`PoolTx`] and commits it if `change` succeeds.
    pub(crate) async fn with_pool<T: Send>(
        &self,
        change: impl for<'a> FnOnce(&'a mut Pool, &'a mut WriteTx) -> BoxFuture<'a, Result<T, Error>>
            + Send,
    ) -> Result<T, Error> {
        let mut pool_tx = self.pool_tx().await?;
        let (pool, tx) = pool_tx.parts();
        let value = change(pool, tx).await?;
        pool_tx.commit().await?;
        Ok(value)
    }

    /// Replaces the cached pool with the database's, as of `generation`, and publishes its hosts.
    async fn reload(
        &self,
        cached: &mut Cached,
        tx: &mut WriteTx,
        generation: i64,
    ) -> Result<(), Error> {
        cached.generation = -1;
        (cached.pool, cached.quotas) = load(tx, self.config.quotas.quota()).await?;
        cached.generation = generation;
        self.pool.hosts.publish(&cached.pool);
        Ok(())
    }

    /// The hosts as of this process's pool (see [`HostDirectory`]).
    pub(crate) fn host_directory(&self) -> Option<Arc<[HostSummary]>> {
        self.pool.hosts.get()
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
        if cached.generation != current_generation(&mut *self.db.conn().await?).await? {
            let mut tx = self.db.begin().await?;
            let generation = current_generation(&mut tx).await?;
            self.reload(&mut cached, &mut tx, generation).await?;
            tx.commit().await?;
        }
        Ok(read(&cached.pool, &cached.quotas))
    }
}

async fn current_generation(conn: &mut sqlx::AnyConnection) -> Result<i64, Error> {
    use sqlx::Row;
    let row = sqlx::query("SELECT generation FROM pool_state WHERE id = 1").fetch_one(conn).await?;
    Ok(row.try_get::<i64, _>(0)?)
}
