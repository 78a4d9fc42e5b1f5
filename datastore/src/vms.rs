//! VMs: the launch records, their saga's progress and lease, and the batched writes of both.

use gpgpums::{HostId, VmId};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::cgpus::{
    cgpu_from_row_at, cgpu_params, insert_cgpus_from, insert_first_cgpus, listed_cgpus,
    CGPU_COLUMNS, CGPU_COLUMN_COUNT, CGPU_INSERT_COLUMNS, CGPU_ROWS, LISTED_CGPU,
};
use super::{corrupt, fetch_batched, keys, padded_values, string_agg, Param, MAX_ROWS};
use crate::error::Error;
use crate::model::*;
use gsaas_clouds::cloud::ServerId;

/// A VM's columns, read by position (see [`vm_from_row`]); `v.` names them in joins.
pub(super) const VM_COLUMNS: &str = "v.id, v.project, v.owner, v.name, v.request, v.policy, v.state, v.error, v.step, \
    v.server_id, v.host, v.fixed_ip, v.tap, v.routes_on, v.timings, v.created_ms, v.updated_ms, v.version, v.extras_version";
pub(super) const VM_COLUMN_COUNT: usize = 19;

pub(super) fn vm_from_row(row: &AnyRow) -> Result<VmRecord, Error> {
    vm_from_row_at(row, 0)
}

/// A VM from [`VM_COLUMNS`] starting at column `at`.
fn vm_from_row_at(row: &AnyRow, at: usize) -> Result<VmRecord, Error> {
    let id: String = row.try_get(at)?;
    let request: String = row.try_get(at + 4)?;
    let state: String = row.try_get(at + 6)?;
    let step: String = row.try_get(at + 8)?;
    let host: Option<String> = row.try_get(at + 10)?;
    let fixed_ip: Option<String> = row.try_get(at + 11)?;
    let timings: String = row.try_get(at + 14)?;
    Ok(VmRecord {
        id: super::vm_id(&id)?,
        project: row.try_get(at + 1)?,
        owner: row.try_get(at + 2)?,
        name: row.try_get(at + 3)?,
        spec: serde_json::from_str::<LaunchSpec>(&request)
            .map_err(|_| corrupt("launch request", &request))?
            .with_stored_defaults(),
        policy: row.try_get(at + 5)?,
        state: VmState::parse(&state).ok_or_else(|| corrupt("VM state", &state))?,
        error: row.try_get(at + 7)?,
        step: SagaStep::parse(&step).ok_or_else(|| corrupt("saga step", &step))?,
        server_id: row.try_get::<Option<String>, _>(at + 9)?.map(ServerId),
        host: host.map(|h| HostId::new(&h).map_err(|_| corrupt("host name", &h))).transpose()?,
        fixed_ip: fixed_ip
            .map(|ip| ip.parse().map_err(|_| corrupt("fixed IP", &ip)))
            .transpose()?,
        tap: row.try_get(at + 12)?,
        routes_on: row.try_get::<i64, _>(at + 13)? != 0,
        timings: serde_json::from_str(&timings).map_err(|_| corrupt("timings", &timings))?,
        created_ms: row.try_get(at + 15)?,
        updated_ms: row.try_get(at + 16)?,
        version: row.try_get(at + 17)?,
        extras_version: row.try_get(at + 18)?,
    })
}

/// The rows of [`vms_and_cgpus`], grouped back into VMs in order.
fn vms_with_cgpus_from_rows(rows: &[AnyRow]) -> Result<Vec<(VmRecord, Vec<CgpuRecord>)>, Error> {
    let mut out: Vec<(VmRecord, Vec<CgpuRecord>)> = Vec::new();
    for row in rows {
        if row.try_get::<i64, _>(2)? == 0 {
            out.push((vm_from_row_at(row, 3)?, Vec::new()));
            continue;
        }
        let cgpu = cgpu_from_row_at(row, 3 + VM_COLUMN_COUNT)?;
        match out.last_mut() {
            Some((vm, cgpus)) if vm.id == cgpu.vm => cgpus.push(cgpu),
            _ => return Err(corrupt("cGPU of no VM read before it", &cgpu.vm.to_string())),
        }
    }
    Ok(out)
}

/// One statement that reads the VMs `wanted` selects (`id, created_ms` of each, a list's page) and
/// their cGPUs without repeating a VM's columns on each of its cGPUs' rows, as a join would: at 75
/// cGPUs a join decoded the VM's 18 columns (its launch request among them) 75 times. Each row is
/// `(created_ms, id, kind, VM columns, cGPU columns)`: kind 0 is the VM's row (NULL cGPU
/// columns), kind 1 a cGPU's (NULL VM columns), the VM's first; the VMs newest first, as lists
/// show them. `CROSS JOIN` keeps `wanted` the outer loop: with a plain join SQLite 3.46 chose to
/// scan every cGPU and probe `wanted` (176 ms at 400,000 cGPUs, 1.4 s at a million, against 2
/// ms).
fn vms_and_cgpus(wanted: &str) -> String {
    let nulls = |n: usize| vec!["NULL"; n].join(", ");
    let (vm_nulls, cgpu_nulls) = (nulls(VM_COLUMN_COUNT), nulls(CGPU_COLUMN_COUNT));
    // Output positions: 3 kind, then the cGPU's seq and idx (see CGPU_COLUMNS).
    let (seq, idx) = (4 + VM_COLUMN_COUNT + 11, 4 + VM_COLUMN_COUNT + 1);
    format!(
        "WITH wanted (id, created_ms) AS ({wanted}) \
         SELECT w.created_ms, w.id, CAST(0 AS BIGINT), {VM_COLUMNS}, {cgpu_nulls} \
         FROM wanted w CROSS JOIN vms v WHERE v.id = w.id \
         UNION ALL \
         SELECT w.created_ms, w.id, CAST(1 AS BIGINT), {vm_nulls}, {CGPU_COLUMNS} \
         FROM wanted w CROSS JOIN cgpus c JOIN gpus g ON g.id = c.gpu WHERE c.vm = w.id \
         ORDER BY 1 DESC, 2 DESC, 3, {seq}, {idx}"
    )
}

/// A VM as [`vms_with_cgpus_by_id`] read it.
#[derive(Debug)]
pub struct ReadVm {
    pub vm: VmRecord,
    /// Its cGPUs, unless they are as of the `cgpus_version` the reader said it holds.
    pub cgpus: Option<Vec<CgpuRecord>>,
    /// The version of its cGPU rows (see [`super::cgpus`]'s module docs).
    pub cgpus_version: i64,
    /// Whether it has queue entries or events (what its view shows besides it, see
    /// [`super::queue_places_and_events`]), as of the same snapshot.
    pub extras: bool,
}

/// VMs and their cGPUs, by id, each with the `cgpus_version` the caller holds its cGPUs as of
/// (`None`: it holds none); unknown ids are left out. Answers in id order.
///
/// One statement per [`MAX_ROWS`] ids, a row per VM with its cGPUs listed in one text column (see
/// [`super::cgpus::LISTED_CGPU`]), or none when the caller's version is current: one snapshot of
/// a VM and its cGPUs on either store, and one row to hand over and convert per VM. Every column
/// of every row costs a conversion (sqlx's `Any` rows) and, on SQLite, a hand-over from its
/// worker thread: a VM of 75 cGPUs was 76 rows of up to 31 columns, read and converted on every
/// poll of its view, and a batch of one-cGPU VMs took two statements.
pub async fn vms_with_cgpus_by_id(
    conn: &mut AnyConnection,
    wanted: &[(VmId, Option<i64>)],
) -> Result<Vec<ReadVm>, Error> {
    let aggregate = string_agg(conn);
    let rows = wanted
        .iter()
        .map(|(id, held)| vec![Param::text(id.to_string()), Param::Int(*held)])
        .collect();
    // `CROSS JOIN` keeps the wanted ids the outer loop (see [`vms_and_cgpus`]).
    let rows = fetch_batched(conn, rows, MAX_ROWS, |values| {
        format!(
            "WITH k (id, held) AS (VALUES {values}) \
             SELECT {VM_COLUMNS}, v.cgpus_version, CASE WHEN v.cgpus_version = k.held THEN NULL \
             ELSE (SELECT {aggregate}({LISTED_CGPU}, ',') \
                   FROM cgpus c JOIN gpus g ON g.id = c.gpu WHERE c.vm = v.id) END, \
             CAST(CASE WHEN EXISTS (SELECT 1 FROM queue q WHERE q.vm = v.id) \
                 OR EXISTS (SELECT 1 FROM vm_events e WHERE e.vm = v.id) THEN 1 ELSE 0 END \
                 AS BIGINT) \
             FROM k CROSS JOIN vms v WHERE v.id = k.id"
        )
    })
    .await?;
    let held: std::collections::HashMap<VmId, Option<i64>> = wanted.iter().copied().collect();
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let vm = vm_from_row(row)?;
        let cgpus_version: i64 = row.try_get(VM_COLUMN_COUNT)?;
        let cgpus = if held.get(&vm.id).copied().flatten() == Some(cgpus_version) {
            None
        } else {
            Some(match row.try_get::<Option<&str>, _>(VM_COLUMN_COUNT + 1)? {
                Some(listed) => listed_cgpus(vm.id, listed)?,
                None => Vec::new(),
            })
        };
        let extras = row.try_get::<i64, _>(VM_COLUMN_COUNT + 2)? != 0;
        out.push(ReadVm { vm, cgpus, cgpus_version, extras });
    }
    out.sort_unstable_by_key(|read| read.vm.id);
    Ok(out)
}

/// Which VMs a list shows (see [`vm_page`]).
#[derive(Debug, Clone, Default)]
pub struct VmFilter<'a> {
    /// One project's; every project's for `None`.
    pub project: Option<&'a str>,
    pub state: Option<VmState>,
    pub name: Option<&'a str>,
    /// Deleted VMs too (a `state` of deleted includes them anyway).
    pub include_deleted: bool,
}

/// Where a VM stands in the list order (newest first): the key a page continues after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPosition {
    pub created_ms: i64,
    pub id: VmId,
    pub project: String,
}

/// The VM's place in the list order, or `None` if there is no such VM.
pub async fn list_position(
    conn: &mut AnyConnection,
    id: VmId,
) -> Result<Option<ListPosition>, Error> {
    let row = sqlx::query("SELECT created_ms, project FROM vms WHERE id = $1")
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?;
    row.map(|row| Ok(ListPosition { created_ms: row.try_get(0)?, id, project: row.try_get(1)? }))
        .transpose()
}

/// Up to `limit` VMs that `filter` shows, newest first (ties by id, descending), after `after`,
/// with their cGPUs: one query whatever the table's size, which walks an index in list order
/// (`vms_by_created`, or `vms_by_project` for one project's).
pub async fn vm_page(
    conn: &mut AnyConnection,
    filter: &VmFilter<'_>,
    after: Option<&ListPosition>,
    limit: usize,
) -> Result<Vec<(VmRecord, Vec<CgpuRecord>)>, Error> {
    let mut conditions: Vec<String> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    // Text parameters, numbered in order.
    let mut equal = |conditions: &mut Vec<String>, column: &str, value: &str| {
        texts.push(value.to_owned());
        conditions.push(format!("{column} = ${}", texts.len()));
    };
    if let Some(project) = filter.project {
        equal(&mut conditions, "project", project);
    }
    match filter.state {
        Some(state) => equal(&mut conditions, "state", state.as_str()),
        None if !filter.include_deleted => conditions.push("state <> 'deleted'".to_owned()),
        None => {}
    }
    if let Some(name) = filter.name {
        equal(&mut conditions, "name", name);
    }
    let mut created = None;
    if let Some(after) = after {
        created = Some(after.created_ms);
        texts.push(after.id.to_string());
        // The id's placeholder is numbered last, after created_ms's.
        conditions.push(format!(
            "(created_ms < ${created} OR (created_ms = ${created} AND id < ${id}))",
            created = texts.len() + 1,
            id = texts.len()
        ));
    }
    let limit_param = texts.len() + usize::from(created.is_some()) + 1;
    let filter_sql = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    let sql = vms_and_cgpus(&format!(
        "SELECT id, created_ms FROM vms {filter_sql} \
         ORDER BY created_ms DESC, id DESC LIMIT ${limit_param}"
    ));
    let mut query = sqlx::query(&sql);
    for text in texts {
        query = query.bind(text);
    }
    if let Some(created) = created {
        query = query.bind(created);
    }
    let rows = query.bind(i64::try_from(limit).unwrap_or(i64::MAX)).fetch_all(conn).await?;
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

const NEW_VM_COLUMNS: &str =
    "id, project, owner, name, request, policy, state, error, step, timings, \
    idempotency_key, request_digest, saga_owner, saga_lease_until_ms, created_ms, updated_ms, \
    preemptible, priority, remoting, local_cpu_milli, local_memory_mib";

fn new_vm_params(new: &NewVm<'_>) -> Vec<Param> {
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
        Param::Int(Some(i64::from(vm.spec.preemptible))),
        Param::Int(Some(i64::from(vm.spec.priority))),
        Param::text(vm.spec.remoting().as_str()),
        // Bounded by `Resources::problem` (at most 2^30).
        Param::Int(vm.spec.gpus.vm_resources.map(|r| r.cpu_milli as i64)),
        Param::Int(vm.spec.gpus.vm_resources.map(|r| r.memory_mib as i64)),
    ]
}

/// The insert of the VMs listed in the `WITH` list named `v`.
fn insert_vms_from(v: &str) -> String {
    format!(
        "INSERT INTO vms ({NEW_VM_COLUMNS}) SELECT {NEW_VM_COLUMNS} FROM {v} WHERE id IS NOT NULL"
    )
}

fn idempotency_conflict() -> Error {
    Error::Conflict("a VM with this Idempotency-Key already exists".into())
}

/// Inserts new VMs (no server, host or routes yet).
pub async fn insert_vms(conn: &mut AnyConnection, new: &[NewVm<'_>]) -> Result<(), Error> {
    let rows = new.iter().map(new_vm_params).collect();
    fetch_batched(conn, rows, MAX_ROWS, |values| {
        format!("WITH v ({NEW_VM_COLUMNS}) AS (VALUES {values}) {}", insert_vms_from("v"))
    })
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => idempotency_conflict(),
        _ => Error::from(e),
    })?;
    Ok(())
}

/// Inserts new VMs and books their cGPUs: [`insert_vms`] then [`super::insert_cgpus`], or on
/// PostgreSQL, when they fit, one statement that does both (a data-modifying `WITH`), a round
/// trip fewer for every launch (see [`super::begin_pool_write`]). That statement inserts the VMs
/// last, so the usage log has their cGPUs' starts ahead of theirs (the fold starts them together).
pub async fn insert_vms_with_cgpus(
    conn: &mut AnyConnection,
    new: &[NewVm<'_>],
    cgpus: &[CgpuRecord],
) -> Result<(), Error> {
    let fits = (1..=MAX_ROWS).contains(&new.len()) && (1..=CGPU_ROWS).contains(&cgpus.len());
    if conn.backend_name() != "PostgreSQL" || !fits {
        insert_vms(conn, new).await?;
        return insert_first_cgpus(conn, cgpus).await;
    }
    let vms: Vec<Vec<Param>> = new.iter().map(new_vm_params).collect();
    let cgpus: Vec<Vec<Param>> = cgpus.iter().map(cgpu_params).collect();
    let vm_values = padded_values(conn, &vms, 0);
    let cgpu_values = padded_values(conn, &cgpus, vm_values.params.len());
    let sql = format!(
        "WITH v ({NEW_VM_COLUMNS}) AS (VALUES {}), c ({CGPU_INSERT_COLUMNS}) AS (VALUES {}), \
         inserted AS ({}) {}",
        vm_values.sql,
        cgpu_values.sql,
        insert_vms_from("v"),
        insert_cgpus_from("c"),
    );
    let mut query = sqlx::query(&sql);
    for param in vm_values.params.into_iter().chain(cgpu_values.params) {
        query = param.bind_to(query);
    }
    query.execute(conn).await.map_err(|e| match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() && d.table() == Some("vms") => {
            idempotency_conflict()
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
/// in one statement per [`MAX_ROWS`] writes. Written records get their new version and the VM's
/// `extras_version` as of the write. Writing the end of a saga (step `done`) also releases its
/// lease. The ids must be distinct.
pub async fn update_vms(
    conn: &mut AnyConnection,
    writes: &mut [VmWrite],
) -> Result<Vec<Written>, Error> {
    write_vms(conn, writes, "").await
}

/// [`update_vms`] for VMs whose cGPUs the same transaction releases
/// ([`delete_cgpus`](super::delete_cgpus)): each written VM's `cgpus_version` moves with the
/// write, not in a second `UPDATE` of the same rows (on PostgreSQL a second row version, and a
/// statement inside the pool's transaction that every booking waits for).
pub async fn update_vms_releasing_cgpus(
    conn: &mut AnyConnection,
    writes: &mut [VmWrite],
) -> Result<Vec<Written>, Error> {
    write_vms(conn, writes, ", cgpus_version = vms.cgpus_version + 1").await
}

/// [`update_vms`], with `also_set` (empty or `, column = expression`) added to the `SET`.
async fn write_vms(
    conn: &mut AnyConnection,
    writes: &mut [VmWrite],
    also_set: &str,
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
                 WHEN {CLAIMABLE} THEN v.claim_until ELSE vms.saga_lease_until_ms END{also_set} \
             FROM v WHERE vms.id = v.id AND vms.version = v.version \
             RETURNING vms.id, vms.saga_owner, vms.extras_version"
        )
    })
    .await?;
    let mut owners = std::collections::HashMap::new();
    for row in answered {
        let id: String = row.try_get(0)?;
        let owner: Option<String> = row.try_get(1)?;
        let extras_version: i64 = row.try_get(2)?;
        owners.insert(id, (owner, extras_version));
    }
    Ok(writes
        .iter_mut()
        .map(|write| match owners.get(&write.vm.id.to_string()) {
            None => Written::Stale,
            Some((owner, extras_version)) => {
                write.vm.version += 1;
                write.vm.extras_version = *extras_version;
                let claimed = write
                    .claim
                    .as_ref()
                    .is_some_and(|c| owner.as_deref() == Some(c.owner.as_str()));
                Written::Done { claimed }
            }
        })
        .collect())
}

/// Bumps the VM's `extras_version`: every statement that adds a queue entry or an event of the VM
/// calls this in its transaction (see [`VmRecord::extras_version`]).
pub(super) async fn extras_added(conn: &mut AnyConnection, vm: VmId) -> Result<(), Error> {
    sqlx::query("UPDATE vms SET extras_version = extras_version + 1 WHERE id = $1")
        .bind(vm.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn vm(conn: &mut AnyConnection, id: VmId) -> Result<Option<VmRecord>, Error> {
    let row = sqlx::query(&format!("SELECT {VM_COLUMNS} FROM vms v WHERE id = $1"))
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(vm_from_row).transpose()
}

/// Where a VM's server runs as gsaasd last recorded it: what cloud drift compares the cloud's
/// listing with, without reading whole VMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmServer {
    pub vm: VmId,
    pub server: ServerId,
    pub host: Option<HostId>,
    /// Ready, with no saga step left (a VM still launching learns its host from its saga).
    pub settled: bool,
    pub ready: bool,
    pub updated_ms: i64,
}

/// [`VmServer`]'s columns, read by [`vm_server_from_row`].
const VM_SERVER_SELECT: &str =
    "SELECT v.id, v.server_id, v.host, v.state, v.step, v.updated_ms FROM vms v";

fn vm_server_from_row(row: &AnyRow) -> Result<VmServer, Error> {
    let id: String = row.try_get(0)?;
    let host: Option<String> = row.try_get(2)?;
    let state: String = row.try_get(3)?;
    let step: String = row.try_get(4)?;
    Ok(VmServer {
        vm: super::vm_id(&id)?,
        server: ServerId(row.try_get(1)?),
        host: host.map(|h| HostId::new(&h).map_err(|_| corrupt("host name", &h))).transpose()?,
        settled: state == "ready" && step == "done",
        ready: state == "ready",
        updated_ms: row.try_get(5)?,
    })
}

/// The creating and ready VMs on `servers`.
pub async fn vms_on_servers(
    conn: &mut AnyConnection,
    servers: &[ServerId],
) -> Result<Vec<VmServer>, Error> {
    let rows =
        fetch_batched(conn, keys(servers.iter().map(|s| s.0.as_str())), MAX_ROWS, |values| {
            format!(
                "{VM_SERVER_SELECT} \
                 WHERE v.server_id IN (VALUES {values}) AND v.state IN ('creating', 'ready')"
            )
        })
        .await?;
    rows.iter().map(vm_server_from_row).collect()
}

/// Every creating and ready VM with a server, in no particular order. A first pass reads all
/// of them (a quarter of a million at the scale bench's size), so they are listed as text (see
/// [`super::cgpus::listed`]), each "id updated-ms state step host server", with no host as an
/// empty field and the server id last, its `%` and commas escaped (Nova's are UUIDs; others may
/// hold anything).
pub async fn vms_with_servers(conn: &mut AnyConnection) -> Result<Vec<VmServer>, Error> {
    let entry = "id || ' ' || updated_ms || ' ' || state || ' ' || step || ' ' \
                 || coalesce(host, '') || ' ' || replace(replace(server_id, '%', '%25'), ',', '%2C')";
    let filter = "server_id IS NOT NULL AND state IN ('creating', 'ready')";
    let mut vms = Vec::new();
    super::cgpus::listed(conn, "vms", entry, filter, |listed| {
        let bad = || corrupt("VM with a server", listed);
        let mut fields = listed.splitn(6, ' ');
        let mut field = || fields.next().ok_or_else(bad);
        let (id, updated_ms, state, step, host, server) =
            (field()?, field()?, field()?, field()?, field()?, field()?);
        vms.push(VmServer {
            vm: super::vm_id(id)?,
            server: ServerId(unescape_listed(server)),
            host: match host {
                "" => None,
                host => Some(HostId::new(host).map_err(|_| corrupt("host name", host))?),
            },
            settled: state == "ready" && step == "done",
            ready: state == "ready",
            updated_ms: updated_ms.parse().map_err(|_| bad())?,
        });
        Ok(())
    })
    .await?;
    Ok(vms)
}

/// Undoes the escaping of `%` (`%25`) and `,` (`%2C`) in a listed field.
fn unescape_listed(field: &str) -> String {
    if !field.contains('%') {
        return field.to_owned();
    }
    field.split("%25").map(|part| part.replace("%2C", ",")).collect::<Vec<_>>().join("%")
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
            Ok(Some((super::vm_id(&id)?, digest.unwrap_or_default())))
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
    super::vm_ids(&rows)
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
