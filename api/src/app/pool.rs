//! The GPGPUMS pool in memory, kept in step with the database by the pool generation.
//!
//! Deciding needs the whole pool; reading it from the database for every request would cost O(n)
//! per launch. So each process keeps a [`gpgpums::Pool`] and the generation it reflects. Every change
//! of bookings or inventory runs in [`App::with_pool`]: one transaction that first bumps the
//! generation (which serializes such transactions across replicas), reloads the pool if another
//! replica changed it since, lets the caller decide and write, and commits. If anything fails after
//! the pool took a change, the cached pool is dropped and reloaded next time, so memory never holds a
//! decision the database does not. (A refused placement changes nothing and costs no reload.)

use std::future::Future;
use std::pin::Pin;

use gpgpums::{CgpuAssignment, Placement, Pool, RcudaEndpoint, VmHost};

use super::App;
use crate::db::{self, WriteTx};
use crate::error::Error;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug)]
pub(crate) struct PoolCache {
    inner: tokio::sync::Mutex<Cached>,
}

#[derive(Debug)]
struct Cached {
    pool: Pool,
    /// The generation `pool` reflects; -1 when it must be reloaded.
    generation: i64,
}

impl PoolCache {
    pub(crate) fn new() -> Self {
        PoolCache { inner: tokio::sync::Mutex::new(Cached { pool: Pool::new(), generation: -1 }) }
    }
}

/// Builds the pool from the database.
async fn load(tx: &mut WriteTx) -> Result<Pool, Error> {
    let mut pool = Pool::new();
    for host in db::hosts(tx).await? {
        pool.add_host(host.name.clone(), host.kind)?;
        pool.set_host_state(&host.name, host.state)?;
    }
    let gpus = db::gpus(tx).await?;
    for gpu in &gpus {
        pool.add_gpu(gpu.spec())?;
    }
    for (vm, cgpus) in db::all_cgpus(tx).await? {
        let placement = Placement {
            vm,
            policy: String::new(),
            vm_host: VmHost::AnyAgentHost,
            cgpus: cgpus
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
                .collect(),
        };
        if let Err(e) = pool.restore(placement) {
            // Storage says this VM holds cGPUs that no longer fit (an inventory change behind our
            // back). Keep serving; the booking stays in the database for an operator to see.
            tracing::error!(%vm, error = %e, "stored cGPUs do not fit the pool");
        }
    }
    Ok(pool)
}

impl App {
    /// Runs `change` on the pool inside one transaction that bumps the pool generation. See the
    /// module docs.
    pub(crate) async fn with_pool<T: Send>(
        &self,
        change: impl for<'a> FnOnce(&'a mut Pool, &'a mut WriteTx) -> BoxFuture<'a, Result<T, Error>>
            + Send,
    ) -> Result<T, Error> {
        let mut cached = self.pool.inner.lock().await;
        let mut tx = self.db.begin().await?;
        let generation = db::bump_generation(&mut tx).await?;
        if cached.generation != generation - 1 {
            cached.generation = -1;
            cached.pool = load(&mut tx).await?;
            cached.generation = generation - 1;
        }
        let changes_before = cached.pool.changes();
        let outcome = change(&mut cached.pool, &mut tx).await;
        match outcome {
            Ok(value) => match tx.commit().await {
                Ok(()) => {
                    cached.generation = generation;
                    Ok(value)
                }
                Err(e) => {
                    cached.generation = -1;
                    Err(e)
                }
            },
            Err(e) => {
                // The transaction rolls back; if the pool took part of the change, reload it next time.
                if cached.pool.changes() != changes_before {
                    cached.generation = -1;
                }
                Err(e)
            }
        }
    }

    /// Reads the pool as of the latest generation.
    pub(crate) async fn read_pool<T>(&self, read: impl FnOnce(&Pool) -> T) -> Result<T, Error> {
        let mut cached = self.pool.inner.lock().await;
        if cached.generation != current_generation(&mut *self.db.pool().acquire().await?).await? {
            let mut tx = self.db.begin().await?;
            let generation = current_generation(&mut tx).await?;
            cached.generation = -1;
            cached.pool = load(&mut tx).await?;
            cached.generation = generation;
            tx.commit().await?;
        }
        Ok(read(&cached.pool))
    }
}

async fn current_generation(conn: &mut sqlx::AnyConnection) -> Result<i64, Error> {
    use sqlx::Row;
    let row = sqlx::query("SELECT generation FROM pool_state WHERE id = 1").fetch_one(conn).await?;
    Ok(row.try_get::<i64, _>(0)?)
}
