//! The servers a host's agent runs, one per cGPU of its GPUs (`[gpu_servers] managed`, migration
//! 0030): which cGPUs each such host's table lists, and the port each one's server accepts on
//! (and how often it was ended for its memory), as its agent last answered or reported. A cGPU on a managed GPU is routed to that port only,
//! and not at all while it has none (see [`super::routed_cgpus_on`]).

use std::collections::{BTreeMap, BTreeSet};

use gpgpums::{GpuId, HostId, VmId};
use rodvr_contract::protocol::ServerSpec;
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, Param, MAX_ROWS};
use crate::error::Error;

/// The cGPUs each managed host of `hosts` serves: those on its managed GPUs, but detaching or
/// lost ones, in (VM, index) order. Hosts with none are left out.
pub async fn served_cgpus_on(
    conn: &mut AnyConnection,
    hosts: &[HostId],
) -> Result<BTreeMap<HostId, Vec<ServerSpec>>, Error> {
    let rows = fetch_batched(conn, keys(hosts.iter().map(HostId::as_str)), MAX_ROWS, |values| {
        format!(
            "SELECT g.host, c.vm, c.idx, c.gpu, c.memory_mib, c.mode, v.host, vh.gpu_address, \
             c.compute_percent \
             FROM cgpus c JOIN gpus g ON g.id = c.gpu JOIN vms v ON v.id = c.vm \
             LEFT JOIN hosts vh ON vh.name = v.host \
             WHERE g.host IN (VALUES {values}) AND g.managed = 1 \
             AND c.state IN ('live', 'attaching') ORDER BY g.host, c.vm, c.idx"
        )
    })
    .await?;
    let mut out: BTreeMap<HostId, Vec<ServerSpec>> = BTreeMap::new();
    for row in rows {
        let host = host_name(&row)?;
        let gpu: &str = row.try_get(3)?;
        let mode: &str = row.try_get(5)?;
        let memory_mib = row.try_get::<i64, _>(4)? as u64;
        // Its VM's host, whose agent masquerades the VM's traffic behind its GPU-network
        // address; none for a VM on this host (its route is local), or a VM not placed yet.
        let vm_host: Option<&str> = row.try_get(6)?;
        let clients = match (vm_host, row.try_get::<Option<&str>, _>(7)?) {
            (Some(vm_host), Some(ip)) if vm_host != host.as_str() => {
                vec![ip.parse().map_err(|_| corrupt("GPU-network address", ip))?]
            }
            _ => Vec::new(),
        };
        out.entry(host).or_default().push(ServerSpec {
            vm: super::vm_id(row.try_get(1)?)?,
            index: row.try_get::<i64, _>(2)? as u32,
            gpu: GpuId::new(gpu).map_err(|_| corrupt("GPU id", gpu))?,
            // An exclusive cGPU has its whole GPU.
            memory_mib: (mode != "exclusive").then_some(memory_mib),
            clients,
            compute_percent: super::cgpus::compute_percent(row.try_get(8)?)?,
        });
    }
    Ok(out)
}

/// A cGPU's server as its host's agent answered or reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedServer {
    pub vm: VmId,
    pub index: u32,
    /// The GPU it serves the cGPU on.
    pub gpu: GpuId,
    /// Where it accepts; none while it does not.
    pub port: Option<u16>,
    /// How many times its agent ended it for holding more GPU memory than its share.
    pub over_share_ends: u32,
    /// Its agent routed its cGPU (of a VM on the same host) to `port` itself, in the table it
    /// answers: the VM's route needs no new push for it.
    pub routed_here: bool,
}

/// What a host's servers changed: the VMs whose cGPUs' ports moved (their hosts' tables must be
/// pushed again; not for a move the agent routed itself), and the cGPUs whose servers were
/// ended for their memory since last recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServersChanged {
    pub moved: BTreeSet<VmId>,
    pub over_share: Vec<(VmId, u32)>,
}

/// A recorded server: its GPU, port and memory ends (none of either: not recorded).
type Recorded = (String, Option<u16>, Option<u32>);

impl super::Db {
    /// Records the servers of `host` (as its agent answered or reported): for each cGPU on one
    /// of the host's GPUs (anything else an agent claims is left out), the port its server
    /// accepts on, or none, and how often it was ended for its memory; the host's cGPUs not
    /// reported have no port. One transaction.
    pub async fn record_servers(
        &self,
        host: &HostId,
        reported: &[ReportedServer],
    ) -> Result<ServersChanged, Error> {
        let mut tx = self.begin_write().await?;
        // The host's cGPUs, with their servers as recorded.
        let rows = sqlx::query(
            "SELECT c.vm, c.idx, c.gpu, s.port, s.over_share_ends FROM cgpus c \
             JOIN gpus g ON g.id = c.gpu \
             LEFT JOIN cgpu_servers s ON s.vm = c.vm AND s.idx = c.idx AND s.gpu = c.gpu \
             WHERE g.host = $1",
        )
        .bind(host.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let mut recorded: BTreeMap<(VmId, u32), Recorded> = BTreeMap::new();
        for row in &rows {
            let vm = super::vm_id(row.try_get(0)?)?;
            let index = row.try_get::<i64, _>(1)? as u32;
            let port = row.try_get::<Option<i64>, _>(3)?.map(|p| p as u16);
            let ends = row.try_get::<Option<i64>, _>(4)?.map(|n| n as u32);
            recorded.insert((vm, index), (row.try_get(2)?, port, ends));
        }
        let mut now: BTreeMap<(VmId, u32), (Option<u16>, u32)> = BTreeMap::new();
        let mut routed_here: BTreeSet<(VmId, u32)> = BTreeSet::new();
        for server in reported {
            let key = (server.vm, server.index);
            if recorded.get(&key).is_some_and(|(on, ..)| on == server.gpu.as_str()) {
                let port = server.port.filter(|p| *p != 0);
                now.insert(key, (port, server.over_share_ends));
                if server.routed_here && port.is_some() {
                    routed_here.insert(key);
                }
            }
        }
        let mut changed = ServersChanged::default();
        let (mut delete, mut insert) = (Vec::new(), Vec::new());
        for ((vm, index), (gpu, port, ends)) in &recorded {
            let (new_port, new_ends) = match now.get(&(*vm, *index)) {
                Some((port, ends)) => (*port, Some(*ends)),
                None => (None, None),
            };
            if (new_port, new_ends) == (*port, *ends) {
                continue;
            }
            if new_port != *port && !routed_here.contains(&(*vm, *index)) {
                changed.moved.insert(*vm);
            }
            if new_ends.unwrap_or(0) > ends.unwrap_or(0) {
                changed.over_share.push((*vm, *index));
            }
            let key = vec![Param::text(vm.to_string()), Param::Int(Some(i64::from(*index)))];
            if ends.is_some() {
                delete.push(key.clone());
            }
            if let Some(new_ends) = new_ends {
                let mut row = key;
                row.push(Param::text(gpu.clone()));
                row.push(Param::Int(new_port.map(i64::from)));
                row.push(Param::Int(Some(i64::from(new_ends))));
                insert.push(row);
            }
        }
        fetch_batched(&mut tx, delete, MAX_ROWS, |values| {
            format!(
                "WITH v (vm, idx) AS (VALUES {values}) DELETE FROM cgpu_servers WHERE EXISTS \
                 (SELECT 1 FROM v WHERE v.vm = cgpu_servers.vm AND v.idx = cgpu_servers.idx)"
            )
        })
        .await?;
        fetch_batched(&mut tx, insert, MAX_ROWS, |values| {
            format!(
                "WITH v (vm, idx, gpu, port, ends) AS (VALUES {values}) INSERT INTO \
                 cgpu_servers (vm, idx, gpu, port, over_share_ends) \
                 SELECT vm, idx, gpu, port, ends FROM v WHERE vm IS NOT NULL"
            )
        })
        .await?;
        // Servers of cGPUs no longer on the host's GPUs (released, re-homed): gone with them.
        sqlx::query(
            "DELETE FROM cgpu_servers WHERE gpu IN (SELECT id FROM gpus WHERE host = $1) \
             AND NOT EXISTS (SELECT 1 FROM cgpus c WHERE c.vm = cgpu_servers.vm \
             AND c.idx = cgpu_servers.idx AND c.gpu = cgpu_servers.gpu)",
        )
        .bind(host.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(changed)
    }
}

/// The hosts of managed GPUs that `vm`'s cGPUs are on: their agents start its servers.
pub async fn managed_gpu_hosts_of(
    conn: &mut AnyConnection,
    vm: VmId,
) -> Result<Vec<HostId>, Error> {
    let rows = sqlx::query(
        "SELECT DISTINCT g.host FROM cgpus c JOIN gpus g ON g.id = c.gpu \
         WHERE c.vm = $1 AND g.managed = 1 ORDER BY g.host",
    )
    .bind(vm.to_string())
    .fetch_all(conn)
    .await?;
    rows.iter().map(host_name).collect()
}

/// The hosts `vms` run on.
pub async fn hosts_of_vms(
    conn: &mut AnyConnection,
    vms: &BTreeSet<VmId>,
) -> Result<BTreeSet<HostId>, Error> {
    let ids: Vec<String> = vms.iter().map(VmId::to_string).collect();
    let rows = fetch_batched(conn, keys(ids.iter().map(String::as_str)), MAX_ROWS, |values| {
        format!("SELECT DISTINCT host FROM vms WHERE id IN (VALUES {values}) AND host IS NOT NULL")
    })
    .await?;
    rows.iter().map(host_name).collect()
}

/// A row's first column, a host's name.
fn host_name(row: &sqlx::any::AnyRow) -> Result<HostId, Error> {
    let host: &str = row.try_get(0)?;
    HostId::new(host).map_err(|_| corrupt("host name", host))
}

/// Whether any GPU has managed servers (so that clouds without any skip their work).
pub async fn any_managed_gpu(conn: &mut AnyConnection) -> Result<bool, Error> {
    let row = sqlx::query("SELECT COUNT(*) FROM (SELECT 1 FROM gpus WHERE managed = 1 LIMIT 1) m")
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<i64, _>(0)? > 0)
}
