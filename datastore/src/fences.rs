//! Fences: bookings kept while a host may still route to them (see `migrations/0012_fencing.sql`).

use std::collections::BTreeMap;

use gpgpums::{CgpuAssignment, GpuId, HostId, RcudaEndpoint};
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, MAX_ROWS};
use crate::error::Error;
use crate::model::*;

/// Which of a VM's cGPUs a fence takes.
#[derive(Debug, Clone, Copy)]
pub enum Fenced {
    /// Every one (a termination).
    All,
    /// Those in this state (a detach).
    InState(CgpuState),
    /// This one (a re-home).
    Index(u32),
}

/// Opens a fence of `vm`'s cGPUs on `host` until its agent applies `generation`, copying the
/// bookings `which` names; returns their indexes. The caller then deletes or moves the cGPUs.
pub async fn insert_fence(
    conn: &mut AnyConnection,
    fence: &FenceRecord,
    which: Fenced,
) -> Result<Vec<u32>, Error> {
    sqlx::query(
        "INSERT INTO fences (id, vm, host, generation, reason, created_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(fence.id.to_string())
    .bind(fence.vm.to_string())
    .bind(fence.host.as_str())
    .bind(fence.generation as i64)
    .bind(&fence.reason)
    .bind(fence.created_ms)
    .execute(&mut *conn)
    .await?;
    let copy = "INSERT INTO fenced_cgpus (fence, idx, gpu, memory_mib, mode, compute_percent) \
                SELECT $1, idx, gpu, memory_mib, mode, compute_percent FROM cgpus WHERE vm = $2";
    let query = match which {
        Fenced::All => format!("{copy} RETURNING idx"),
        Fenced::InState(_) => format!("{copy} AND state = $3 RETURNING idx"),
        Fenced::Index(_) => format!("{copy} AND idx = $3 RETURNING idx"),
    };
    let mut query = sqlx::query(&query).bind(fence.id.to_string()).bind(fence.vm.to_string());
    query = match which {
        Fenced::All => query,
        Fenced::InState(state) => query.bind(state.as_str()),
        Fenced::Index(index) => query.bind(i64::from(index)),
    };
    let rows = query.fetch_all(conn).await?;
    rows.iter().map(|row| Ok(row.try_get::<i64, _>(0)? as u32)).collect()
}

/// Moves the VM's cGPU `index` to `gpu` (a re-home: its masked endpoint stays), live again if it
/// was lost.
pub async fn move_cgpu(
    conn: &mut AnyConnection,
    vm: gpgpums::VmId,
    index: u32,
    gpu: &GpuId,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE cgpus SET gpu = $1, state = CASE WHEN state = 'lost' THEN 'live' ELSE state END \
         WHERE vm = $2 AND idx = $3",
    )
    .bind(gpu.as_str())
    .bind(vm.to_string())
    .bind(i64::from(index))
    .execute(&mut *conn)
    .await?;
    super::cgpus::bump_cgpus_versions(conn, [vm]).await
}

/// The cGPUs on `gpus` that a re-home moves (all but those being detached), by VM.
pub async fn cgpus_on_gpus(
    conn: &mut AnyConnection,
    gpus: &[GpuId],
) -> Result<Vec<CgpuRecord>, Error> {
    let rows = fetch_batched(conn, keys(gpus.iter().map(GpuId::as_str)), MAX_ROWS, |values| {
        format!(
            "SELECT {} FROM cgpus c JOIN gpus g ON g.id = c.gpu \
             WHERE c.gpu IN (VALUES {values}) AND c.state <> 'detaching' ORDER BY c.vm, c.idx",
            super::cgpus::CGPU_COLUMNS
        )
    })
    .await?;
    rows.iter().map(|row| super::cgpus::cgpu_from_row_at(row, 0)).collect()
}

/// GPUs that failed and still back cGPUs to re-home: unhealthy (or a partition of an unhealthy
/// GPU), or on a host that is down.
pub async fn failed_gpus_in_use(conn: &mut AnyConnection) -> Result<Vec<GpuId>, Error> {
    let rows = sqlx::query(
        "SELECT DISTINCT g.id FROM gpus g JOIN hosts h ON h.name = g.host \
         JOIN cgpus c ON c.gpu = g.id LEFT JOIN gpus p ON p.id = g.parent_gpu \
         WHERE c.state <> 'detaching' \
         AND (g.health IS NOT NULL OR p.health IS NOT NULL OR h.state = 'unavailable') \
         ORDER BY g.id",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            GpuId::new(&id).map_err(|_| corrupt("GPU id", &id))
        })
        .collect()
}

/// Whether any lost cGPU's GPU works again (see [`recover_lost_cgpus`]).
pub async fn has_recoverable_lost_cgpus(conn: &mut AnyConnection) -> Result<bool, Error> {
    let row = sqlx::query(
        "SELECT 1 FROM cgpus c JOIN gpus g ON g.id = c.gpu JOIN hosts h ON h.name = g.host \
         LEFT JOIN gpus p ON p.id = g.parent_gpu \
         WHERE c.state = 'lost' AND g.health IS NULL AND p.health IS NULL \
         AND h.state <> 'unavailable' LIMIT 1",
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// Lost cGPUs whose GPU works again (healthy, on a host that is up): they can go live where
/// they are. Returns them, marked live (with their VMs' `cgpus_version`, in one transaction).
pub async fn recover_lost_cgpus(
    conn: &mut AnyConnection,
) -> Result<Vec<(gpgpums::VmId, u32)>, Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let rows = sqlx::query(
        "UPDATE cgpus SET state = 'live' WHERE state = 'lost' AND gpu IN \
         (SELECT g.id FROM gpus g JOIN hosts h ON h.name = g.host \
          LEFT JOIN gpus p ON p.id = g.parent_gpu \
          WHERE g.health IS NULL AND p.health IS NULL AND h.state <> 'unavailable') \
         RETURNING vm, idx",
    )
    .fetch_all(&mut *tx)
    .await?;
    let recovered = rows
        .iter()
        .map(|row| {
            let vm: String = row.try_get(0)?;
            Ok((super::vm_id(&vm)?, row.try_get::<i64, _>(1)? as u32))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    super::cgpus::bump_cgpus_versions(&mut tx, recovered.iter().map(|(vm, _)| *vm)).await?;
    tx.commit().await?;
    Ok(recovered)
}

/// Every fence with its bookings.
pub async fn fences(conn: &mut AnyConnection) -> Result<Vec<FenceRecord>, Error> {
    let rows = sqlx::query(
        "SELECT f.id, f.vm, f.host, f.generation, f.reason, f.created_ms, fc.idx, fc.gpu, g.host, \
         fc.memory_mib, fc.mode, g.rcuda_address, g.rcuda_port, g.rcuda_gpu_number, \
         fc.compute_percent \
         FROM fences f JOIN fenced_cgpus fc ON fc.fence = f.id JOIN gpus g ON g.id = fc.gpu \
         ORDER BY f.created_ms, f.id, fc.idx",
    )
    .fetch_all(conn)
    .await?;
    let mut out: Vec<FenceRecord> = Vec::new();
    for row in &rows {
        let id: String = row.try_get(0)?;
        let id: FenceId = id.parse().map_err(|_| corrupt("fence id", &id))?;
        if out.last().is_none_or(|f| f.id != id) {
            let vm: String = row.try_get(1)?;
            let host: String = row.try_get(2)?;
            out.push(FenceRecord {
                id,
                vm: super::vm_id(&vm)?,
                host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
                generation: row.try_get::<i64, _>(3)? as u64,
                reason: row.try_get(4)?,
                created_ms: row.try_get(5)?,
                cgpus: Vec::new(),
            });
        }
        let gpu: String = row.try_get(7)?;
        let host: String = row.try_get(8)?;
        let mode: String = row.try_get(10)?;
        let address: String = row.try_get(11)?;
        let address: std::net::Ipv4Addr =
            address.parse().map_err(|_| corrupt("rCUDA address", &address))?;
        out.last_mut().expect("pushed above").cgpus.push(CgpuAssignment {
            index: row.try_get::<i64, _>(6)? as u32,
            gpu: GpuId::new(&gpu).map_err(|_| corrupt("GPU id", &gpu))?,
            host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
            memory_mib: row.try_get::<i64, _>(9)? as u64,
            mode: parse_mode(&mode).ok_or_else(|| corrupt("mode", &mode))?,
            compute_percent: super::cgpus::compute_percent(row.try_get(14)?)?,
            rcuda: RcudaEndpoint {
                address: address.into(),
                port: row.try_get::<i64, _>(12)? as u16,
                gpu_number: row.try_get::<i64, _>(13)? as u32,
            },
        });
    }
    Ok(out)
}

/// A fence that may be released, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasableFence {
    pub id: FenceId,
    pub host: HostId,
    /// Neither confirmed by the host's agent nor forgotten: older than the bound on fences.
    pub expired: bool,
}

/// The fences whose host's agent confirmed a table at or past their generation, whose host was
/// forgotten, or that were opened before `opened_before_ms` (however the host's agent behaves).
pub async fn releasable_fences(
    conn: &mut AnyConnection,
    opened_before_ms: i64,
) -> Result<Vec<ReleasableFence>, Error> {
    let rows = sqlx::query(
        "SELECT f.id, f.host, \
           CASE WHEN h.applied_generation >= f.generation OR h.forgotten = 1 THEN 0 ELSE 1 END \
         FROM fences f JOIN hosts h ON h.name = f.host \
         WHERE h.applied_generation >= f.generation OR h.forgotten = 1 OR f.created_ms < $1 \
         ORDER BY f.id",
    )
    .bind(opened_before_ms)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            let host: String = row.try_get(1)?;
            Ok(ReleasableFence {
                id: id.parse().map_err(|_| corrupt("fence id", &id))?,
                host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
                expired: row.try_get::<i64, _>(2)? == 1,
            })
        })
        .collect()
}

/// Ends the fences: their bookings go.
pub async fn delete_fences(conn: &mut AnyConnection, ids: &[FenceId]) -> Result<(), Error> {
    let ids: Vec<String> = ids.iter().map(FenceId::to_string).collect();
    for table_and_column in [("fenced_cgpus", "fence"), ("fences", "id")] {
        let (table, column) = table_and_column;
        fetch_batched(conn, keys(ids.iter().map(String::as_str)), MAX_ROWS, |values| {
            format!("DELETE FROM {table} WHERE {column} IN (VALUES {values})")
        })
        .await?;
    }
    Ok(())
}

/// How many cGPUs fences hold, per GPU (for the pool view and metrics).
pub async fn fenced_per_gpu(conn: &mut AnyConnection) -> Result<BTreeMap<GpuId, u32>, Error> {
    let rows =
        sqlx::query("SELECT gpu, COUNT(*) FROM fenced_cgpus GROUP BY gpu").fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            let gpu: String = row.try_get(0)?;
            let n: i64 = row.try_get(1)?;
            Ok((GpuId::new(&gpu).map_err(|_| corrupt("GPU id", &gpu))?, n as u32))
        })
        .collect()
}
