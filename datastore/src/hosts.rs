//! Hosts: registration, state, and the generations of their route tables.

use std::collections::BTreeMap;

use gpgpums::{HostId, HostKind, HostState};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, Param, MAX_ROWS};
use crate::error::Error;
use crate::model::*;

fn host_from_row(row: &AnyRow) -> Result<HostRecord, Error> {
    let name: String = row.try_get("name")?;
    let kind: String = row.try_get("kind")?;
    let state: String = row.try_get("state")?;
    Ok(HostRecord {
        name: HostId::new(&name).map_err(|_| corrupt("host name", &name))?,
        seq: row.try_get("seq")?,
        kind: parse_host_kind(&kind).ok_or_else(|| corrupt("host kind", &kind))?,
        state: parse_host_state(&state).ok_or_else(|| corrupt("host state", &state))?,
        drained: row.try_get::<i64, _>("drained")? != 0,
        agent_url: row.try_get("agent_url")?,
        last_seen_ms: row.try_get("last_seen_ms")?,
        routes_generation: generation(row, "routes_generation")?,
        applied_generation: generation(row, "applied_generation")?,
        forgotten: row.try_get::<i64, _>("forgotten")? != 0,
        managed_servers: row.try_get::<i64, _>("managed_servers")? != 0,
        gpu_address: match row.try_get::<Option<String>, _>("gpu_address")? {
            Some(ip) => Some(ip.parse().map_err(|_| corrupt("GPU-network address", &ip))?),
            None => None,
        },
        topology: {
            let text: String = row.try_get("topology")?;
            serde_json::from_str(&text).map_err(|_| corrupt("host topology", &text))?
        },
        rtt_us: {
            let text: String = row.try_get("rtt_us")?;
            serde_json::from_str(&text).map_err(|_| corrupt("host round trips", &text))?
        },
        rtt_recorded_ms: row.try_get("rtt_recorded_ms")?,
        local_vms: resources(row, "local_vm_cpu_milli", "local_vm_memory_mib")?,
    })
}

/// CPU and memory stored in two columns, both NULL or neither.
pub(super) fn resources(
    row: &AnyRow,
    cpu: &str,
    memory: &str,
) -> Result<Option<gpgpums::Resources>, Error> {
    let cpu_milli: Option<i64> = row.try_get(cpu)?;
    let memory_mib: Option<i64> = row.try_get(memory)?;
    match (cpu_milli, memory_mib) {
        (None, None) => Ok(None),
        (Some(cpu_milli), Some(memory_mib)) => {
            let stored = format!("{cpu_milli} / {memory_mib}");
            let cpu_milli = u64::try_from(cpu_milli).map_err(|_| corrupt(cpu, &stored))?;
            let memory_mib = u64::try_from(memory_mib).map_err(|_| corrupt(memory, &stored))?;
            Ok(Some(gpgpums::Resources::new(cpu_milli, memory_mib)))
        }
        _ => Err(corrupt(cpu, "half of CPU and memory")),
    }
}

/// Records what the host offers local VMs (see [`HostRecord::local_vms`]).
pub async fn set_host_local_vms(
    conn: &mut AnyConnection,
    name: &HostId,
    offers: Option<gpgpums::Resources>,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE hosts SET local_vm_cpu_milli = $1, local_vm_memory_mib = $2 WHERE name = $3",
    )
    .bind(offers.map(|o| o.cpu_milli as i64))
    .bind(offers.map(|o| o.memory_mib as i64))
    .bind(name.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

fn generation(row: &AnyRow, column: &str) -> Result<u64, Error> {
    let stored: i64 = row.try_get(column)?;
    u64::try_from(stored).map_err(|_| corrupt(column, &stored.to_string()))
}

const HOST_COLUMNS: &str = "name, seq, kind, state, drained, agent_url, last_seen_ms, \
     routes_generation, applied_generation, forgotten, topology, rtt_us, rtt_recorded_ms, \
     managed_servers, gpu_address, local_vm_cpu_milli, local_vm_memory_mib";

pub async fn hosts(conn: &mut AnyConnection) -> Result<Vec<HostRecord>, Error> {
    let rows = sqlx::query(&format!("SELECT {HOST_COLUMNS} FROM hosts ORDER BY seq"))
        .fetch_all(conn)
        .await?;
    rows.iter().map(host_from_row).collect()
}

pub async fn host(conn: &mut AnyConnection, name: &HostId) -> Result<Option<HostRecord>, Error> {
    let row = sqlx::query(&format!("SELECT {HOST_COLUMNS} FROM hosts WHERE name = $1"))
        .bind(name.as_str())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(host_from_row).transpose()
}

pub async fn insert_host(
    conn: &mut AnyConnection,
    name: &HostId,
    kind: HostKind,
    agent_url: Option<&str>,
    topology: &gpgpums::Topology,
    now: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO hosts (name, seq, kind, state, drained, agent_url, last_seen_ms, topology) \
         VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM hosts), $2, 'schedulable', 0, $3, $4, \
         $5)",
    )
    .bind(name.as_str())
    .bind(kind.as_str())
    .bind(agent_url)
    .bind(now)
    .bind(topology_json(topology)?)
    .execute(conn)
    .await?;
    Ok(())
}

fn topology_json(topology: &gpgpums::Topology) -> Result<String, Error> {
    serde_json::to_string(topology).map_err(|e| Error::internal(e.to_string()))
}

/// Records where the host now sits in the network.
pub async fn set_host_topology(
    conn: &mut AnyConnection,
    name: &HostId,
    topology: &gpgpums::Topology,
) -> Result<(), Error> {
    sqlx::query("UPDATE hosts SET topology = $1 WHERE name = $2")
        .bind(topology_json(topology)?)
        .bind(name.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Records the round trips the host's agent measured, at `now`.
pub async fn set_host_rtts(
    conn: &mut AnyConnection,
    name: &HostId,
    rtt_us: &BTreeMap<HostId, u32>,
    now: i64,
) -> Result<(), Error> {
    let text = serde_json::to_string(rtt_us).map_err(|e| Error::internal(e.to_string()))?;
    sqlx::query("UPDATE hosts SET rtt_us = $1, rtt_recorded_ms = $2 WHERE name = $3")
        .bind(text)
        .bind(now)
        .bind(name.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a host's registration or heartbeat: a forgotten host is known again.
pub async fn touch_host(
    conn: &mut AnyConnection,
    name: &HostId,
    agent_url: Option<&str>,
    now: i64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE hosts SET agent_url = $1, last_seen_ms = $2, forgotten = 0 WHERE name = $3",
    )
    .bind(agent_url)
    .bind(now)
    .bind(name.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

/// [`touch_host`] for in-process hosts (no agent URL), a statement per [`super::MAX_ROWS`] hosts.
pub async fn touch_hosts(
    conn: &mut AnyConnection,
    names: &[HostId],
    now: i64,
) -> Result<(), Error> {
    let postgres = conn.backend_name() == "PostgreSQL";
    let keys = keys(sorted(names).map(HostId::as_str));
    fetch_batched(conn, keys, MAX_ROWS, |values| {
        let named = hosts_named_in(postgres, &format!("VALUES {values}"), "");
        format!("UPDATE hosts SET agent_url = NULL, last_seen_ms = {now}, forgotten = 0 {named}")
    })
    .await?;
    Ok(())
}

/// The `FROM .. WHERE ..` of an `UPDATE hosts` of the hosts whose names `names` (a query)
/// answers, `from` (`, v` or nothing) joined. On PostgreSQL the rows are locked in name order
/// first: two statements that update several hosts each (replicas pushing tables side by side,
/// the heartbeats of in-process hosts) otherwise lock them in the order they find them, which
/// differs as rows move, and deadlock. SQLite has one writer.
fn hosts_named_in(postgres: bool, names: &str, from: &str) -> String {
    if postgres {
        format!(
            "FROM (SELECT name AS locked FROM hosts WHERE name IN ({names}) \
             ORDER BY name FOR UPDATE) AS l{from} WHERE hosts.name = l.locked"
        )
    } else if from.is_empty() {
        format!("WHERE hosts.name IN ({names})")
    } else {
        format!("FROM {} WHERE hosts.name IN ({names})", from.trim_start_matches(", "))
    }
}

/// `names` in name order: batches split at [`MAX_ROWS`] lock their rows in the same order.
fn sorted(names: &[HostId]) -> impl Iterator<Item = &HostId> {
    let mut names: Vec<&HostId> = names.iter().collect();
    names.sort();
    names.into_iter()
}

/// Records whether the host's agent runs its GPUs' servers (see [`HostRecord::managed_servers`]),
/// and its address on the GPU network.
pub async fn set_host_servers(
    conn: &mut AnyConnection,
    name: &HostId,
    managed: bool,
    gpu_address: Option<std::net::Ipv4Addr>,
) -> Result<(), Error> {
    sqlx::query("UPDATE hosts SET managed_servers = $1, gpu_address = $2 WHERE name = $3")
        .bind(i64::from(managed))
        .bind(gpu_address.map(|ip| ip.to_string()))
        .bind(name.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn set_host_state(
    conn: &mut AnyConnection,
    name: &HostId,
    state: HostState,
    drained: bool,
) -> Result<(), Error> {
    sqlx::query("UPDATE hosts SET state = $1, drained = $2 WHERE name = $3")
        .bind(host_state_str(state))
        .bind(i64::from(drained))
        .bind(name.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Starts a new generation of each host's table; returns the hosts as of it (`routes_generation`
/// is the new generation). Unknown hosts are left out.
pub async fn next_routes_generations(
    conn: &mut AnyConnection,
    hosts: &[HostId],
) -> Result<Vec<HostRecord>, Error> {
    let postgres = conn.backend_name() == "PostgreSQL";
    let rows = fetch_batched(conn, keys(sorted(hosts).map(HostId::as_str)), MAX_ROWS, |values| {
        let named = hosts_named_in(postgres, &format!("VALUES {values}"), "");
        format!(
            "UPDATE hosts SET routes_generation = routes_generation + 1 {named} \
             RETURNING {HOST_COLUMNS}"
        )
    })
    .await?;
    rows.iter().map(host_from_row).collect()
}

/// Hosts as of new generations of their tables, with the routes and (for hosts that run their
/// GPUs' servers) the servers read under them.
pub type RouteTables = (
    Vec<HostRecord>,
    BTreeMap<HostId, Vec<super::RoutedCgpu>>,
    BTreeMap<HostId, Vec<rodvr_contract::protocol::ServerSpec>>,
);

impl super::Db {
    /// New generations of the hosts' tables (see [`next_routes_generations`]) with the routes
    /// read under them. A generation's table must be read after the generation was taken, and no
    /// older table may be read later than a newer one: on PostgreSQL, whose replicas push side by
    /// side, one transaction holds the hosts' rows locked from the new generation to the read. On
    /// SQLite one process serves the database through one connection, and holding it between the
    /// two statements is enough. `every_host`: the routes are read for every host at once (see
    /// [`super::routed_cgpus_everywhere`]) rather than for `hosts` alone.
    pub async fn next_route_tables(
        &self,
        hosts: &[HostId],
        every_host: bool,
    ) -> Result<RouteTables, Error> {
        async fn read(
            conn: &mut AnyConnection,
            hosts: &[HostId],
            every_host: bool,
        ) -> Result<RouteTables, Error> {
            let records = next_routes_generations(conn, hosts).await?;
            let routes = if every_host {
                super::routed_cgpus_everywhere(conn).await?
            } else {
                super::routed_cgpus_on(conn, hosts).await?
            };
            // Only hosts that run their GPUs' servers list them (most hosts: no statement).
            let managed: Vec<HostId> =
                records.iter().filter(|h| h.managed_servers).map(|h| h.name.clone()).collect();
            let servers = if managed.is_empty() {
                BTreeMap::new()
            } else {
                super::served_cgpus_on(conn, &managed).await?
            };
            Ok((records, routes, servers))
        }
        if self.backend() == super::Backend::Sqlite {
            read(&mut *self.connection().await?, hosts, every_host).await
        } else {
            let mut tx = self.begin_write().await?;
            let tables = read(&mut tx, hosts, every_host).await?;
            tx.commit().await?;
            Ok(tables)
        }
    }
}

/// Moves the host's table generation past `generation` (an agent holds a newer one than we know).
pub async fn raise_routes_generation(
    conn: &mut AnyConnection,
    name: &HostId,
    generation: u64,
) -> Result<(), Error> {
    rodvr_contract::protocol::check_generation(generation).map_err(Error::internal)?;
    sqlx::query(
        "UPDATE hosts SET routes_generation = $1 WHERE name = $2 AND routes_generation < $1",
    )
    .bind(generation as i64)
    .bind(name.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the generation each host's agent confirmed (never moving one back).
pub async fn set_applied_generations(
    conn: &mut AnyConnection,
    applied: &[(HostId, u64)],
) -> Result<(), Error> {
    let postgres = conn.backend_name() == "PostgreSQL";
    let mut applied = applied.to_vec();
    applied.sort();
    let rows = applied
        .iter()
        .map(|(host, generation)| {
            vec![Param::text(host.as_str()), Param::Int(Some(*generation as i64))]
        })
        .collect();
    fetch_batched(conn, rows, MAX_ROWS, |values| {
        let named = hosts_named_in(postgres, "SELECT name FROM v", ", v");
        format!(
            "WITH v (name, generation) AS (VALUES {values}) \
             UPDATE hosts SET applied_generation = v.generation {named} \
             AND hosts.name = v.name AND hosts.applied_generation < v.generation"
        )
    })
    .await?;
    Ok(())
}

/// Declares the host dead (see [`HostRecord::forgotten`]): unavailable, and its routes count as
/// gone.
pub async fn forget_host(conn: &mut AnyConnection, name: &HostId) -> Result<(), Error> {
    sqlx::query("UPDATE hosts SET state = 'unavailable', forgotten = 1 WHERE name = $1")
        .bind(name.as_str())
        .execute(conn)
        .await?;
    Ok(())
}
