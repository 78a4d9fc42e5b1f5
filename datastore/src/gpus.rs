//! GPUs: each host's inventory, as its agent or the config reported it.

use std::net::SocketAddrV4;

use gpgpums::{GpuId, HostId};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::corrupt;
use crate::error::Error;
use crate::model::*;

/// The attributes stored as `text`, parsed once per run of rows that store the same (a host's
/// GPUs mostly do; a pool's load reads 100,000): `last` keeps the last parsed.
fn attributes(
    text: String,
    last: &mut Option<(String, gpgpums::GpuAttributes)>,
) -> Result<gpgpums::GpuAttributes, Error> {
    if let Some((_, parsed)) = last.as_ref().filter(|(seen, _)| *seen == text) {
        return Ok(parsed.clone());
    }
    let parsed: gpgpums::GpuAttributes =
        serde_json::from_str(&text).map_err(|_| corrupt("GPU attributes", &text))?;
    *last = Some((text, parsed.clone()));
    Ok(parsed)
}

fn gpu_from_row(
    row: &AnyRow,
    last: &mut Option<(String, gpgpums::GpuAttributes)>,
) -> Result<GpuRecord, Error> {
    let id: String = row.try_get("id")?;
    let host: String = row.try_get("host")?;
    let address: String = row.try_get("rcuda_address")?;
    let attributes = attributes(row.try_get("attributes")?, last)?;
    let parent: Option<String> = row.try_get("parent_gpu")?;
    let partition = match (parent, row.try_get::<Option<String>, _>("mig_profile")?) {
        (None, None) => None,
        (Some(parent), Some(profile)) => Some(gpgpums::Partition {
            parent: GpuId::new(&parent).map_err(|_| corrupt("parent GPU id", &parent))?,
            profile,
        }),
        _ => return Err(corrupt("GPU partition", &id)),
    };
    Ok(GpuRecord {
        id: GpuId::new(&id).map_err(|_| corrupt("GPU id", &id))?,
        host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        model: row.try_get("model")?,
        memory_mib: row.try_get::<i64, _>("memory_mib")? as u64,
        rcuda_address: address.parse().map_err(|_| corrupt("rCUDA address", &address))?,
        rcuda_port: row.try_get::<i64, _>("rcuda_port")? as u16,
        rcuda_gpu_number: row.try_get::<i64, _>("rcuda_gpu_number")? as u32,
        health: row.try_get("health")?,
        attributes,
        partition,
    })
}

const GPU_COLUMNS: &str =
    "g.id, g.host, g.idx, g.model, g.memory_mib, g.rcuda_address, g.rcuda_port, \
     g.rcuda_gpu_number, g.health, g.attributes, g.parent_gpu, g.mig_profile";

/// Every GPU, in pool order.
pub async fn gpus(conn: &mut AnyConnection) -> Result<Vec<GpuRecord>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {GPU_COLUMNS} FROM gpus g JOIN hosts h ON h.name = g.host ORDER BY h.seq, g.idx"
    ))
    .fetch_all(conn)
    .await?;
    let mut last = None;
    rows.iter().map(|row| gpu_from_row(row, &mut last)).collect()
}

/// One host's GPUs, in index order: a registration or heartbeat reads its own host's, not the
/// pool's (through the `(host, idx)` unique index).
pub async fn gpus_of_host(
    conn: &mut AnyConnection,
    host: &HostId,
) -> Result<Vec<GpuRecord>, Error> {
    let rows =
        sqlx::query(&format!("SELECT {GPU_COLUMNS} FROM gpus g WHERE g.host = $1 ORDER BY g.idx"))
            .bind(host.as_str())
            .fetch_all(conn)
            .await?;
    let mut last = None;
    rows.iter().map(|row| gpu_from_row(row, &mut last)).collect()
}

/// Adds a GPU, claiming its rCUDA endpoint (see [`rcuda_endpoint_holder`]): a claim another GPU
/// holds already is a conflict, whichever replica wrote it (the database's unique index).
pub async fn insert_gpu(conn: &mut AnyConnection, gpu: &GpuRecord) -> Result<(), Error> {
    let inserted = sqlx::query(
        "INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
         rcuda_gpu_number, health, rcuda_claimed, attributes, parent_gpu, mig_profile, managed) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(gpu.id.as_str())
    .bind(gpu.host.as_str())
    .bind(i64::from(gpu.index))
    .bind(&gpu.model)
    .bind(gpu.memory_mib as i64)
    .bind(gpu.rcuda_address.to_string())
    .bind(i64::from(gpu.rcuda_port))
    .bind(i64::from(gpu.rcuda_gpu_number))
    .bind(gpu.health.as_deref())
    .bind(i64::from(claims_endpoint(gpu)))
    .bind(serde_json::to_string(&gpu.attributes).map_err(|e| Error::internal(e.to_string()))?)
    .bind(gpu.partition.as_ref().map(|p| p.parent.as_str()))
    .bind(gpu.partition.as_ref().map(|p| p.profile.as_str()))
    .bind(i64::from(gpu.attributes.managed))
    .execute(conn)
    .await;
    match inserted {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Err(endpoint_taken(gpu)),
        Err(e) => Err(e.into()),
    }
}

/// Whether the GPU's rCUDA endpoint is one only it may hold: every routable one. Simulated hosts
/// (in-process agents without a GPU network address) serve nothing, at loopback endpoints.
fn claims_endpoint(gpu: &GpuRecord) -> bool {
    !gpu.rcuda_address.is_loopback()
}

fn endpoint_taken(gpu: &GpuRecord) -> Error {
    Error::Conflict(format!(
        "GPU {}: rCUDA endpoint {}:{} device {} is another GPU's",
        gpu.id, gpu.rcuda_address, gpu.rcuda_port, gpu.rcuda_gpu_number
    ))
}

/// The GPU that holds `gpu`'s rCUDA endpoint already, if one does: a GPU of another host at the
/// same rCUDA server (an address and port belong to one host), or another GPU of the same host
/// at the same server and device number.
pub async fn rcuda_endpoint_holder(
    conn: &mut AnyConnection,
    gpu: &GpuRecord,
) -> Result<Option<GpuRecord>, Error> {
    if !claims_endpoint(gpu) {
        return Ok(None);
    }
    let row = sqlx::query(&format!(
        "SELECT {GPU_COLUMNS} FROM gpus g WHERE g.rcuda_claimed = 1 AND g.rcuda_address = $1 \
         AND g.rcuda_port = $2 AND g.id <> $3 AND (g.host <> $4 OR g.rcuda_gpu_number = $5) \
         LIMIT 1"
    ))
    .bind(gpu.rcuda_address.to_string())
    .bind(i64::from(gpu.rcuda_port))
    .bind(gpu.id.as_str())
    .bind(gpu.host.as_str())
    .bind(i64::from(gpu.rcuda_gpu_number))
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(|row| gpu_from_row(row, &mut None)).transpose()
}

/// Claims the rCUDA endpoint of a GPU that holds none although it is routable (one quarantined
/// when endpoints became unique, see migration 0015), before it is untainted. Another GPU's
/// claim is a conflict; a GPU that holds its claim, or that is not there, is left as it is.
pub async fn claim_rcuda_endpoint(conn: &mut AnyConnection, id: &GpuId) -> Result<(), Error> {
    let row = sqlx::query(&format!(
        "SELECT {GPU_COLUMNS} FROM gpus g WHERE g.id = $1 AND g.rcuda_claimed = 0"
    ))
    .bind(id.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(gpu) = row.as_ref().map(|row| gpu_from_row(row, &mut None)).transpose()? else {
        return Ok(());
    };
    if !claims_endpoint(&gpu) {
        return Ok(());
    }
    if let Some(holder) = rcuda_endpoint_holder(conn, &gpu).await? {
        return Err(Error::Conflict(format!(
            "GPU {id} cannot take cGPUs again: its rCUDA endpoint {}:{} is GPU {}'s (host {})",
            gpu.rcuda_address, gpu.rcuda_port, holder.id, holder.host
        )));
    }
    let claimed = sqlx::query("UPDATE gpus SET rcuda_claimed = 1 WHERE id = $1")
        .bind(id.as_str())
        .execute(conn)
        .await;
    match claimed {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Err(endpoint_taken(&gpu)),
        Err(e) => Err(e.into()),
    }
}

pub async fn delete_gpu(conn: &mut AnyConnection, id: &GpuId) -> Result<(), Error> {
    sqlx::query("DELETE FROM gpus WHERE id = $1").bind(id.as_str()).execute(conn).await?;
    Ok(())
}

/// Every tainted GPU, with why.
pub async fn gpu_taints(conn: &mut AnyConnection) -> Result<Vec<(GpuId, String)>, Error> {
    let rows =
        sqlx::query("SELECT id, taint FROM gpus WHERE taint IS NOT NULL").fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            Ok((GpuId::new(&id).map_err(|_| corrupt("GPU id", &id))?, row.try_get(1)?))
        })
        .collect()
}

/// Taints a GPU with a reason, or untaints it (`None`). False when there is no such GPU.
pub async fn set_gpu_taint(
    conn: &mut AnyConnection,
    id: &GpuId,
    taint: Option<&str>,
) -> Result<bool, Error> {
    let updated = sqlx::query("UPDATE gpus SET taint = $1 WHERE id = $2")
        .bind(taint)
        .bind(id.as_str())
        .execute(conn)
        .await?
        .rows_affected();
    Ok(updated == 1)
}

/// The GPU of `host` whose rCUDA server is at `endpoint`, if one is.
pub async fn gpu_serving(
    conn: &mut AnyConnection,
    host: &HostId,
    endpoint: SocketAddrV4,
) -> Result<Option<GpuId>, Error> {
    let row = sqlx::query(
        "SELECT id FROM gpus WHERE host = $1 AND rcuda_address = $2 AND rcuda_port = $3 \
         ORDER BY idx LIMIT 1",
    )
    .bind(host.as_str())
    .bind(endpoint.ip().to_string())
    .bind(i64::from(endpoint.port()))
    .fetch_optional(conn)
    .await?;
    row.map(|row| {
        let id: String = row.try_get(0)?;
        GpuId::new(&id).map_err(|_| corrupt("GPU id", &id))
    })
    .transpose()
}

/// Records what the GPU's agent says of its health (`None`: healthy).
pub async fn set_gpu_health(
    conn: &mut AnyConnection,
    id: &GpuId,
    health: Option<&str>,
) -> Result<(), Error> {
    sqlx::query("UPDATE gpus SET health = $1 WHERE id = $2")
        .bind(health)
        .bind(id.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Records what the GPU is as its agent now reports it (see [`GpuRecord::attributes`]); its
/// layer stays (a GPU whose server changes layer is another device: `GpuRecord::same_device`).
pub async fn set_gpu_attributes(
    conn: &mut AnyConnection,
    id: &GpuId,
    attributes: &gpgpums::GpuAttributes,
) -> Result<(), Error> {
    let text = serde_json::to_string(attributes).map_err(|e| Error::internal(e.to_string()))?;
    // `managed` in a column of its own too, which the route tables read without the JSON.
    sqlx::query("UPDATE gpus SET attributes = $1, managed = $2 WHERE id = $3")
        .bind(text)
        .bind(i64::from(attributes.managed))
        .bind(id.as_str())
        .execute(conn)
        .await?;
    Ok(())
}
