//! The datastore: SQLite (embedded default) or PostgreSQL (several replicas), through one set of
//! portable queries over sqlx's `Any` driver.
//!
//! Writes go through [`Db::begin`]. On SQLite that also takes a process-wide lock, so writers queue in
//! the process instead of failing with SQLITE_BUSY; on PostgreSQL row locks order them. Queries are
//! plain functions over a connection so the application layer composes them inside one transaction.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gpgpums::{GpuId, HostId, HostKind, HostState, VmId};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, Row};

use crate::cloud::ServerId;
use crate::error::Error;
use crate::model::*;

/// The migrations, in order, embedded so the binary carries its schema.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../../migrations/0001_init.sql")),
    (2, "pending_indexes", include_str!("../../migrations/0002_pending_indexes.sql")),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
    write_lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

/// A write transaction (and, on SQLite, the process's write lock).
#[derive(Debug)]
pub struct WriteTx {
    pub tx: sqlx::Transaction<'static, sqlx::Any>,
    _lock: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await?;
        Ok(())
    }
}

/// A connection for one write statement that is atomic by itself (autocommit): it saves the
/// BEGIN and COMMIT round trips of a [`WriteTx`]. On SQLite it holds the process's write lock too.
#[derive(Debug)]
pub struct WriteConn {
    pub conn: sqlx::pool::PoolConnection<sqlx::Any>,
    _lock: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl std::ops::Deref for WriteConn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.conn
    }
}

impl std::ops::Deref for WriteTx {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.tx
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Db {
    /// Connects and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Db, Error> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(Error::invalid("database_url", "must start with sqlite: or postgres:"));
        };
        if backend == Backend::Sqlite {
            create_sqlite_dir(url);
        }
        let options: AnyConnectOptions = url.parse().map_err(|e| {
            Error::unavailable("database", Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })?;
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 4 } else { 16 })
            // A ping per checkout doubles the round trips of a one-query read; a broken connection
            // surfaces as an error of the query instead, and the pool replaces it.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        for pragma in [
                            "PRAGMA journal_mode = WAL",
                            "PRAGMA synchronous = NORMAL",
                            "PRAGMA busy_timeout = 10000",
                            "PRAGMA foreign_keys = ON",
                        ] {
                            sqlx::query(pragma).execute(&mut *conn).await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| Error::unavailable("database", e))?;
        let db = Db {
            pool,
            backend,
            write_lock: (backend == Backend::Sqlite).then(|| Arc::new(tokio::sync::Mutex::new(()))),
        };
        db.migrate().await?;
        Ok(db)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn begin(&self) -> Result<WriteTx, Error> {
        let lock = match &self.write_lock {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        let tx = self.pool.begin().await?;
        Ok(WriteTx { tx, _lock: lock })
    }

    /// A connection for a single write statement; see [`WriteConn`].
    pub async fn write_conn(&self) -> Result<WriteConn, Error> {
        let lock = match &self.write_lock {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        let conn = self.pool.acquire().await?;
        Ok(WriteConn { conn, _lock: lock })
    }

    async fn migrate(&self) -> Result<(), Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS schema_migrations \
             (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_ms BIGINT NOT NULL)",
        )
        .execute(&self.pool)
        .await?;
        for &(version, name, sql) in MIGRATIONS {
            let mut tx = self.begin().await?;
            let inserted = sqlx::query(
                "INSERT INTO schema_migrations (version, name, applied_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (version) DO NOTHING",
            )
            .bind(version)
            .bind(name)
            .bind(now_ms())
            .execute(&mut *tx.tx)
            .await?
            .rows_affected();
            if inserted == 1 {
                sqlx::raw_sql(sql).execute(&mut *tx.tx).await?;
                tx.commit().await?;
                tracing::info!(version, name, "applied migration");
            }
        }
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), Error> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(|e| Error::unavailable("database", e))?;
        Ok(())
    }
}

fn create_sqlite_dir(url: &str) {
    let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or(path);
    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            let _ = std::fs::create_dir_all(dir);
        }
    }
}

fn corrupt(what: &str, value: &str) -> Error {
    Error::internal(format!("stored {what} {value:?} is not valid"))
}

// ---- pool generation ----

/// Bumps the pool generation; the first statement of every transaction that changes bookings or
/// inventory. Returns the new generation.
pub async fn bump_generation(conn: &mut AnyConnection) -> Result<i64, Error> {
    let row = sqlx::query(
        "UPDATE pool_state SET generation = generation + 1 WHERE id = 1 RETURNING generation",
    )
    .fetch_one(conn)
    .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

// ---- hosts and GPUs ----

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
        routes_generation: row.try_get::<i64, _>("routes_generation")? as u64,
        applied_generation: row.try_get::<i64, _>("applied_generation")? as u64,
    })
}

const HOST_COLUMNS: &str =
    "name, seq, kind, state, drained, agent_url, last_seen_ms, routes_generation, applied_generation";

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
    now: i64,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO hosts (name, seq, kind, state, drained, agent_url, last_seen_ms) \
         VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM hosts), $2, 'schedulable', 0, $3, $4)",
    )
    .bind(name.as_str())
    .bind(kind.as_str())
    .bind(agent_url)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn touch_host(
    conn: &mut AnyConnection,
    name: &HostId,
    agent_url: Option<&str>,
    now: i64,
) -> Result<(), Error> {
    sqlx::query("UPDATE hosts SET agent_url = $1, last_seen_ms = $2 WHERE name = $3")
        .bind(agent_url)
        .bind(now)
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

/// Starts a new generation of the host's table; returns the host as of it (`routes_generation`
/// is the new generation).
pub async fn next_routes_generation(
    conn: &mut AnyConnection,
    name: &HostId,
) -> Result<HostRecord, Error> {
    let row = sqlx::query(&format!(
        "UPDATE hosts SET routes_generation = routes_generation + 1 WHERE name = $1 RETURNING {HOST_COLUMNS}"
    ))
    .bind(name.as_str())
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| Error::NotFound { kind: "host", id: name.to_string() })?;
    host_from_row(&row)
}

/// Moves the host's table generation past `generation` (an agent holds a newer one than we know).
pub async fn raise_routes_generation(
    conn: &mut AnyConnection,
    name: &HostId,
    generation: u64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE hosts SET routes_generation = $1 WHERE name = $2 AND routes_generation < $1",
    )
    .bind(generation as i64)
    .bind(name.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn set_applied_generation(
    conn: &mut AnyConnection,
    name: &HostId,
    generation: u64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE hosts SET applied_generation = $1 WHERE name = $2 AND applied_generation < $1",
    )
    .bind(generation as i64)
    .bind(name.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

fn gpu_from_row(row: &AnyRow) -> Result<GpuRecord, Error> {
    let id: String = row.try_get("id")?;
    let host: String = row.try_get("host")?;
    let address: String = row.try_get("rcuda_address")?;
    Ok(GpuRecord {
        id: GpuId::new(&id).map_err(|_| corrupt("GPU id", &id))?,
        host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        model: row.try_get("model")?,
        memory_mib: row.try_get::<i64, _>("memory_mib")? as u64,
        rcuda_address: address.parse().map_err(|_| corrupt("rCUDA address", &address))?,
        rcuda_port: row.try_get::<i64, _>("rcuda_port")? as u16,
        rcuda_gpu_number: row.try_get::<i64, _>("rcuda_gpu_number")? as u32,
    })
}

const GPU_COLUMNS: &str =
    "g.id, g.host, g.idx, g.model, g.memory_mib, g.rcuda_address, g.rcuda_port, g.rcuda_gpu_number";

/// Every GPU, in pool order.
pub async fn gpus(conn: &mut AnyConnection) -> Result<Vec<GpuRecord>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {GPU_COLUMNS} FROM gpus g JOIN hosts h ON h.name = g.host ORDER BY h.seq, g.idx"
    ))
    .fetch_all(conn)
    .await?;
    rows.iter().map(gpu_from_row).collect()
}

pub async fn insert_gpu(conn: &mut AnyConnection, gpu: &GpuRecord) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, rcuda_gpu_number) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(gpu.id.as_str())
    .bind(gpu.host.as_str())
    .bind(i64::from(gpu.index))
    .bind(&gpu.model)
    .bind(gpu.memory_mib as i64)
    .bind(gpu.rcuda_address.to_string())
    .bind(i64::from(gpu.rcuda_port))
    .bind(i64::from(gpu.rcuda_gpu_number))
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn delete_gpu(conn: &mut AnyConnection, id: &GpuId) -> Result<(), Error> {
    sqlx::query("DELETE FROM gpus WHERE id = $1").bind(id.as_str()).execute(conn).await?;
    Ok(())
}

// ---- VMs ----

const VM_COLUMNS: &str =
    "id, project, owner, name, request, policy, state, error, step, server_id, host, \
                          fixed_ip, tap, routes_on, timings, created_ms, updated_ms, version";

fn vm_from_row(row: &AnyRow) -> Result<VmRecord, Error> {
    let id: String = row.try_get("id")?;
    let request: String = row.try_get("request")?;
    let state: String = row.try_get("state")?;
    let step: String = row.try_get("step")?;
    let host: Option<String> = row.try_get("host")?;
    let fixed_ip: Option<String> = row.try_get("fixed_ip")?;
    let timings: String = row.try_get("timings")?;
    Ok(VmRecord {
        id: id.parse().map_err(|_| corrupt("VM id", &id))?,
        project: row.try_get("project")?,
        owner: row.try_get("owner")?,
        name: row.try_get("name")?,
        spec: serde_json::from_str(&request).map_err(|_| corrupt("launch request", &request))?,
        policy: row.try_get("policy")?,
        state: VmState::parse(&state).ok_or_else(|| corrupt("VM state", &state))?,
        error: row.try_get("error")?,
        step: SagaStep::parse(&step).ok_or_else(|| corrupt("saga step", &step))?,
        server_id: row.try_get::<Option<String>, _>("server_id")?.map(ServerId),
        host: host.map(|h| HostId::new(&h).map_err(|_| corrupt("host name", &h))).transpose()?,
        fixed_ip: fixed_ip
            .map(|ip| ip.parse().map_err(|_| corrupt("fixed IP", &ip)))
            .transpose()?,
        tap: row.try_get("tap")?,
        routes_on: row.try_get::<i64, _>("routes_on")? != 0,
        timings: serde_json::from_str(&timings).map_err(|_| corrupt("timings", &timings))?,
        created_ms: row.try_get("created_ms")?,
        updated_ms: row.try_get("updated_ms")?,
        version: row.try_get("version")?,
    })
}

#[derive(Debug)]
pub struct NewVm<'a> {
    pub record: &'a VmRecord,
    pub idempotency_key: Option<&'a str>,
    pub request_digest: Option<&'a str>,
    pub saga_owner: &'a str,
    pub lease_until_ms: i64,
}

pub async fn insert_vm(conn: &mut AnyConnection, new: NewVm<'_>) -> Result<(), Error> {
    let vm = new.record;
    sqlx::query(
        "INSERT INTO vms (id, project, owner, name, request, policy, state, error, step, server_id, host, \
         fixed_ip, tap, routes_on, timings, idempotency_key, request_digest, saga_owner, saga_lease_until_ms, \
         created_ms, updated_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, NULL, NULL, NULL, 0, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(vm.id.to_string())
    .bind(&vm.project)
    .bind(&vm.owner)
    .bind(&vm.name)
    .bind(serde_json::to_string(&vm.spec).expect("spec serializes"))
    .bind(&vm.policy)
    .bind(vm.state.as_str())
    .bind(vm.error.as_deref())
    .bind(vm.step.as_str())
    .bind(serde_json::to_string(&vm.timings).expect("timings serialize"))
    .bind(new.idempotency_key)
    .bind(new.request_digest)
    .bind(new.saga_owner)
    .bind(new.lease_until_ms)
    .bind(vm.created_ms)
    .bind(vm.updated_ms)
    .execute(conn)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            Error::Conflict("a VM with this Idempotency-Key already exists".into())
        }
        _ => Error::from(e),
    })?;
    Ok(())
}

/// Writes everything the saga changes about a VM, if nobody else changed it since `vm` was read.
/// Returns whether it was written; on success `vm.version` is the new version. Writing the end of
/// the saga (step `done`) also releases its lease.
pub async fn update_vm(conn: &mut AnyConnection, vm: &mut VmRecord) -> Result<bool, Error> {
    Ok(write_vm(conn, vm, None).await?.is_some())
}

/// A saga's claim: who takes it, now, and until when.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub owner: &'a str,
    pub now_ms: i64,
    pub until_ms: i64,
}

/// [`update_vm`], and in the same statement the claim of the VM's saga unless another live owner
/// holds it (as [`claim_saga`]). Returns None when not written, else whether the claim was taken.
pub async fn update_vm_and_claim(
    conn: &mut AnyConnection,
    vm: &mut VmRecord,
    claim: Claim<'_>,
) -> Result<Option<bool>, Error> {
    write_vm(conn, vm, Some(claim)).await
}

async fn write_vm(
    conn: &mut AnyConnection,
    vm: &mut VmRecord,
    claim: Option<Claim<'_>>,
) -> Result<Option<bool>, Error> {
    const SET: &str = "UPDATE vms SET state = $1, error = $2, step = $3, server_id = $4, host = $5, \
        fixed_ip = $6, tap = $7, routes_on = $8, timings = $9, updated_ms = $10, version = version + 1";
    const WHERE: &str = "WHERE id = $11 AND version = $12";
    let sql = match claim {
        None => format!(
            "{SET}, saga_lease_until_ms = CASE WHEN $3 = 'done' THEN 0 ELSE saga_lease_until_ms END {WHERE} \
             RETURNING saga_owner"
        ),
        // The CASEs read the row as it was before this UPDATE.
        Some(_) => format!(
            "{SET}, \
             saga_owner = CASE WHEN saga_owner IS NULL OR saga_owner = $13 OR saga_lease_until_ms < $14 \
                 THEN $13 ELSE saga_owner END, \
             saga_lease_until_ms = CASE WHEN saga_owner IS NULL OR saga_owner = $13 OR saga_lease_until_ms < $14 \
                 THEN $15 ELSE saga_lease_until_ms END \
             {WHERE} RETURNING saga_owner"
        ),
    };
    let mut query = sqlx::query(&sql)
        .bind(vm.state.as_str())
        .bind(vm.error.as_deref())
        .bind(vm.step.as_str())
        .bind(vm.server_id.as_ref().map(|s| s.0.clone()))
        .bind(vm.host.as_ref().map(|h| h.to_string()))
        .bind(vm.fixed_ip.map(|ip| ip.to_string()))
        .bind(vm.tap.as_deref())
        .bind(i64::from(vm.routes_on))
        .bind(serde_json::to_string(&vm.timings).expect("timings serialize"))
        .bind(vm.updated_ms)
        .bind(vm.id.to_string())
        .bind(vm.version);
    if let Some(claim) = claim {
        query = query.bind(claim.owner).bind(claim.now_ms).bind(claim.until_ms);
    }
    let Some(row) = query.fetch_optional(conn).await? else { return Ok(None) };
    vm.version += 1;
    let owner: Option<String> = row.try_get(0)?;
    Ok(Some(claim.is_some_and(|c| owner.as_deref() == Some(c.owner))))
}

pub async fn vm(conn: &mut AnyConnection, id: VmId) -> Result<Option<VmRecord>, Error> {
    let row = sqlx::query(&format!("SELECT {VM_COLUMNS} FROM vms WHERE id = $1"))
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(vm_from_row).transpose()
}

/// A project's VMs (all projects' for `None`), newest first, deleted ones left out.
pub async fn vms(conn: &mut AnyConnection, project: Option<&str>) -> Result<Vec<VmRecord>, Error> {
    let rows = match project {
        Some(project) => {
            sqlx::query(&format!(
                "SELECT {VM_COLUMNS} FROM vms WHERE project = $1 AND state <> 'deleted' ORDER BY created_ms DESC, id"
            ))
            .bind(project)
            .fetch_all(conn)
            .await?
        }
        None => {
            sqlx::query(&format!(
                "SELECT {VM_COLUMNS} FROM vms WHERE state <> 'deleted' ORDER BY created_ms DESC, id"
            ))
            .fetch_all(conn)
            .await?
        }
    };
    rows.iter().map(vm_from_row).collect()
}

/// How many VMs are in each state.
pub async fn vm_state_counts(conn: &mut AnyConnection) -> Result<Vec<(String, i64)>, Error> {
    let rows =
        sqlx::query("SELECT state, COUNT(*) FROM vms GROUP BY state").fetch_all(conn).await?;
    rows.iter().map(|row| Ok((row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?))).collect()
}

/// The VM a project launched with `key`, and the digest of that launch's request.
pub async fn vm_by_idempotency_key(
    conn: &mut AnyConnection,
    project: &str,
    key: &str,
) -> Result<Option<(VmId, String)>, Error> {
    let row = sqlx::query(
        "SELECT id, request_digest FROM vms WHERE project = $1 AND idempotency_key = $2",
    )
    .bind(project)
    .bind(key)
    .fetch_optional(conn)
    .await?;
    match row {
        None => Ok(None),
        Some(row) => {
            let id: String = row.try_get(0)?;
            let digest: Option<String> = row.try_get(1)?;
            Ok(Some((id.parse().map_err(|_| corrupt("VM id", &id))?, digest.unwrap_or_default())))
        }
    }
}

/// VMs whose saga has work left and whose lease (if any) has run out, for recovery.
pub async fn sagas_to_resume(conn: &mut AnyConnection, now: i64) -> Result<Vec<VmId>, Error> {
    let rows = sqlx::query(
        "SELECT id FROM vms WHERE step <> 'done' AND saga_lease_until_ms < $1 ORDER BY created_ms",
    )
    .bind(now)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            id.parse().map_err(|_| corrupt("VM id", &id))
        })
        .collect()
}

/// Takes the saga of `vm` for `owner` until `until_ms`, unless another live owner holds it.
pub async fn claim_saga(
    conn: &mut AnyConnection,
    vm: VmId,
    owner: &str,
    now: i64,
    until_ms: i64,
) -> Result<bool, Error> {
    let claimed = sqlx::query(
        "UPDATE vms SET saga_owner = $1, saga_lease_until_ms = $2 \
         WHERE id = $3 AND (saga_owner = $1 OR saga_lease_until_ms < $4 OR saga_owner IS NULL)",
    )
    .bind(owner)
    .bind(until_ms)
    .bind(vm.to_string())
    .bind(now)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(claimed == 1)
}

pub async fn release_saga(conn: &mut AnyConnection, vm: VmId, owner: &str) -> Result<(), Error> {
    sqlx::query("UPDATE vms SET saga_lease_until_ms = 0 WHERE id = $1 AND saga_owner = $2")
        .bind(vm.to_string())
        .bind(owner)
        .execute(conn)
        .await?;
    Ok(())
}

// ---- cGPUs ----

const CGPU_COLUMNS: &str =
    "c.vm, c.idx, c.gpu, g.host, c.memory_mib, c.mode, c.masked_address, c.masked_port, \
                            g.rcuda_address, g.rcuda_port, g.rcuda_gpu_number";

fn cgpu_from_row(row: &AnyRow) -> Result<CgpuRecord, Error> {
    let vm: String = row.try_get(0)?;
    let gpu: String = row.try_get(2)?;
    let host: String = row.try_get(3)?;
    let mode: String = row.try_get(5)?;
    let masked: String = row.try_get(6)?;
    let rcuda: String = row.try_get(8)?;
    Ok(CgpuRecord {
        vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
        index: row.try_get::<i64, _>(1)? as u32,
        gpu: GpuId::new(&gpu).map_err(|_| corrupt("GPU id", &gpu))?,
        host: HostId::new(&host).map_err(|_| corrupt("host name", &host))?,
        memory_mib: row.try_get::<i64, _>(4)? as u64,
        mode: parse_mode(&mode).ok_or_else(|| corrupt("mode", &mode))?,
        masked_address: masked
            .parse::<Ipv4Addr>()
            .map_err(|_| corrupt("masked address", &masked))?,
        masked_port: row.try_get::<i64, _>(7)? as u16,
        rcuda_address: rcuda.parse().map_err(|_| corrupt("rCUDA address", &rcuda))?,
        rcuda_port: row.try_get::<i64, _>(9)? as u16,
        rcuda_gpu_number: row.try_get::<i64, _>(10)? as u32,
    })
}

pub async fn insert_cgpu(conn: &mut AnyConnection, cgpu: &CgpuRecord) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(cgpu.vm.to_string())
    .bind(i64::from(cgpu.index))
    .bind(cgpu.gpu.as_str())
    .bind(cgpu.memory_mib as i64)
    .bind(mode_str(cgpu.mode))
    .bind(cgpu.masked_address.to_string())
    .bind(i64::from(cgpu.masked_port))
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn cgpus_of(conn: &mut AnyConnection, vm: VmId) -> Result<Vec<CgpuRecord>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {CGPU_COLUMNS} FROM cgpus c JOIN gpus g ON g.id = c.gpu WHERE c.vm = $1 ORDER BY c.idx"
    ))
    .bind(vm.to_string())
    .fetch_all(conn)
    .await?;
    rows.iter().map(cgpu_from_row).collect()
}

/// Every booked cGPU, by VM.
pub async fn all_cgpus(conn: &mut AnyConnection) -> Result<BTreeMap<VmId, Vec<CgpuRecord>>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {CGPU_COLUMNS} FROM cgpus c JOIN gpus g ON g.id = c.gpu ORDER BY c.vm, c.idx"
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

pub async fn delete_cgpus(conn: &mut AnyConnection, vm: VmId) -> Result<u64, Error> {
    Ok(sqlx::query("DELETE FROM cgpus WHERE vm = $1")
        .bind(vm.to_string())
        .execute(conn)
        .await?
        .rows_affected())
}

/// One cGPU routed on a host: the VM's source and the masked and real endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedCgpu {
    pub vm: VmId,
    pub fixed_ip: Option<Ipv4Addr>,
    pub tap: Option<String>,
    pub masked: std::net::SocketAddrV4,
    pub target: std::net::SocketAddrV4,
}

/// The routes a host must serve: the cGPUs of every VM on it whose routes are on, in one query.
pub async fn routed_cgpus_on(
    conn: &mut AnyConnection,
    host: &HostId,
) -> Result<Vec<RoutedCgpu>, Error> {
    let rows = sqlx::query(
        "SELECT v.id, v.fixed_ip, v.tap, c.masked_address, c.masked_port, g.rcuda_address, g.rcuda_port \
         FROM vms v JOIN cgpus c ON c.vm = v.id JOIN gpus g ON g.id = c.gpu \
         WHERE v.host = $1 AND v.routes_on = 1 ORDER BY v.id, c.idx",
    )
    .bind(host.as_str())
    .fetch_all(conn)
    .await?;
    let address = |text: String, what: &str| -> Result<Ipv4Addr, Error> {
        text.parse().map_err(|_| corrupt(what, &text))
    };
    rows.iter()
        .map(|row| {
            let vm: String = row.try_get(0)?;
            Ok(RoutedCgpu {
                vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
                fixed_ip: row
                    .try_get::<Option<String>, _>(1)?
                    .map(|ip| address(ip, "fixed IP"))
                    .transpose()?,
                tap: row.try_get(2)?,
                masked: std::net::SocketAddrV4::new(
                    address(row.try_get(3)?, "masked address")?,
                    row.try_get::<i64, _>(4)? as u16,
                ),
                target: std::net::SocketAddrV4::new(
                    address(row.try_get(5)?, "rCUDA address")?,
                    row.try_get::<i64, _>(6)? as u16,
                ),
            })
        })
        .collect()
}
