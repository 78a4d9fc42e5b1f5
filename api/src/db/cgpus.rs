//! cGPUs: a VM's bookings on GPUs, and the routes they give each host.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use gpgpums::{GpuId, HostId, VmId};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, Param, MAX_ROWS};
use crate::error::Error;
use crate::model::*;

pub(super) const CGPU_COLUMNS: &str =
    "c.vm, c.idx, c.gpu, g.host, c.memory_mib, c.mode, c.masked_address, c.masked_port, \
     g.rcuda_address, g.rcuda_port, g.rcuda_gpu_number, c.seq, c.state";

/// The order of a VM's cGPUs: as attached, a launch's by index.
pub(super) const CGPU_ORDER: &str = "c.seq, c.idx";

fn cgpu_from_row(row: &AnyRow) -> Result<CgpuRecord, Error> {
    cgpu_from_row_at(row, 0)
}

/// A cGPU from [`CGPU_COLUMNS`] starting at column `at`.
pub(super) fn cgpu_from_row_at(row: &AnyRow, at: usize) -> Result<CgpuRecord, Error> {
    let vm: String = row.try_get(at)?;
    let gpu: String = row.try_get(at + 2)?;
    let host: String = row.try_get(at + 3)?;
    let mode: String = row.try_get(at + 5)?;
    let masked: String = row.try_get(at + 6)?;
    let rcuda: String = row.try_get(at + 8)?;
    let state: String = row.try_get(at + 12)?;
    Ok(CgpuRecord {
        vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
        index: row.try_get::<i64, _>(at + 1)? as u32,
        seq: row.try_get(at + 11)?,
        state: CgpuState::parse(&state).ok_or_else(|| corrupt("cGPU state", &state))?,
        gpu: GpuId::new(&gpu).map_err(|_| corrupt("GPU id", &gpu))?,
        host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
        memory_mib: row.try_get::<i64, _>(at + 4)? as u64,
        mode: parse_mode(&mode).ok_or_else(|| corrupt("mode", &mode))?,
        masked_address: masked
            .parse::<Ipv4Addr>()
            .map_err(|_| corrupt("masked address", &masked))?,
        masked_port: row.try_get::<i64, _>(at + 7)? as u16,
        rcuda_address: rcuda.parse().map_err(|_| corrupt("rCUDA address", &rcuda))?,
        rcuda_port: row.try_get::<i64, _>(at + 9)? as u16,
        rcuda_gpu_number: row.try_get::<i64, _>(at + 10)? as u32,
    })
}

const CGPU_INSERT_COLUMNS: &str =
    "vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, state";

/// Books cGPUs.
pub async fn insert_cgpus(conn: &mut AnyConnection, cgpus: &[CgpuRecord]) -> Result<(), Error> {
    let rows = cgpus
        .iter()
        .map(|cgpu| {
            vec![
                Param::text(cgpu.vm.to_string()),
                Param::Int(Some(i64::from(cgpu.index))),
                Param::text(cgpu.gpu.as_str()),
                Param::Int(Some(cgpu.memory_mib as i64)),
                Param::text(mode_str(cgpu.mode)),
                Param::text(cgpu.masked_address.to_string()),
                Param::Int(Some(i64::from(cgpu.masked_port))),
                Param::Int(Some(cgpu.seq)),
                Param::text(cgpu.state.as_str()),
            ]
        })
        .collect();
    // Wider chunks than VMs: a VM may hold a thousand cGPUs.
    fetch_batched(conn, rows, 8 * MAX_ROWS, |values| {
        format!(
            "WITH v ({CGPU_INSERT_COLUMNS}) AS (VALUES {values}) INSERT INTO cgpus ({CGPU_INSERT_COLUMNS}) \
             SELECT {CGPU_INSERT_COLUMNS} FROM v WHERE vm IS NOT NULL"
        )
    })
    .await?;
    Ok(())
}

pub async fn cgpus_of(conn: &mut AnyConnection, vm: VmId) -> Result<Vec<CgpuRecord>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {CGPU_COLUMNS} FROM cgpus c JOIN gpus g ON g.id = c.gpu WHERE c.vm = $1 ORDER BY {CGPU_ORDER}"
    ))
    .bind(vm.to_string())
    .fetch_all(conn)
    .await?;
    rows.iter().map(cgpu_from_row).collect()
}

/// Every booked cGPU, by VM.
pub async fn all_cgpus(conn: &mut AnyConnection) -> Result<BTreeMap<VmId, Vec<CgpuRecord>>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {CGPU_COLUMNS} FROM cgpus c JOIN gpus g ON g.id = c.gpu ORDER BY c.vm, {CGPU_ORDER}"
    ))
    .fetch_all(conn)
    .await?;
    let mut by_vm: BTreeMap<VmId, Vec<CgpuRecord>> = BTreeMap::new();
    for row in &rows {
        let cgpu = cgpu_from_row(row)?;
        by_vm.entry(cgpu.vm).or_default().push(cgpu);
    }
    Ok(by_vm)
}

/// Releases every cGPU of the VMs.
pub async fn delete_cgpus(conn: &mut AnyConnection, vms: &[VmId]) -> Result<(), Error> {
    let ids: Vec<String> = vms.iter().map(|id| id.to_string()).collect();
    fetch_batched(conn, keys(ids.iter().map(String::as_str)), 4 * MAX_ROWS, |values| {
        format!("DELETE FROM cgpus WHERE vm IN (VALUES {values})")
    })
    .await?;
    Ok(())
}

/// Moves the VM's cGPUs in state `from` to state `to` (all of them, or those of `index`).
pub async fn set_cgpu_states(
    conn: &mut AnyConnection,
    vm: VmId,
    index: Option<u32>,
    from: CgpuState,
    to: CgpuState,
) -> Result<u64, Error> {
    let query = match index {
        Some(_) => "UPDATE cgpus SET state = $1 WHERE vm = $2 AND state = $3 AND idx = $4",
        None => "UPDATE cgpus SET state = $1 WHERE vm = $2 AND state = $3",
    };
    let mut query = sqlx::query(query).bind(to.as_str()).bind(vm.to_string()).bind(from.as_str());
    if let Some(index) = index {
        query = query.bind(i64::from(index));
    }
    Ok(query.execute(conn).await?.rows_affected())
}

/// Releases the VM's cGPUs in `state`; returns their indexes.
pub async fn delete_cgpus_in_state(
    conn: &mut AnyConnection,
    vm: VmId,
    state: CgpuState,
) -> Result<Vec<u32>, Error> {
    let rows = sqlx::query("DELETE FROM cgpus WHERE vm = $1 AND state = $2 RETURNING idx")
        .bind(vm.to_string())
        .bind(state.as_str())
        .fetch_all(conn)
        .await?;
    rows.iter().map(|row| Ok(row.try_get::<i64, _>(0)? as u32)).collect()
}

/// The VM an attach with this Idempotency-Key made, and its request's digest.
pub async fn attach_by_idempotency_key(
    conn: &mut AnyConnection,
    project: &str,
    key: &str,
) -> Result<Option<(VmId, String)>, Error> {
    let row = sqlx::query(
        "SELECT vm, request_digest FROM attach_keys WHERE project = $1 AND idempotency_key = $2",
    )
    .bind(project)
    .bind(key)
    .fetch_optional(conn)
    .await?;
    row.map(|row| {
        let vm: String = row.try_get(0)?;
        Ok((vm.parse().map_err(|_| corrupt("VM id", &vm))?, row.try_get(1)?))
    })
    .transpose()
}

/// Records an attach's Idempotency-Key (a key taken meanwhile fails the transaction).
pub async fn insert_attach_key(
    conn: &mut AnyConnection,
    project: &str,
    key: &str,
    vm: VmId,
    digest: &str,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO attach_keys (project, idempotency_key, vm, request_digest, created_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(project)
    .bind(key)
    .bind(vm.to_string())
    .bind(digest)
    .bind(now_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// One routed VM of a host with one of its live cGPUs: the VM's source, and the cGPU's masked
/// and real endpoints (none: the VM has no live cGPU left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedCgpu {
    pub vm: VmId,
    pub fixed_ip: Option<Ipv4Addr>,
    pub tap: Option<String>,
    pub cgpu: Option<CgpuEndpoints>,
}

/// Where a VM reaches one cGPU, and where that really is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgpuEndpoints {
    pub masked: std::net::SocketAddrV4,
    pub target: std::net::SocketAddrV4,
    pub gpu_number: u32,
}

/// The routes each host must serve: the cGPUs of every VM on it whose routes are on, and one row
/// with no cGPU for each such VM that has none left, in one query per [`MAX_ROWS`] hosts.
pub async fn routed_cgpus_on(
    conn: &mut AnyConnection,
    hosts: &[HostId],
) -> Result<BTreeMap<HostId, Vec<RoutedCgpu>>, Error> {
    let address = |text: String, what: &str| -> Result<Ipv4Addr, Error> {
        text.parse().map_err(|_| corrupt(what, &text))
    };
    let mut out: BTreeMap<HostId, Vec<RoutedCgpu>> =
        hosts.iter().map(|h| (h.clone(), Vec::new())).collect();
    let rows = fetch_batched(conn, keys(hosts.iter().map(HostId::as_str)), MAX_ROWS, |values| {
        format!(
            "SELECT v.host, v.id, v.fixed_ip, v.tap, c.masked_address, c.masked_port, g.rcuda_address, \
             g.rcuda_port, g.rcuda_gpu_number FROM vms v \
             LEFT JOIN cgpus c ON c.vm = v.id AND c.state NOT IN ('detaching', 'lost') LEFT JOIN gpus g ON g.id = c.gpu \
             WHERE v.host IN (VALUES {values}) AND v.routes_on = 1 \
             ORDER BY v.host, v.id, {CGPU_ORDER}"
        )
    })
    .await?;
    for row in rows {
        let host: String = row.try_get(0)?;
        let host = HostId::new(&host).map_err(|_| corrupt("host name", &host))?;
        let vm: String = row.try_get(1)?;
        let cgpu = match row.try_get::<Option<String>, _>(4)? {
            None => None,
            Some(masked) => Some(CgpuEndpoints {
                masked: std::net::SocketAddrV4::new(
                    address(masked, "masked address")?,
                    row.try_get::<i64, _>(5)? as u16,
                ),
                target: std::net::SocketAddrV4::new(
                    address(row.try_get(6)?, "rCUDA address")?,
                    row.try_get::<i64, _>(7)? as u16,
                ),
                gpu_number: row.try_get::<i64, _>(8)? as u32,
            }),
        };
        let routed = RoutedCgpu {
            vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
            fixed_ip: row
                .try_get::<Option<String>, _>(2)?
                .map(|ip| address(ip, "fixed IP"))
                .transpose()?,
            tap: row.try_get(3)?,
            cgpu,
        };
        out.entry(host).or_default().push(routed);
    }
    Ok(out)
}
