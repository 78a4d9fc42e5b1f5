//! The datastore: SQLite (embedded default) or PostgreSQL (several replicas), through one set of
//! portable queries over sqlx's `Any` driver.
//!
//! On SQLite one connection serves every read and write of the process. A SQLite connection drops
//! its whole page cache whenever another connection has committed, so with a commit every
//! millisecond separate reader connections read cold pages (a `pread` per page) and take file
//! locks for every read; the one connection keeps its cache warm, and writers queue for it instead
//! of failing with SQLITE_BUSY. Reads are batched ([`crate::app`]), so serializing them costs
//! little, and a 2-core machine gains nothing from parallel readers. On PostgreSQL a pool serves
//! side by side and row locks order writers. Queries are plain functions over a connection
//! ([`Db::conn`], or a transaction from [`Db::begin`]) so the application layer composes them
//! inside one transaction.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gpgpums::{GpuId, HostId, HostKind, HostState, VmId};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow, AnyTransactionManager};
use sqlx::{AnyConnection, AnyPool, Connection, Row, TransactionManager};

use crate::cloud::ServerId;
use crate::error::Error;
use crate::model::*;

/// The migrations, in order, embedded so the binary carries its schema.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../../migrations/0001_init.sql")),
    (2, "pending_indexes", include_str!("../../migrations/0002_pending_indexes.sql")),
    (3, "drop_unused_vm_indexes", include_str!("../../migrations/0003_drop_unused_vm_indexes.sql")),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone)]
pub struct Db {
    conns: Conns,
    backend: Backend,
}

#[derive(Debug, Clone)]
enum Conns {
    /// PostgreSQL: connections side by side.
    Pool(AnyPool),
    /// SQLite: the process's one connection (see the module docs), held directly rather than in a
    /// pool of one: a pool pings every connection given back to it, a round trip to SQLite's worker
    /// thread for every checkout.
    One(Arc<tokio::sync::Mutex<AnyConnection>>),
}

/// A connection of the process, held until dropped.
#[derive(Debug)]
pub enum Conn {
    Pooled(sqlx::pool::PoolConnection<sqlx::Any>),
    One(tokio::sync::OwnedMutexGuard<AnyConnection>),
}

impl std::ops::Deref for Conn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::One(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::One(conn) => conn,
        }
    }
}

/// A write transaction; dropped uncommitted, it is rolled back (as sqlx's `Transaction` is: the
/// rollback is queued on the connection ahead of its next use).
#[derive(Debug)]
pub struct WriteTx {
    conn: Conn,
    open: bool,
}

impl WriteTx {
    pub async fn commit(mut self) -> Result<(), Error> {
        AnyTransactionManager::commit(&mut self.conn).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.open {
            AnyTransactionManager::start_rollback(&mut self.conn);
        }
    }
}

impl std::ops::Deref for WriteTx {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.conn
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
        let conns = match backend {
            Backend::Sqlite => {
                let mut conn = AnyConnection::connect_with(&options)
                    .await
                    .map_err(|e| Error::unavailable("database", e))?;
                for pragma in [
                    "PRAGMA journal_mode = WAL",
                    "PRAGMA synchronous = NORMAL",
                    "PRAGMA busy_timeout = 10000",
                    "PRAGMA foreign_keys = ON",
                ] {
                    sqlx::query(pragma)
                        .execute(&mut conn)
                        .await
                        .map_err(|e| Error::unavailable("database", e))?;
                }
                Conns::One(Arc::new(tokio::sync::Mutex::new(conn)))
            }
            Backend::Postgres => Conns::Pool(
                AnyPoolOptions::new()
                    // A ping per checkout doubles the round trips of a one-query read; a broken
                    // connection surfaces as an error of the query instead, and the pool
                    // replaces it.
                    .test_before_acquire(false)
                    .max_connections(16)
                    .connect_with(options)
                    .await
                    .map_err(|e| Error::unavailable("database", e))?,
            ),
        };
        let db = Db { conns, backend };
        db.migrate().await?;
        Ok(db)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A connection: SQLite's one, or one of PostgreSQL's pool. A single write statement is atomic
    /// by itself (autocommit) and saves the BEGIN and COMMIT round trips of a [`WriteTx`].
    pub async fn conn(&self) -> Result<Conn, Error> {
        Ok(match &self.conns {
            Conns::Pool(pool) => Conn::Pooled(pool.acquire().await?),
            Conns::One(conn) => Conn::One(conn.clone().lock_owned().await),
        })
    }

    pub async fn begin(&self) -> Result<WriteTx, Error> {
        let mut conn = self.conn().await?;
        AnyTransactionManager::begin(&mut conn, None).await?;
        Ok(WriteTx { conn, open: true })
    }

    async fn migrate(&self) -> Result<(), Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS schema_migrations \
             (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_ms BIGINT NOT NULL)",
        )
        .execute(&mut *self.conn().await?)
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
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 1 {
                sqlx::raw_sql(sql).execute(&mut *tx).await?;
                tx.commit().await?;
                tracing::info!(version, name, "applied migration");
            }
        }
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.conn().await?;
        sqlx::query("SELECT 1")
            .execute(&mut *conn)
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

/// Starts a new generation of each host's table; returns the hosts as of it (`routes_generation`
/// is the new generation). Unknown hosts are left out.
pub async fn next_routes_generations(
    conn: &mut AnyConnection,
    hosts: &[HostId],
) -> Result<Vec<HostRecord>, Error> {
    let rows = fetch_batched(conn, keys(hosts.iter().map(HostId::as_str)), MAX_ROWS, |values| {
        format!(
            "UPDATE hosts SET routes_generation = routes_generation + 1 \
             WHERE name IN (VALUES {values}) RETURNING {HOST_COLUMNS}"
        )
    })
    .await?;
    rows.iter().map(host_from_row).collect()
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

/// Records the generation each host's agent confirmed (never moving one back).
pub async fn set_applied_generations(
    conn: &mut AnyConnection,
    applied: &[(HostId, u64)],
) -> Result<(), Error> {
    let rows = applied
        .iter()
        .map(|(host, generation)| {
            vec![Param::text(host.as_str()), Param::Int(Some(*generation as i64))]
        })
        .collect();
    fetch_batched(conn, rows, MAX_ROWS, |values| {
        format!(
            "WITH v (name, generation) AS (VALUES {values}) \
             UPDATE hosts SET applied_generation = v.generation FROM v \
             WHERE hosts.name = v.name AND hosts.applied_generation < v.generation"
        )
    })
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

/// A VM's columns, read by position (see [`vm_from_row`]); `v.` names them in joins.
const VM_COLUMNS: &str = "v.id, v.project, v.owner, v.name, v.request, v.policy, v.state, v.error, v.step, \
    v.server_id, v.host, v.fixed_ip, v.tap, v.routes_on, v.timings, v.created_ms, v.updated_ms, v.version";
const VM_COLUMN_COUNT: usize = 18;

fn vm_from_row(row: &AnyRow) -> Result<VmRecord, Error> {
    let id: String = row.try_get(0)?;
    let request: String = row.try_get(4)?;
    let state: String = row.try_get(6)?;
    let step: String = row.try_get(8)?;
    let host: Option<String> = row.try_get(10)?;
    let fixed_ip: Option<String> = row.try_get(11)?;
    let timings: String = row.try_get(14)?;
    Ok(VmRecord {
        id: id.parse().map_err(|_| corrupt("VM id", &id))?,
        project: row.try_get(1)?,
        owner: row.try_get(2)?,
        name: row.try_get(3)?,
        spec: serde_json::from_str(&request).map_err(|_| corrupt("launch request", &request))?,
        policy: row.try_get(5)?,
        state: VmState::parse(&state).ok_or_else(|| corrupt("VM state", &state))?,
        error: row.try_get(7)?,
        step: SagaStep::parse(&step).ok_or_else(|| corrupt("saga step", &step))?,
        server_id: row.try_get::<Option<String>, _>(9)?.map(ServerId),
        host: host.map(|h| HostId::new(&h).map_err(|_| corrupt("host name", &h))).transpose()?,
        fixed_ip: fixed_ip
            .map(|ip| ip.parse().map_err(|_| corrupt("fixed IP", &ip)))
            .transpose()?,
        tap: row.try_get(12)?,
        routes_on: row.try_get::<i64, _>(13)? != 0,
        timings: serde_json::from_str(&timings).map_err(|_| corrupt("timings", &timings))?,
        created_ms: row.try_get(15)?,
        updated_ms: row.try_get(16)?,
        version: row.try_get(17)?,
    })
}

/// Rows of VMs joined with their cGPUs (none: NULL cGPU columns), grouped back into VMs in order.
fn vms_with_cgpus_from_rows(rows: &[AnyRow]) -> Result<Vec<(VmRecord, Vec<CgpuRecord>)>, Error> {
    let mut out: Vec<(VmRecord, Vec<CgpuRecord>)> = Vec::new();
    for row in rows {
        let id: String = row.try_get(0)?;
        if out.last().is_none_or(|(vm, _)| vm.id.to_string() != id) {
            out.push((vm_from_row(row)?, Vec::new()));
        }
        if row.try_get::<Option<String>, _>(VM_COLUMN_COUNT)?.is_some() {
            let cgpu = cgpu_from_row_at(row, VM_COLUMN_COUNT)?;
            out.last_mut().expect("pushed above").1.push(cgpu);
        }
    }
    Ok(out)
}

const VMS_WITH_CGPUS: &str =
    "FROM vms v LEFT JOIN cgpus c ON c.vm = v.id LEFT JOIN gpus g ON g.id = c.gpu";

/// VMs and their cGPUs, in one query per [`MAX_ROWS`] ids; unknown ids are left out.
pub async fn vms_with_cgpus_by_id(
    conn: &mut AnyConnection,
    ids: &[VmId],
) -> Result<Vec<(VmRecord, Vec<CgpuRecord>)>, Error> {
    let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    let rows = fetch_batched(conn, keys(ids.iter().map(String::as_str)), MAX_ROWS, |values| {
        format!(
            "SELECT {VM_COLUMNS}, {CGPU_COLUMNS} {VMS_WITH_CGPUS} WHERE v.id IN (VALUES {values}) \
             ORDER BY v.id, c.idx"
        )
    })
    .await?;
    vms_with_cgpus_from_rows(&rows)
}

/// A project's VMs (all projects' for `None`) with their cGPUs, newest first, deleted ones left
/// out, in one query.
pub async fn vms_with_cgpus(
    conn: &mut AnyConnection,
    project: Option<&str>,
) -> Result<Vec<(VmRecord, Vec<CgpuRecord>)>, Error> {
    let order = "ORDER BY v.created_ms DESC, v.id, c.idx";
    let rows = match project {
        Some(project) => {
            sqlx::query(&format!(
                "SELECT {VM_COLUMNS}, {CGPU_COLUMNS} {VMS_WITH_CGPUS} \
                 WHERE v.project = $1 AND v.state <> 'deleted' {order}"
            ))
            .bind(project)
            .fetch_all(conn)
            .await?
        }
        None => {
            sqlx::query(&format!(
                "SELECT {VM_COLUMNS}, {CGPU_COLUMNS} {VMS_WITH_CGPUS} WHERE v.state <> 'deleted' {order}"
            ))
            .fetch_all(conn)
            .await?
        }
    };
    vms_with_cgpus_from_rows(&rows)
}

#[derive(Debug)]
pub struct NewVm<'a> {
    pub record: &'a VmRecord,
    pub idempotency_key: Option<&'a str>,
    pub request_digest: Option<&'a str>,
    pub saga_owner: &'a str,
    pub lease_until_ms: i64,
}

// Batched statements. Group commit (`app::batch`) writes many VMs per statement; every batched
// statement takes its rows from a `VALUES` list (`WITH v (...) AS (VALUES ...)`, or
// `IN (VALUES ...)` for keys), which SQLite and PostgreSQL read alike and whose length PostgreSQL's
// planner knows (it then looks rows up by index). See `fetch_batched`.

/// The most rows one batched statement carries (bind parameters stay far below both databases'
/// limits).
const MAX_ROWS: usize = 64;

/// One bind parameter of a batched statement.
#[derive(Debug, Clone)]
enum Param {
    Text(Option<String>),
    Int(Option<i64>),
}

impl Param {
    fn text(value: impl Into<String>) -> Param {
        Param::Text(Some(value.into()))
    }

    /// A NULL of the same type: padding rows.
    fn null_like(&self) -> Param {
        match self {
            Param::Text(_) => Param::Text(None),
            Param::Int(_) => Param::Int(None),
        }
    }
}

/// `rows` tuples of `columns` placeholders: `($1, $2), ($3, $4)`, or `(?, ?), (?, ?)` on SQLite,
/// where numbered parameters cost a lookup each that grows with their count.
fn placeholders(conn: &AnyConnection, rows: usize, columns: usize) -> String {
    let sqlite = conn.backend_name() == "SQLite";
    let mut out = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        out.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..columns {
            if column > 0 {
                out.push_str(", ");
            }
            if sqlite {
                out.push('?');
            } else {
                out.push_str(&format!("${}", row * columns + column + 1));
            }
        }
        out.push(')');
    }
    out
}

/// Runs `sql(values)` once per `chunk` rows and returns every row it answers: `values` is the
/// chunk's `(?, ?), (?, ?)` list, padded to a power of two with rows of NULLs (which match
/// nothing), so a statement comes in a few shapes that the statement caches keep prepared. The
/// rows must all have the same shape.
async fn fetch_batched(
    conn: &mut AnyConnection,
    rows: Vec<Vec<Param>>,
    chunk: usize,
    sql: impl Fn(&str) -> String,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut answered = Vec::new();
    for chunk in rows.chunks(chunk) {
        let padding: Vec<Param> = chunk[0].iter().map(Param::null_like).collect();
        let padded_len = chunk.len().next_power_of_two();
        let sql = sql(&placeholders(conn, padded_len, padding.len()));
        let mut query: AnyQuery<'_> = sqlx::query(&sql);
        let padding_rows = std::iter::repeat_n(&padding, padded_len - chunk.len());
        for param in chunk.iter().chain(padding_rows).flatten() {
            query = match param {
                Param::Text(text) => query.bind(text.clone()),
                Param::Int(int) => query.bind(*int),
            };
        }
        answered.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(answered)
}

/// The rows of a batch keyed by one text column each.
fn keys<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<Vec<Param>> {
    keys.map(|key| vec![Param::text(key)]).collect()
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

const NEW_VM_COLUMNS: &str =
    "id, project, owner, name, request, policy, state, error, step, timings, \
    idempotency_key, request_digest, saga_owner, saga_lease_until_ms, created_ms, updated_ms";

/// Inserts new VMs (no server, host or routes yet).
pub async fn insert_vms(conn: &mut AnyConnection, new: &[NewVm<'_>]) -> Result<(), Error> {
    let rows = new
        .iter()
        .map(|new| {
            let vm = new.record;
            vec![
                Param::text(vm.id.to_string()),
                Param::text(&vm.project),
                Param::text(&vm.owner),
                Param::text(&vm.name),
                Param::text(serde_json::to_string(&vm.spec).expect("spec serializes")),
                Param::text(&vm.policy),
                Param::text(vm.state.as_str()),
                Param::Text(vm.error.clone()),
                Param::text(vm.step.as_str()),
                Param::text(serde_json::to_string(&vm.timings).expect("timings serialize")),
                Param::Text(new.idempotency_key.map(str::to_owned)),
                Param::Text(new.request_digest.map(str::to_owned)),
                Param::text(new.saga_owner),
                Param::Int(Some(new.lease_until_ms)),
                Param::Int(Some(vm.created_ms)),
                Param::Int(Some(vm.updated_ms)),
            ]
        })
        .collect();
    fetch_batched(conn, rows, MAX_ROWS, |values| {
        format!(
            "WITH v ({NEW_VM_COLUMNS}) AS (VALUES {values}) \
             INSERT INTO vms ({NEW_VM_COLUMNS}) SELECT {NEW_VM_COLUMNS} FROM v WHERE id IS NOT NULL"
        )
    })
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            Error::Conflict("a VM with this Idempotency-Key already exists".into())
        }
        _ => Error::from(e),
    })?;
    Ok(())
}

/// A saga's claim: who takes it, now, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub owner: String,
    pub now_ms: i64,
    pub until_ms: i64,
}

/// One conditional write of a VM (see [`update_vms`]).
#[derive(Debug, Clone)]
pub struct VmWrite {
    /// The VM as it is to be; written only if the stored version is still `vm.version`.
    pub vm: VmRecord,
    /// Also take the VM's saga, unless another live owner holds it (as [`claim_saga`]).
    pub claim: Option<Claim>,
}

/// How a [`VmWrite`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Somebody changed the VM since it was read: nothing written.
    Stale,
    /// Written; `claimed` tells whether the write's claim was taken.
    Done { claimed: bool },
}

const VM_WRITE_COLUMNS: &str =
    "id, version, state, error, step, server_id, host, fixed_ip, tap, routes_on, \
    timings, updated_ms, claim_owner, claim_now, claim_until";

/// Writes everything the saga changes about each VM, if nobody else changed it since it was read,
/// in one statement per [`MAX_ROWS`] writes. Written records get their new version. Writing the
/// end of a saga (step `done`) also releases its lease. The ids must be distinct.
pub async fn update_vms(
    conn: &mut AnyConnection,
    writes: &mut [VmWrite],
) -> Result<Vec<Written>, Error> {
    debug_assert!(
        writes.iter().map(|w| w.vm.id).collect::<std::collections::HashSet<_>>().len()
            == writes.len(),
        "one write per VM and statement"
    );
    // The CASEs read the row as it was before this UPDATE.
    const CLAIMABLE: &str = "v.claim_owner IS NOT NULL AND (vms.saga_owner IS NULL \
        OR vms.saga_owner = v.claim_owner OR vms.saga_lease_until_ms < v.claim_now)";
    let rows = writes
        .iter()
        .map(|write| {
            let vm = &write.vm;
            let claim = write.claim.as_ref();
            vec![
                Param::text(vm.id.to_string()),
                Param::Int(Some(vm.version)),
                Param::text(vm.state.as_str()),
                Param::Text(vm.error.clone()),
                Param::text(vm.step.as_str()),
                Param::Text(vm.server_id.as_ref().map(|s| s.0.clone())),
                Param::Text(vm.host.as_ref().map(|h| h.to_string())),
                Param::Text(vm.fixed_ip.map(|ip| ip.to_string())),
                Param::Text(vm.tap.clone()),
                Param::Int(Some(i64::from(vm.routes_on))),
                Param::text(serde_json::to_string(&vm.timings).expect("timings serialize")),
                Param::Int(Some(vm.updated_ms)),
                Param::Text(claim.map(|c| c.owner.clone())),
                Param::Int(claim.map(|c| c.now_ms)),
                Param::Int(claim.map(|c| c.until_ms)),
            ]
        })
        .collect();
    let answered = fetch_batched(conn, rows, MAX_ROWS, |values| {
        format!(
            "WITH v ({VM_WRITE_COLUMNS}) AS (VALUES {values}) \
             UPDATE vms SET state = v.state, error = v.error, step = v.step, server_id = v.server_id, \
             host = v.host, fixed_ip = v.fixed_ip, tap = v.tap, routes_on = v.routes_on, \
             timings = v.timings, updated_ms = v.updated_ms, version = vms.version + 1, \
             saga_owner = CASE WHEN {CLAIMABLE} THEN v.claim_owner ELSE vms.saga_owner END, \
             saga_lease_until_ms = CASE WHEN v.step = 'done' THEN 0 \
                 WHEN {CLAIMABLE} THEN v.claim_until ELSE vms.saga_lease_until_ms END \
             FROM v WHERE vms.id = v.id AND vms.version = v.version \
             RETURNING vms.id, vms.saga_owner"
        )
    })
    .await?;
    let mut owners = std::collections::HashMap::new();
    for row in answered {
        let id: String = row.try_get(0)?;
        let owner: Option<String> = row.try_get(1)?;
        owners.insert(id, owner);
    }
    Ok(writes
        .iter_mut()
        .map(|write| match owners.get(&write.vm.id.to_string()) {
            None => Written::Stale,
            Some(owner) => {
                write.vm.version += 1;
                let claimed = write
                    .claim
                    .as_ref()
                    .is_some_and(|c| owner.as_deref() == Some(c.owner.as_str()));
                Written::Done { claimed }
            }
        })
        .collect())
}

pub async fn vm(conn: &mut AnyConnection, id: VmId) -> Result<Option<VmRecord>, Error> {
    let row = sqlx::query(&format!("SELECT {VM_COLUMNS} FROM vms v WHERE id = $1"))
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(vm_from_row).transpose()
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
    cgpu_from_row_at(row, 0)
}

/// A cGPU from [`CGPU_COLUMNS`] starting at column `at`.
fn cgpu_from_row_at(row: &AnyRow, at: usize) -> Result<CgpuRecord, Error> {
    let vm: String = row.try_get(at)?;
    let gpu: String = row.try_get(at + 2)?;
    let host: String = row.try_get(at + 3)?;
    let mode: String = row.try_get(at + 5)?;
    let masked: String = row.try_get(at + 6)?;
    let rcuda: String = row.try_get(at + 8)?;
    Ok(CgpuRecord {
        vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
        index: row.try_get::<i64, _>(at + 1)? as u32,
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

const CGPU_INSERT_COLUMNS: &str = "vm, idx, gpu, memory_mib, mode, masked_address, masked_port";

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

/// Releases every cGPU of the VMs.
pub async fn delete_cgpus(conn: &mut AnyConnection, vms: &[VmId]) -> Result<(), Error> {
    let ids: Vec<String> = vms.iter().map(|id| id.to_string()).collect();
    fetch_batched(conn, keys(ids.iter().map(String::as_str)), 4 * MAX_ROWS, |values| {
        format!("DELETE FROM cgpus WHERE vm IN (VALUES {values})")
    })
    .await?;
    Ok(())
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

/// The routes each host must serve: the cGPUs of every VM on it whose routes are on, in one
/// query per [`MAX_ROWS`] hosts.
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
             g.rcuda_port FROM vms v JOIN cgpus c ON c.vm = v.id JOIN gpus g ON g.id = c.gpu \
             WHERE v.host IN (VALUES {values}) AND v.routes_on = 1 ORDER BY v.host, v.id, c.idx"
        )
    })
    .await?;
    for row in rows {
        let host: String = row.try_get(0)?;
        let host = HostId::new(&host).map_err(|_| corrupt("host name", &host))?;
        let vm: String = row.try_get(1)?;
        let routed = RoutedCgpu {
            vm: vm.parse().map_err(|_| corrupt("VM id", &vm))?,
            fixed_ip: row
                .try_get::<Option<String>, _>(2)?
                .map(|ip| address(ip, "fixed IP"))
                .transpose()?,
            tap: row.try_get(3)?,
            masked: std::net::SocketAddrV4::new(
                address(row.try_get(4)?, "masked address")?,
                row.try_get::<i64, _>(5)? as u16,
            ),
            target: std::net::SocketAddrV4::new(
                address(row.try_get(6)?, "rCUDA address")?,
                row.try_get::<i64, _>(7)? as u16,
            ),
        };
        out.entry(host).or_default().push(routed);
    }
    Ok(out)
}
