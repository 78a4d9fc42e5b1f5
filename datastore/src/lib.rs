//! The datastore: SQLite (embedded default) or PostgreSQL (several replicas), through one set of
//! portable queries over sqlx's `Any` driver.
//!
//! On SQLite one connection serves every read and write of the process. A SQLite connection drops
//! its whole page cache whenever another connection has committed, so with a commit every
//! millisecond separate reader connections read cold pages (a `pread` per page) and take file
//! locks for every read; the one connection keeps its cache warm, and writers queue for it instead
//! of failing with SQLITE_BUSY (a second connection only checkpoints the log, off the request path:
//! see [`checkpoint`]). Reads are batched (gsaasd's `app::batch`), so serializing them costs
//! little, and a 2-core machine gains nothing from parallel readers. On PostgreSQL a pool serves
//! side by side and row locks order writers.
//!
//! The crate owns every statement: other crates call [`Db`]'s methods (each a read, a write in a
//! transaction of its own, or one statement on a connection of its own) and, for the changes of
//! bookings and inventory that a decision on the in-memory pool must sit inside, a
//! [`PoolChange`]'s (see [`pool_change`]). The queries are plain functions over a connection in
//! this crate's modules ([`queries`] lists the methods that run them); no connection or
//! transaction type leaves the crate, except to tests with the `testing` feature.

mod alerts;
mod backup;
mod cgpus;
mod checkpoint;
mod cohorts;
mod conn;
mod delegations;
pub mod error;
mod events;
mod fences;
mod gpus;
mod hosts;
mod migrations;
pub mod model;
mod notifications;
mod pool_change;
mod purge;
mod queries;
mod queue;
mod quotas;
mod servers;
mod tokens;
mod usage;
mod usage_fold;
mod vms;

pub use alerts::{HostAlert, ALERTS_PER_HOST};
pub use cgpus::{CgpuEndpoints, HeldCgpu, HeldVm, RoutedCgpu};
pub use events::{VmEvent, EVENTS_PER_VM};
pub use fences::{Fenced, ReleasableFence};
pub use hosts::RouteTables;
pub use purge::{purge_deleted_vms, Purged};
pub use queue::{NewTicket, QueueHead, QueuePlace, QueueRow, Queued, QueuedAttach, QueuedVm};
pub use servers::{ReportedServer, ServersChanged};
pub use usage::{CgpuTime, Period, Span, UsageLine, VmUsageLine};
pub use usage_fold::{plan_fold, CgpuSpanStart, EventKind, FoldPlan, NewSpan, UsageEvent};
pub use vms::{Claim, ListPosition, NewVm, ReadVm, VmFilter, VmServer, VmWrite, Written};
// The query functions: the crate's own (its methods run them), and its tests'.
#[cfg(not(feature = "testing"))]
pub(crate) use conn::{Conn, OneConn, WriteTx};
#[cfg(feature = "testing")]
pub use conn::{Conn, OneConn, WriteTx};
pub use error::Error;
pub use pool_change::PoolChange;
#[cfg(feature = "testing")]
pub use {
    alerts::*, cgpus::*, cohorts::*, delegations::*, events::*, fences::*, gpus::*, hosts::*,
    notifications::*, queue::*, quotas::*, servers::*, tokens::*, usage::*, vms::*,
};
#[cfg(not(feature = "testing"))]
use {
    alerts::*, cgpus::*, cohorts::*, delegations::*, events::*, fences::*, gpus::*, hosts::*,
    notifications::*, queue::*, quotas::*, servers::*, tokens::*, usage::*, vms::*,
};

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow, AnyTransactionManager};
use sqlx::{AnyConnection, AnyPool, Connection, Row, TransactionManager};

/// The migrations both stores share, in order (version, name, SQL), embedded so the binary
/// carries its schema (with [`DIALECT_MIGRATIONS`]: [`migrations_for`] gives them all).
/// sqlx's migrator applies them (see [`migrations`]); the upgrade tests build older schemas from
/// their first ones.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../../migrations/0001_init.sql")),
    (2, "pending_indexes", include_str!("../../migrations/0002_pending_indexes.sql")),
    (3, "drop_unused_vm_indexes", include_str!("../../migrations/0003_drop_unused_vm_indexes.sql")),
    (4, "gpu_taints", include_str!("../../migrations/0004_gpu_taints.sql")),
    (5, "revoked_tokens", include_str!("../../migrations/0005_revoked_tokens.sql")),
    (6, "elastic_cgpus", include_str!("../../migrations/0006_elastic_cgpus.sql")),
    (7, "quotas", include_str!("../../migrations/0007_quotas.sql")),
    (8, "queue", include_str!("../../migrations/0008_queue.sql")),
    (9, "preemption", include_str!("../../migrations/0009_preemption.sql")),
    (10, "queued_attaches", include_str!("../../migrations/0010_queued_attaches.sql")),
    (11, "queue_bounds", include_str!("../../migrations/0011_queue_bounds.sql")),
    (12, "fencing", include_str!("../../migrations/0012_fencing.sql")),
    (13, "list_indexes", include_str!("../../migrations/0013_list_indexes.sql")),
    (14, "quota_counts", include_str!("../../migrations/0014_quota_counts.sql")),
    (15, "rcuda_endpoints", include_str!("../../migrations/0015_rcuda_endpoints.sql")),
    (16, "queue_holds", include_str!("../../migrations/0016_queue_holds.sql")),
    (17, "lasting_revocations", include_str!("../../migrations/0017_lasting_revocations.sql")),
    (18, "cgpus_version", include_str!("../../migrations/0018_cgpus_version.sql")),
    (19, "live_vm_indexes", include_str!("../../migrations/0019_live_vm_indexes.sql")),
    (20, "vm_extras_version", include_str!("../../migrations/0020_vm_extras_version.sql")),
    (21, "gpu_attributes", include_str!("../../migrations/0021_gpu_attributes.sql")),
    (22, "quota_models", include_str!("../../migrations/0022_quota_models.sql")),
    (23, "gpu_partitions", include_str!("../../migrations/0023_gpu_partitions.sql")),
    (24, "host_topology", include_str!("../../migrations/0024_host_topology.sql")),
    (25, "host_rtts", include_str!("../../migrations/0025_host_rtts.sql")),
    (26, "vm_remoting", include_str!("../../migrations/0026_vm_remoting.sql")),
    (30, "managed_servers", include_str!("../../migrations/0030_managed_servers.sql")),
    (31, "compute_shares", include_str!("../../migrations/0031_compute_shares.sql")),
    (33, "local_vm_resources", include_str!("../../migrations/0033_local_vm_resources.sql")),
    (35, "cohorts", include_str!("../../migrations/0035_cohorts.sql")),
];

/// The migrations written in each store's dialect (version, name, SQLite's SQL, PostgreSQL's):
/// triggers, which the two write differently. Each database applies its own store's text.
pub const DIALECT_MIGRATIONS: &[(i64, &str, &str, &str)] = &[
    (
        27,
        "usage",
        include_str!("../../migrations/0027_usage.sqlite.sql"),
        include_str!("../../migrations/0027_usage.postgres.sql"),
    ),
    (
        28,
        "notifications",
        include_str!("../../migrations/0028_notifications.sqlite.sql"),
        include_str!("../../migrations/0028_notifications.postgres.sql"),
    ),
    (
        29,
        "usage_log",
        include_str!("../../migrations/0029_usage_log.sqlite.sql"),
        include_str!("../../migrations/0029_usage_log.postgres.sql"),
    ),
    (
        32,
        "usage_one_instant",
        include_str!("../../migrations/0032_usage_one_instant.sqlite.sql"),
        include_str!("../../migrations/0032_usage_one_instant.postgres.sql"),
    ),
    (
        34,
        "idempotency_keys_only",
        include_str!("../../migrations/0034_idempotency_keys_only.sqlite.sql"),
        include_str!("../../migrations/0034_idempotency_keys_only.postgres.sql"),
    ),
    (
        36,
        "borrowed_usage",
        include_str!("../../migrations/0036_borrowed_usage.sqlite.sql"),
        include_str!("../../migrations/0036_borrowed_usage.postgres.sql"),
    ),
];

/// Every migration in order, each in `backend`'s text.
pub fn migrations_for(backend: Backend) -> Vec<(i64, &'static str, &'static str)> {
    let mut all: Vec<(i64, &'static str, &'static str)> = MIGRATIONS.to_vec();
    all.extend(DIALECT_MIGRATIONS.iter().map(|&(version, name, sqlite, postgres)| {
        (version, name, if backend == Backend::Sqlite { sqlite } else { postgres })
    }));
    all.sort_by_key(|(version, _, _)| *version);
    all
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone)]
pub struct Db {
    conns: Conns,
    backend: Backend,
    /// The requests served on this database, which its background lane yields to.
    requests: Arc<gsaas_infra::lanes::Requests>,
    /// The connection pool changes keep (see [`pool_change`]).
    kept_writer: Arc<pool_change::KeptWriter>,
}

#[derive(Debug, Clone)]
enum Conns {
    /// PostgreSQL: connections side by side, the requests' and the background lane's (see
    /// [`gsaas_infra::lanes`]).
    Pool { requests: AnyPool, background: AnyPool },
    /// SQLite: the process's one connection (see the module docs), held directly rather than in a
    /// pool of one: a pool pings every connection given back to it, a round trip to SQLite's worker
    /// thread for every checkout. With what each release of it notifies: the checkpointer, which
    /// has nothing to do until it is used.
    One(Arc<tokio::sync::Mutex<AnyConnection>>, Arc<tokio::sync::Notify>),
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Set on each PostgreSQL session unless the URL sets `random_page_cost` itself (`options=-c
/// random_page_cost=...`). gsaasd's writes and reads go by key to a working set that stays in
/// memory, in batches of up to [`MAX_ROWS`] keys; at the default of 4, while a table is small or
/// bloated by churn, PostgreSQL judged a sequential scan of `vms` cheaper than 64 index probes, and
/// took it for a third of the batched VM writes, reads and releases: +0.4 ms of its CPU per launch
/// and terminate, the launch cycles' whole loss against b917a7f (BENCHMARKS.md). 1.1 is the usual
/// figure for data in memory or on SSDs; it changes only how plans are costed.
const RANDOM_PAGE_COST: &str = "SET random_page_cost = 1.1";

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
        let in_memory = backend == Backend::Sqlite
            && prepare_sqlite_file(url).map_err(|e| Error::unavailable("database", e))?;
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
                    &format!("PRAGMA wal_autocheckpoint = {}", checkpoint::BACKSTOP_PAGES),
                ] {
                    sqlx::query(pragma)
                        .execute(&mut conn)
                        .await
                        .map_err(|e| Error::unavailable("database", e))?;
                }
                let conn = Arc::new(tokio::sync::Mutex::new(conn));
                let used = Arc::new(tokio::sync::Notify::new());
                if !in_memory {
                    checkpoint::spawn_checkpointer(options, Arc::downgrade(&conn), used.clone());
                }
                Conns::One(conn, used)
            }
            Backend::Postgres => {
                // A ping per checkout doubles the round trips of a one-query read; a broken
                // connection surfaces as an error of the query instead, and the pool replaces it.
                let tune_planner = !url.contains("random_page_cost");
                let pool = move || {
                    AnyPoolOptions::new().test_before_acquire(false).after_connect(
                        move |conn, _| {
                            Box::pin(async move {
                                if tune_planner {
                                    sqlx::query(RANDOM_PAGE_COST).execute(conn).await?;
                                }
                                Ok(())
                            })
                        },
                    )
                };
                // Each lane's connections named in `pg_stat_activity`, unless the URL names them.
                let named = |name: &str| -> Result<AnyConnectOptions, Error> {
                    if url.contains("application_name=") {
                        return Ok(options.clone());
                    }
                    let separator = if url.contains('?') { '&' } else { '?' };
                    format!("{url}{separator}application_name={name}")
                        .parse()
                        .map_err(|e| Error::unavailable("database", e))
                };
                Conns::Pool {
                    requests: pool()
                        .max_connections(16)
                        .connect_with(named("gsaasd")?)
                        .await
                        .map_err(|e| Error::unavailable("database", e))?,
                    // Connected when first used, from the background lane, whose runtime then
                    // drives them.
                    background: pool()
                        .max_connections(gsaas_infra::lanes::BACKGROUND_CONNECTIONS)
                        .connect_lazy_with(named("gsaasd-background")?),
                }
            }
        };
        let db =
            Db { conns, backend, requests: Default::default(), kept_writer: Default::default() };
        db.migrate().await?;
        Ok(db)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The requests served on this database (see [`gsaas_infra::lanes`]).
    pub fn requests(&self) -> &Arc<gsaas_infra::lanes::Requests> {
        &self.requests
    }

    /// A connection: SQLite's one, or one of PostgreSQL's pool. A single write statement is atomic
    /// by itself (autocommit) and saves the BEGIN and COMMIT round trips of a [`WriteTx`].
    pub(crate) async fn connection(&self) -> Result<Conn, Error> {
        Ok(match &self.conns {
            Conns::Pool { requests, background } => {
                let pool = if gsaas_infra::lanes::on_background() {
                    self.requests.admit_background().await;
                    background
                } else {
                    requests
                };
                Conn::Pooled(pool.acquire().await?)
            }
            Conns::One(conn, used) => {
                Conn::One(OneConn { conn: conn.clone().lock_owned().await, used: used.clone() })
            }
        })
    }

    /// For tests (the `testing` feature): a connection, to set up what the service never writes.
    #[cfg(feature = "testing")]
    pub async fn conn(&self) -> Result<Conn, Error> {
        self.connection().await
    }

    /// For tests (the `testing` feature): a write transaction.
    #[cfg(feature = "testing")]
    pub async fn begin(&self) -> Result<WriteTx, Error> {
        self.begin_write().await
    }

    pub(crate) async fn begin_write(&self) -> Result<WriteTx, Error> {
        Self::begin_on(self.connection().await?).await
    }

    /// Begins a transaction on a connection the caller kept (see [`WriteTx::commit_keeping`]).
    pub(crate) async fn begin_on(mut conn: Conn) -> Result<WriteTx, Error> {
        AnyTransactionManager::begin(&mut conn, None).await?;
        Ok(WriteTx { conn: Some(conn), open: true })
    }

    async fn migrate(&self) -> Result<(), Error> {
        let mut conn = self.connection().await?;
        migrations::run(&mut conn, self.backend, &migrations_for(self.backend)).await
    }

    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.connection().await?;
        sqlx::query("SELECT 1")
            .execute(&mut *conn)
            .await
            .map_err(|e| Error::unavailable("database", e))?;
        Ok(())
    }
}

/// Prepares a SQLite database file for tenants' data: its directory 0700 and the file (with its
/// WAL and shared-memory files, which SQLite creates with the database file's mode) 0600, created
/// empty if it does not exist yet. Directories that exist already are closed where gsaasd may
/// (a mounted volume's root may not be its own). Returns whether the database lives in memory
/// (no file to prepare).
fn prepare_sqlite_file(url: &str) -> std::io::Result<bool> {
    use gsaas_infra::files::{create_private_dir, open_private, restrict, FILE_MODE};
    let path = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let path = std::path::Path::new(path.split('?').next().unwrap_or(path));
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        return Ok(true);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = create_private_dir(dir) {
            if !dir.is_dir() {
                return Err(e);
            }
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the database's directory 0700");
        }
    }
    if !path.exists() {
        open_private(path, true)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::Path::new(&file);
        if file.exists() {
            restrict(file, FILE_MODE)?;
        }
    }
    Ok(false)
}

/// The backend's aggregate that joins text with a separator: reads that return a row per parent
/// with its children listed (decoding a row costs far more than SQLite's reading it, so a million
/// children read as a quarter of the rows load several times faster).
fn string_agg(conn: &AnyConnection) -> &'static str {
    if conn.backend_name() == "PostgreSQL" {
        "string_agg"
    } else {
        "group_concat"
    }
}

fn corrupt(what: &str, value: &str) -> Error {
    Error::internal(format!("stored {what} {value:?} is not valid"))
}

/// A stored VM id.
fn vm_id(stored: &str) -> Result<gpgpums::VmId, Error> {
    stored.parse().map_err(|_| corrupt("VM id", stored))
}

/// The VM ids in the first column of `rows`.
fn vm_ids(rows: &[AnyRow]) -> Result<Vec<gpgpums::VmId>, Error> {
    rows.iter().map(|row| vm_id(&row.try_get::<String, _>(0)?)).collect()
}

// ---- pool generation ----

/// Bumps the pool generation; the first statement of every transaction that changes bookings or
/// inventory (see [`begin_pool_write`]). Returns the new generation.
pub async fn bump_generation(conn: &mut AnyConnection) -> Result<i64, Error> {
    let row = sqlx::query(
        "UPDATE pool_state SET generation = generation + 1 WHERE id = 1 RETURNING generation",
    )
    .fetch_one(conn)
    .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// The pool as a write transaction sees it once it holds the pool's row lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolWrite {
    /// The generation, bumped by this transaction.
    pub generation: i64,
    pub queue_head: Option<QueueHead>,
    /// Whether any request waits in the queue: only then is a release worth a queue round.
    /// Requests join the queue only in pool transactions, so this is exact until commit.
    pub queue_waits: bool,
}

/// BEGIN and the bump of [`bump_generation`], as one simple-protocol message on PostgreSQL.
const BEGIN_BUMPING: &str = "BEGIN; UPDATE pool_state SET generation = generation + 1 WHERE id = 1";

/// Begins a transaction on `conn` that bumps the pool generation (which orders the writers of
/// bookings: the row lock is held until it ends), and reads the new generation with the queue's
/// head. On PostgreSQL the BEGIN and the bump go out in one message, a round trip fewer for
/// every launch: each round trip is a hand-off between processes that a busy 2-core machine
/// delays now and then, and the launch's tail is made of those delays. Should that message fail
/// after its BEGIN, the connection may be left in a failed transaction that sqlx does not know
/// of, so it is closed rather than given back to its pool.
pub(crate) async fn begin_pool_write(mut conn: Conn) -> Result<(WriteTx, PoolWrite), Error> {
    let mut tx = if conn.backend_name() == "PostgreSQL" {
        if let Err(e) = AnyTransactionManager::begin(&mut conn, Some(BEGIN_BUMPING.into())).await {
            if let Conn::Pooled(conn) = conn {
                // Already failing: the close's own outcome adds nothing.
                let _ = conn.close().await;
            }
            return Err(e.into());
        }
        WriteTx { conn: Some(conn), open: true }
    } else {
        let mut tx = Db::begin_on(conn).await?;
        bump_generation(&mut tx).await?;
        tx
    };
    let row = sqlx::query(&format!(
        "SELECT p.generation, \
             (SELECT COUNT(*) FROM (SELECT 1 FROM queue LIMIT 1) AS waiting), \
             {QUEUE_HEAD_COLUMNS} FROM pool_state p \
         LEFT JOIN queue q ON q.head > 0 WHERE p.id = 1"
    ))
    .fetch_one(&mut *tx)
    .await?;
    let state = PoolWrite {
        generation: row.try_get(0)?,
        queue_waits: row.try_get::<i64, _>(1)? > 0,
        queue_head: queue_head_at(&row, 2)?,
    };
    Ok((tx, state))
}

/// Everything the in-memory pool is built from, read in one transaction (see [`read_pool_rows`]).
#[derive(Debug)]
pub struct PoolRows {
    pub hosts: Vec<model::HostRecord>,
    pub gpus: Vec<model::GpuRecord>,
    pub taints: Vec<(gpgpums::GpuId, String)>,
    pub quotas: Vec<(gpgpums::ProjectId, gpgpums::Quota)>,
    pub cohorts: Vec<(gpgpums::CohortName, Members)>,
    pub held: Vec<HeldVm>,
    pub fences: Vec<model::FenceRecord>,
}

/// Reads what the pool is built from, on `conn` (a pool transaction's, when it reloads).
pub async fn read_pool_rows(conn: &mut AnyConnection) -> Result<PoolRows, Error> {
    Ok(PoolRows {
        hosts: hosts(conn).await?,
        gpus: gpus(conn).await?,
        taints: gpu_taints(conn).await?,
        quotas: quotas(conn).await?,
        cohorts: cohorts(conn).await?,
        held: held_cgpus(conn).await?,
        fences: fences(conn).await?,
    })
}

/// The pool generation (moved by every pool transaction).
pub async fn pool_generation(conn: &mut AnyConnection) -> Result<i64, Error> {
    let row = sqlx::query("SELECT generation FROM pool_state WHERE id = 1").fetch_one(conn).await?;
    Ok(row.try_get::<i64, _>(0)?)
}

impl Db {
    /// The pool's rows and their generation as of one moment: one read transaction.
    pub async fn pool_snapshot(&self) -> Result<(i64, PoolRows), Error> {
        let mut tx = self.begin_write().await?;
        let generation = pool_generation(&mut tx).await?;
        let rows = read_pool_rows(&mut tx).await?;
        tx.commit().await?;
        Ok((generation, rows))
    }
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

    fn bind_to(self, query: AnyQuery<'_>) -> AnyQuery<'_> {
        match self {
            Param::Text(text) => query.bind(text),
            Param::Int(int) => query.bind(int),
        }
    }
}

/// `rows` tuples of `columns` placeholders: `($1, $2), ($3, $4)` (numbered after the statement's
/// first `before` parameters), or `(?, ?), (?, ?)` on SQLite, where numbered parameters cost a
/// lookup each that grows with their count.
fn placeholders(conn: &AnyConnection, rows: usize, columns: usize, before: usize) -> String {
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
                out.push_str(&format!("${}", before + row * columns + column + 1));
            }
        }
        out.push(')');
    }
    out
}

/// A `VALUES` list of rows (all of the same shape, at least one) and its parameters, padded to a
/// power of two with rows of NULLs (which match nothing), so a statement comes in a few shapes
/// that the statement caches keep prepared.
struct Values {
    sql: String,
    params: Vec<Param>,
}

fn padded_values(conn: &AnyConnection, rows: &[Vec<Param>], before: usize) -> Values {
    let padding: Vec<Param> = rows[0].iter().map(Param::null_like).collect();
    let padded_len = rows.len().next_power_of_two();
    let padding_rows = std::iter::repeat_n(&padding, padded_len - rows.len());
    Values {
        sql: placeholders(conn, padded_len, padding.len(), before),
        params: rows.iter().chain(padding_rows).flatten().cloned().collect(),
    }
}

/// Runs `sql(values)` once per `chunk` rows (see [`padded_values`]) and returns every row it
/// answers.
async fn fetch_batched(
    conn: &mut AnyConnection,
    rows: Vec<Vec<Param>>,
    chunk: usize,
    sql: impl Fn(&str) -> String,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut answered = Vec::new();
    for chunk in rows.chunks(chunk) {
        let values = padded_values(conn, chunk, 0);
        let sql = sql(&values.sql);
        let mut query: AnyQuery<'_> = sqlx::query(&sql);
        for param in values.params {
            query = param.bind_to(query);
        }
        answered.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(answered)
}

/// The rows `sql` reads for `vms`, in one statement per [`MAX_ROWS`] VMs (`sql` names them as
/// `IN (VALUES {values})`).
async fn fetch_for_vms(
    conn: &mut AnyConnection,
    vms: &[gpgpums::VmId],
    sql: impl Fn(&str) -> String,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let ids: Vec<String> = vms.iter().map(gpgpums::VmId::to_string).collect();
    fetch_batched(conn, keys(ids.iter().map(String::as_str)), MAX_ROWS, sql).await
}

/// The rows of a batch keyed by one text column each.
fn keys<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<Vec<Param>> {
    keys.map(|key| vec![Param::text(key)]).collect()
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;
