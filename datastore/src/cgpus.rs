//! cGPUs: a VM's bookings on GPUs, and the routes they give each host.
//!
//! Every function here that changes a VM's cGPU rows bumps the VM's `cgpus_version` in the same
//! transaction (the one exception: a launch's first cGPUs, inserted with their new VM). A reader
//! that holds a VM's cGPUs as of one `cgpus_version` may then skip reading them again (see
//! [`super::vms_with_cgpus_by_id`]). A cGPU also shows its GPU's host and rCUDA endpoint, which
//! never change while a cGPU is booked on the GPU (a GPU row is only inserted or deleted, and
//! the cGPUs' foreign key keeps it while booked), except by a re-home ([`super::move_cgpu`]).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use gpgpums::{GpuId, HostId, VmId};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, string_agg, Param, MAX_ROWS};
use crate::error::Error;
use crate::model::*;

pub(super) const CGPU_COLUMNS: &str =
    "c.vm, c.idx, c.gpu, g.host, c.memory_mib, c.mode, c.masked_address, c.masked_port, \
     g.rcuda_address, g.rcuda_port, g.rcuda_gpu_number, c.seq, c.state, c.compute_percent, \
     c.borrowed_ms";
pub(super) const CGPU_COLUMN_COUNT: usize = 15;

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
        vm: super::vm_id(&vm)?,
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
        compute_percent: compute_percent(row.try_get::<Option<i64>, _>(at + 13)?)?,
        borrowed_ms: row.try_get::<Option<i64>, _>(at + 14)?,
    })
}

/// A stored compute share: 1 to 100, or none (`cgpus`' and `fenced_cgpus`' column alike).
pub(super) fn compute_percent(stored: Option<i64>) -> Result<Option<u8>, Error> {
    match stored {
        None | Some(0) => Ok(None),
        Some(p @ 1..=100) => Ok(Some(p as u8)),
        Some(p) => Err(corrupt("compute share", &p.to_string())),
    }
}

/// A cGPU as one text, for reads that list a VM's cGPUs in one column (`c` the cGPU, `g` its GPU):
/// "seq index gpu host memory mode masked-address masked-port rcuda-address rcuda-port
/// gpu-number state compute-percent borrowed-ms" (compute-percent 0: none; borrowed-ms -1: not on
/// loan). No field holds a space or a comma: ids and host names are of letters,
/// digits and `.-_:` (see `gpgpums::ids`), the rest numbers, addresses and fixed words.
pub(super) const LISTED_CGPU: &str =
    "c.seq || ' ' || c.idx || ' ' || c.gpu || ' ' || g.host || ' ' || c.memory_mib || ' ' \
     || c.mode || ' ' || c.masked_address || ' ' || c.masked_port || ' ' || g.rcuda_address \
     || ' ' || g.rcuda_port || ' ' || g.rcuda_gpu_number || ' ' || c.state || ' ' \
     || COALESCE(c.compute_percent, 0) || ' ' || COALESCE(c.borrowed_ms, -1)";

/// The cGPUs of `vm` from a list of [`LISTED_CGPU`]s joined by commas, as attached (by seq, then
/// index: the list itself comes in no particular order).
pub(super) fn listed_cgpus(vm: VmId, listed: &str) -> Result<Vec<CgpuRecord>, Error> {
    let mut cgpus = listed
        .split(',')
        .map(|cgpu| listed_cgpu(vm, cgpu).ok_or_else(|| corrupt("cGPU", cgpu)))
        .collect::<Result<Vec<_>, _>>()?;
    cgpus.sort_unstable_by_key(|cgpu| (cgpu.seq, cgpu.index));
    Ok(cgpus)
}

fn listed_cgpu(vm: VmId, listed: &str) -> Option<CgpuRecord> {
    let mut fields = listed.split(' ');
    let mut next = || fields.next();
    let cgpu = CgpuRecord {
        vm,
        seq: next()?.parse().ok()?,
        index: next()?.parse().ok()?,
        gpu: GpuId::new(next()?).ok()?,
        host: HostId::new(next()?).ok()?,
        memory_mib: next()?.parse().ok()?,
        mode: parse_mode(next()?)?,
        masked_address: next()?.parse().ok()?,
        masked_port: next()?.parse().ok()?,
        rcuda_address: next()?.parse().ok()?,
        rcuda_port: next()?.parse().ok()?,
        rcuda_gpu_number: next()?.parse().ok()?,
        state: CgpuState::parse(next()?)?,
        compute_percent: compute_percent(Some(next()?.parse().ok()?)).ok()?,
        borrowed_ms: match next()?.parse().ok()? {
            -1 => None,
            ms => Some(ms),
        },
    };
    next().is_none().then_some(cgpu)
}

pub(super) const CGPU_INSERT_COLUMNS: &str =
    "vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, state, compute_percent, \
     borrowed_ms";

/// The most cGPUs one insert carries: wider than VMs, as a VM may hold a thousand cGPUs.
pub(super) const CGPU_ROWS: usize = 8 * MAX_ROWS;

pub(super) fn cgpu_params(cgpu: &CgpuRecord) -> Vec<Param> {
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
        Param::Int(cgpu.compute_percent.map(i64::from)),
        Param::Int(cgpu.borrowed_ms),
    ]
}

/// The insert of the cGPUs listed in the `WITH` list named `c`.
pub(super) fn insert_cgpus_from(c: &str) -> String {
    format!(
        "INSERT INTO cgpus ({CGPU_INSERT_COLUMNS}) SELECT {CGPU_INSERT_COLUMNS} FROM {c} \
         WHERE vm IS NOT NULL"
    )
}

/// Books cGPUs of VMs that exist already (an attach, a queued attach's grant).
pub async fn insert_cgpus(conn: &mut AnyConnection, cgpus: &[CgpuRecord]) -> Result<(), Error> {
    insert_first_cgpus(conn, cgpus).await?;
    bump_cgpus_versions(conn, cgpus.iter().map(|c| c.vm)).await
}

/// Books the first cGPUs of VMs inserted in the same transaction: nobody has read them yet, so
/// their `cgpus_version` stays.
pub(super) async fn insert_first_cgpus(
    conn: &mut AnyConnection,
    cgpus: &[CgpuRecord],
) -> Result<(), Error> {
    let rows = cgpus.iter().map(cgpu_params).collect();
    fetch_batched(conn, rows, CGPU_ROWS, |values| {
        format!("WITH c ({CGPU_INSERT_COLUMNS}) AS (VALUES {values}) {}", insert_cgpus_from("c"))
    })
    .await?;
    Ok(())
}

/// Marks the VMs' cGPU rows changed (see the module docs), each VM once however often named.
pub(super) async fn bump_cgpus_versions(
    conn: &mut AnyConnection,
    vms: impl IntoIterator<Item = VmId>,
) -> Result<(), Error> {
    let ids: std::collections::BTreeSet<String> =
        vms.into_iter().map(|id| id.to_string()).collect();
    fetch_batched(conn, keys(ids.iter().map(String::as_str)), 4 * MAX_ROWS, |values| {
        format!("UPDATE vms SET cgpus_version = cgpus_version + 1 WHERE id IN (VALUES {values})")
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

/// A VM's booked cGPUs as the pool holds them (see [`held_cgpus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldVm {
    pub vm: VmId,
    pub project: String,
    /// As attached, a launch's by index.
    pub cgpus: Vec<HeldCgpu>,
    /// The CPU and memory a local VM takes on its GPU host (see `LaunchSpec`'s request).
    pub vm_resources: Option<gpgpums::Resources>,
}

/// One booked cGPU: where the GPU is and its rCUDA endpoint are the GPU's own row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCgpu {
    pub index: u32,
    pub gpu: String,
    pub memory_mib: u64,
    pub mode: gpgpums::Mode,
    pub compute_percent: Option<u8>,
}

/// Every VM that holds cGPUs, with its project and its cGPUs (in VM id order): what loading the
/// pool and the quota ledger needs, most of a start's load at a million cGPUs. Rows are listed as
/// text (see [`string_agg`]; no id or mode has a space or a comma), since decoding a row costs far
/// more than reading it, with no join with `gpus` (the pool has the GPUs).
///
/// On SQLite each statement lists a range of rowids of `cgpus` (or of `vms`, for the projects) as
/// one row: a scan in the table's own order, where grouping by VM walks the primary key's index
/// and looks up every row (at a million cGPUs 0.5 s against 2.8 s, and 16 rows to decode against
/// 250,000). On PostgreSQL one statement lists each table: at a million cGPUs 1.7-1.8 s against
/// 2.2-2.4 s for a row per VM (measured back to back in one process).
pub async fn held_cgpus(conn: &mut AnyConnection) -> Result<Vec<HeldVm>, Error> {
    let mut cgpus: Vec<(VmId, i64, HeldCgpu)> = Vec::new();
    let entry = "vm || ' ' || idx || ' ' || seq || ' ' || memory_mib || ' ' || mode || ' ' || gpu \
                 || ' ' || COALESCE(compute_percent, 0)";
    listed(conn, "cgpus", entry, "1 = 1", |listed| {
        let (vm, rest) = listed.split_once(' ').ok_or_else(|| corrupt("cGPU", listed))?;
        let vm: VmId = super::vm_id(vm)?;
        let (seq, cgpu) = held_cgpu(rest).ok_or_else(|| corrupt("cGPU", listed))?;
        cgpus.push((vm, seq, cgpu));
        Ok(())
    })
    .await?;
    cgpus.sort_unstable_by_key(|(vm, seq, cgpu)| (*vm, *seq, cgpu.index));
    let mut projects: std::collections::HashMap<VmId, (String, Option<gpgpums::Resources>)> =
        std::collections::HashMap::new();
    let holders: std::collections::HashSet<VmId> = cgpus.iter().map(|(vm, ..)| *vm).collect();
    // Projects never have a space; a VM without local resources lists `-1 -1`.
    let entry = "id || ' ' || project || ' ' || COALESCE(local_cpu_milli, -1) || ' ' \
                 || COALESCE(local_memory_mib, -1)";
    listed(conn, "vms", entry, "1 = 1", |listed| {
        let held_vm = held_vm(listed).ok_or_else(|| corrupt("VM", listed))?;
        let (vm, project, resources) = held_vm;
        let vm: VmId = super::vm_id(vm)?;
        if holders.contains(&vm) {
            projects.insert(vm, (project.to_owned(), resources));
        }
        Ok(())
    })
    .await?;
    let mut held: Vec<HeldVm> = Vec::with_capacity(projects.len());
    for (vm, _, cgpu) in cgpus {
        match held.last_mut() {
            Some(last) if last.vm == vm => last.cgpus.push(cgpu),
            _ => {
                // As the join of PostgreSQL's read: cGPUs of no VM (which the foreign key
                // forbids) are left out.
                let Some((project, vm_resources)) = projects.remove(&vm) else { continue };
                held.push(HeldVm { vm, project, cgpus: vec![cgpu], vm_resources });
            }
        }
    }
    Ok(held)
}

/// One VM of [`held_cgpus`]'s list, "id project cpu memory" (-1 for none).
fn held_vm(listed: &str) -> Option<(&str, &str, Option<gpgpums::Resources>)> {
    let mut fields = listed.split(' ');
    let (vm, project) = (fields.next()?, fields.next()?);
    let cpu: i64 = fields.next()?.parse().ok()?;
    let memory: i64 = fields.next()?.parse().ok()?;
    let resources = match (cpu, memory) {
        (-1, -1) => None,
        (cpu, memory) => {
            Some(gpgpums::Resources::new(cpu.try_into().ok()?, memory.try_into().ok()?))
        }
    };
    fields.next().is_none().then_some((vm, project, resources))
}

/// How many rowids one statement of [`listed`] lists on SQLite.
const ROWIDS_PER_READ: i64 = 65_536;

/// Hands `each` the `entry` (text without a comma) of every row of `table` that passes `filter`,
/// in no particular order, reading them as text lists rather than rows (see [`held_cgpus`]): on
/// SQLite [`ROWIDS_PER_READ`] rowids a statement, a scan in the table's order; on PostgreSQL one
/// statement, whose one text reaches PostgreSQL's 1 GB limit at some 14 million cGPUs (the first
/// pass then reads its tables per host, see `App::read_tables_ahead`). Statements after the
/// first may see later commits unless the caller holds what changes the table (SQLite's one
/// connection, or a lock the writers take).
pub(super) async fn listed(
    conn: &mut AnyConnection,
    table: &str,
    entry: &str,
    filter: &str,
    mut each: impl FnMut(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut each_of = |list: Option<String>| -> Result<(), Error> {
        list.iter().flat_map(|list| list.split(',')).try_for_each(&mut each)
    };
    if conn.backend_name() == "PostgreSQL" {
        let sql = format!("SELECT string_agg({entry}, ',') FROM {table} WHERE {filter}");
        let row = sqlx::query(&sql).fetch_one(&mut *conn).await?;
        return each_of(row.try_get(0)?);
    }
    let sql = format!(
        "SELECT group_concat({entry}, ',') FROM {table} \
         WHERE rowid > $1 AND rowid <= $2 AND ({filter})"
    );
    let last: Option<i64> = sqlx::query(&format!("SELECT max(rowid) FROM {table}"))
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    let mut after = 0;
    while after < last.unwrap_or(0) {
        let row = sqlx::query(&sql)
            .bind(after)
            .bind(after + ROWIDS_PER_READ)
            .fetch_one(&mut *conn)
            .await?;
        each_of(row.try_get(0)?)?;
        after += ROWIDS_PER_READ;
    }
    Ok(())
}

/// [`held_cgpus`] as a row per VM, grouped by the database: the tests' reference.
#[cfg(test)]
async fn held_cgpus_by_vm(conn: &mut AnyConnection) -> Result<Vec<HeldVm>, Error> {
    let aggregate = string_agg(conn);
    let rows = sqlx::query(&format!(
        "SELECT c.vm, v.project, {aggregate}(c.idx || ' ' || c.seq || ' ' || c.memory_mib || ' ' \
         || c.mode || ' ' || c.gpu || ' ' || COALESCE(c.compute_percent, 0), ','), \
         v.local_cpu_milli, v.local_memory_mib \
         FROM cgpus c JOIN vms v ON v.id = c.vm \
         GROUP BY c.vm, v.project, v.local_cpu_milli, v.local_memory_mib ORDER BY c.vm"
    ))
    .fetch_all(conn)
    .await?;
    let mut held = Vec::with_capacity(rows.len());
    for row in &rows {
        let vm: &str = row.try_get(0)?;
        let listed: &str = row.try_get(2)?;
        let mut cgpus = listed
            .split(',')
            .map(|cgpu| held_cgpu(cgpu).ok_or_else(|| corrupt("cGPU", cgpu)))
            .collect::<Result<Vec<_>, _>>()?;
        cgpus.sort_by_key(|(seq, cgpu)| (*seq, cgpu.index));
        held.push(HeldVm {
            vm: super::vm_id(vm)?,
            project: row.try_get(1)?,
            cgpus: cgpus.into_iter().map(|(_, cgpu)| cgpu).collect(),
            vm_resources: super::hosts::resources(row, "local_cpu_milli", "local_memory_mib")?,
        });
    }
    Ok(held)
}

/// One cGPU of [`held_cgpus`]'s list, "index seq memory mode gpu", with its seq.
fn held_cgpu(listed: &str) -> Option<(i64, HeldCgpu)> {
    let mut fields = listed.split(' ');
    let index = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let memory_mib = fields.next()?.parse().ok()?;
    let mode = parse_mode(fields.next()?)?;
    let gpu = fields.next()?.to_owned();
    let compute_percent = compute_percent(Some(fields.next()?.parse().ok()?)).ok()?;
    let cgpu = HeldCgpu { index, gpu, memory_mib, mode, compute_percent };
    fields.next().is_none().then_some((seq, cgpu))
}

/// Releases every cGPU of the VMs, whose `cgpus_version` the same transaction moved with their
/// ending write ([`update_vms_releasing_cgpus`](super::update_vms_releasing_cgpus)).
///
/// On PostgreSQL each VM's cGPUs are looked up by the key. With `vm IN (VALUES ...)` and no
/// statistics yet (a new or restored database) the planner took each VM for 0.5% of the table and
/// joined the list to a scan of all of `cgpus`, which is mostly dead rows between vacuums (every
/// row is deleted within its VM's life): 1-5 ms a release in the cycles bench, inside the pool's
/// transaction that every booking waits for. A lateral subquery (`OFFSET 0` keeps it apart) is
/// planned per VM, by the key; the target rows are then matched by key too, except where the
/// planner still judges a scan cheaper (in the cycles bench, about one release in six).
pub async fn delete_cgpus(conn: &mut AnyConnection, vms: &[VmId]) -> Result<(), Error> {
    let ids: Vec<String> = vms.iter().map(|id| id.to_string()).collect();
    let postgres = conn.backend_name() == "PostgreSQL";
    fetch_batched(conn, keys(ids.iter().map(String::as_str)), 4 * MAX_ROWS, |values| {
        if postgres {
            format!(
                "DELETE FROM cgpus c USING (VALUES {values}) AS k (vm) \
                 CROSS JOIN LATERAL (SELECT idx FROM cgpus WHERE vm = k.vm OFFSET 0) AS x \
                 WHERE c.vm = k.vm AND c.idx = x.idx"
            )
        } else {
            format!("DELETE FROM cgpus WHERE vm IN (VALUES {values})")
        }
    })
    .await?;
    Ok(())
}

impl super::Db {
    /// A detach request: `write` (the VM's step `detach_cgpus`, claimed) and its cGPU `index`
    /// from `from` to `detaching`, together. `None`: the VM changed since it was read, and
    /// nothing was written; else whether the claim was taken.
    pub async fn begin_detach(
        &self,
        write: &mut [super::VmWrite; 1],
        index: u32,
        from: CgpuState,
    ) -> Result<Option<bool>, Error> {
        let vm = write[0].vm.id;
        let mut tx = self.begin_write().await?;
        let Some(&super::Written::Done { claimed }) =
            super::update_vms(&mut tx, write).await?.first()
        else {
            return Ok(None);
        };
        let moved = set_cgpu_states(&mut tx, vm, Some(index), from, CgpuState::Detaching).await?;
        if moved != 1 {
            return Err(Error::internal(format!(
                "VM {vm}: cGPU {index} was not {} when its VM's version said so",
                from.as_str()
            )));
        }
        tx.commit().await?;
        Ok(Some(claimed))
    }

    /// An attach step's end: `write` (the VM's next step) and its `attaching` cGPUs to `to`
    /// (live, or detaching when the push failed), together. False: the VM changed since it was
    /// read, and nothing was written.
    pub async fn end_attach(
        &self,
        write: &mut [super::VmWrite; 1],
        to: CgpuState,
    ) -> Result<bool, Error> {
        let vm = write[0].vm.id;
        let mut tx = self.begin_write().await?;
        if super::update_vms(&mut tx, write).await?.first() == Some(&super::Written::Stale) {
            return Ok(false);
        }
        set_cgpu_states(&mut tx, vm, None, CgpuState::Attaching, to).await?;
        tx.commit().await?;
        Ok(true)
    }
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
    let moved = query.execute(&mut *conn).await?.rows_affected();
    if moved > 0 {
        bump_cgpus_versions(conn, [vm]).await?;
    }
    Ok(moved)
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
        .fetch_all(&mut *conn)
        .await?;
    if !rows.is_empty() {
        bump_cgpus_versions(conn, [vm]).await?;
    }
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
        Ok((super::vm_id(&vm)?, row.try_get(1)?))
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
    /// The layer the VM's cGPUs speak.
    pub remoting: gpgpums::Remoting,
    pub cgpu: Option<CgpuEndpoints>,
}

/// Where a VM reaches one cGPU and where that really is; or that it is lost (booked, with no
/// route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgpuEndpoints {
    /// The cGPU's index in its VM.
    pub index: u32,
    pub masked: SocketAddrV4,
    pub target: SocketAddrV4,
    pub gpu_number: u32,
    pub lost: bool,
}

/// A cGPU's target port: its GPU's server's, or on a managed GPU its own server's as recorded
/// (0: none accepts yet, so it is not routed; see [`super::servers`]).
const TARGET_PORT: &str = "(CASE WHEN g.managed = 1 THEN COALESCE((SELECT s.port FROM \
     cgpu_servers s WHERE s.vm = c.vm AND s.idx = c.idx AND s.gpu = c.gpu), 0) \
     ELSE g.rcuda_port END)";

/// The routes each host must serve: the cGPUs of every VM on it whose routes are on, and one row
/// with no cGPU for each such VM that has none left, in one query per [`MAX_ROWS`] hosts (a row
/// per VM, its cGPUs listed; see [`string_agg`]).
pub async fn routed_cgpus_on(
    conn: &mut AnyConnection,
    hosts: &[HostId],
) -> Result<BTreeMap<HostId, Vec<RoutedCgpu>>, Error> {
    let mut out: BTreeMap<HostId, Vec<RoutedCgpu>> =
        hosts.iter().map(|h| (h.clone(), Vec::new())).collect();
    let aggregate = string_agg(conn);
    let rows = fetch_batched(conn, keys(hosts.iter().map(HostId::as_str)), MAX_ROWS, |values| {
        format!(
            "SELECT v.host, v.id, v.fixed_ip, v.tap, v.remoting, {aggregate}(c.seq || ' ' || c.idx \
             || ' ' || c.masked_address || ' ' || c.masked_port || ' ' || g.rcuda_address || ' ' \
             || {TARGET_PORT} || ' ' || g.rcuda_gpu_number || ' ' || c.state, ',') FROM vms v \
             LEFT JOIN cgpus c ON c.vm = v.id AND c.state <> 'detaching' \
             LEFT JOIN gpus g ON g.id = c.gpu \
             WHERE v.host IN (VALUES {values}) AND v.routes_on = 1 \
             GROUP BY v.host, v.id, v.fixed_ip, v.tap, v.remoting ORDER BY v.host, v.id"
        )
    })
    .await?;
    let mut host = None::<HostId>;
    for row in rows {
        let name: &str = row.try_get(0)?;
        if host.as_ref().is_none_or(|h| h.as_str() != name) {
            host = Some(HostId::new(name).map_err(|_| corrupt("host name", name))?);
        }
        let host = host.clone().expect("set above");
        let vm: &str = row.try_get(1)?;
        let vm: VmId = super::vm_id(vm)?;
        let fixed_ip = match row.try_get::<Option<&str>, _>(2)? {
            Some(ip) => Some(ip.parse().map_err(|_| corrupt("fixed IP", ip))?),
            None => None,
        };
        let tap: Option<String> = row.try_get(3)?;
        let remoting: &str = row.try_get(4)?;
        let remoting = remoting.parse().map_err(|_| corrupt("remote-GPU layer", remoting))?;
        let routed = |cgpu| RoutedCgpu { vm, fixed_ip, tap: tap.clone(), remoting, cgpu };
        let list = out.entry(host).or_default();
        match row.try_get::<Option<&str>, _>(5)? {
            None => list.push(routed(None)),
            Some(listed) => {
                let mut cgpus = listed
                    .split(',')
                    .map(|cgpu| routed_cgpu(cgpu).ok_or_else(|| corrupt("routed cGPU", cgpu)))
                    .collect::<Result<Vec<_>, _>>()?;
                cgpus.sort_by_key(|(order, _)| *order);
                list.extend(cgpus.into_iter().map(|(_, cgpu)| routed(Some(cgpu))));
            }
        }
    }
    Ok(out)
}

/// [`routed_cgpus_on`] every host at once, for a pass that pushes most tables (a start): the GPUs'
/// endpoints, the routed VMs and their cGPUs are each listed in table order (see [`listed`]) and
/// joined here, where the join per host looks up every cGPU and its GPU by key (at a million cGPUs
/// 0.6 s of statements against 3.5 s). Hosts with nothing to route are left out; a VM's fixed IP
/// or tap that is NULL or empty is read as none. A change committed during the read may show in
/// part: the caller takes the hosts' push tickets before it (see `App::push_routes_from`).
pub async fn routed_cgpus_everywhere(
    conn: &mut AnyConnection,
) -> Result<BTreeMap<HostId, Vec<RoutedCgpu>>, Error> {
    struct Routed {
        host: HostId,
        fixed_ip: Option<Ipv4Addr>,
        tap: Option<String>,
        remoting: gpgpums::Remoting,
        cgpus: Vec<((i64, u32), CgpuEndpoints)>,
    }
    let mut endpoints: std::collections::HashMap<String, (SocketAddrV4, u32)> = Default::default();
    // A managed GPU's cGPUs each have a server of their own (their ports listed below); port 0
    // stands for it here.
    let endpoint = "id || ' ' || rcuda_address || ' ' || (CASE WHEN managed = 1 THEN 0 ELSE \
                    rcuda_port END) || ' ' || rcuda_gpu_number";
    listed(conn, "gpus", endpoint, "1 = 1", |listed| {
        let (gpu, endpoint) = listed.split_once(' ').ok_or_else(|| corrupt("GPU", listed))?;
        let mut fields = endpoint.split(' ');
        let target = rcuda_target(&mut fields).filter(|_| fields.next().is_none());
        endpoints.insert(gpu.to_owned(), target.ok_or_else(|| corrupt("GPU", listed))?);
        Ok(())
    })
    .await?;
    let mut servers: std::collections::HashMap<String, u16> = Default::default();
    if endpoints.values().any(|(target, _)| target.port() == 0) {
        let server = "vm || ' ' || idx || ' ' || gpu || ' ' || port";
        listed(conn, "cgpu_servers", server, "1 = 1", |listed| {
            let (key, port) = listed.rsplit_once(' ').ok_or_else(|| corrupt("server", listed))?;
            let port = port.parse().map_err(|_| corrupt("server", listed))?;
            servers.insert(key.to_owned(), port);
            Ok(())
        })
        .await?;
    }
    let mut vms: std::collections::HashMap<VmId, Routed> = Default::default();
    // A host's name once, shared by its VMs.
    let mut hosts: std::collections::HashMap<String, HostId> = Default::default();
    let vm = "id || ' ' || host || ' ' || remoting || ' ' || coalesce(fixed_ip, '') || ' ' \
              || coalesce(tap, '')";
    listed(conn, "vms", vm, "routes_on = 1 AND host IS NOT NULL", |listed| {
        let mut fields = listed.split(' ');
        let mut field = || fields.next().ok_or_else(|| corrupt("routed VM", listed));
        let (id, host, remoting, fixed_ip, tap) =
            (field()?, field()?, field()?, field()?, field()?);
        let remoting = remoting.parse().map_err(|_| corrupt("remote-GPU layer", remoting))?;
        let vm: VmId = super::vm_id(id)?;
        let host = match hosts.get(host) {
            Some(known) => known.clone(),
            None => {
                let name = HostId::new(host).map_err(|_| corrupt("host name", host))?;
                hosts.insert(host.to_owned(), name.clone());
                name
            }
        };
        let fixed_ip = match fixed_ip {
            "" => None,
            ip => Some(ip.parse().map_err(|_| corrupt("fixed IP", ip))?),
        };
        let tap = (!tap.is_empty()).then(|| tap.to_owned());
        vms.insert(vm, Routed { host, fixed_ip, tap, remoting, cgpus: Vec::new() });
        Ok(())
    })
    .await?;
    let cgpu = "vm || ' ' || seq || ' ' || idx || ' ' || masked_address || ' ' || masked_port \
                || ' ' || state || ' ' || gpu";
    listed(conn, "cgpus", cgpu, "state <> 'detaching'", |listed| {
        let bad = || corrupt("routed cGPU", listed);
        let (vm, rest) = listed.split_once(' ').ok_or_else(bad)?;
        let (rest, gpu) = rest.rsplit_once(' ').ok_or_else(bad)?;
        let (masked, state) = rest.rsplit_once(' ').ok_or_else(bad)?;
        let vm: VmId = super::vm_id(vm)?;
        // As the join per host: a cGPU of a VM not routed, or of a GPU gone, is not listed.
        let (Some(routed), Some(&(mut target, gpu_number))) =
            (vms.get_mut(&vm), endpoints.get(gpu))
        else {
            return Ok(());
        };
        let lost = cgpu_lost(state).ok_or_else(bad)?;
        let mut fields = masked.split(' ');
        let (order, masked) =
            masked_cgpu(&mut fields).filter(|_| fields.next().is_none()).ok_or_else(bad)?;
        let index = order.1;
        if target.port() == 0 {
            let key = format!("{vm} {index} {gpu}");
            target.set_port(servers.get(&key).copied().unwrap_or(0));
        }
        let cgpu = CgpuEndpoints { index, masked, target, gpu_number, lost };
        routed.cgpus.push((order, cgpu));
        Ok(())
    })
    .await?;
    let mut vms: Vec<(VmId, Routed)> = vms.into_iter().collect();
    vms.sort_unstable_by(|(a, x), (b, y)| (&x.host, a).cmp(&(&y.host, b)));
    let mut out: BTreeMap<HostId, Vec<RoutedCgpu>> = BTreeMap::new();
    for (vm, mut routed) in vms {
        let list = out.entry(routed.host).or_default();
        let (fixed_ip, tap, remoting) = (routed.fixed_ip, routed.tap, routed.remoting);
        let at = |cgpu| RoutedCgpu { vm, fixed_ip, tap: tap.clone(), remoting, cgpu };
        if routed.cgpus.is_empty() {
            list.push(at(None));
        }
        routed.cgpus.sort_by_key(|(order, _)| *order);
        list.extend(routed.cgpus.into_iter().map(|(_, cgpu)| at(Some(cgpu))));
    }
    Ok(out)
}

/// One cGPU of [`routed_cgpus_on`]'s list, "seq index masked-address masked-port rcuda-address
/// rcuda-port gpu-number state", with its order.
fn routed_cgpu(listed: &str) -> Option<((i64, u32), CgpuEndpoints)> {
    let mut fields = listed.split(' ');
    let (order, masked) = masked_cgpu(&mut fields)?;
    let (target, gpu_number) = rcuda_target(&mut fields)?;
    let lost = cgpu_lost(fields.next()?)?;
    let index = order.1;
    let cgpu = CgpuEndpoints { index, masked, target, gpu_number, lost };
    fields.next().is_none().then_some((order, cgpu))
}

/// Whether a routed cGPU in `state` is lost; `None`: no state of a routed cGPU.
fn cgpu_lost(state: &str) -> Option<bool> {
    match CgpuState::parse(state)? {
        CgpuState::Lost => Some(true),
        CgpuState::Live | CgpuState::Attaching => Some(false),
        CgpuState::Detaching => None,
    }
}

/// A listed cGPU's "seq index masked-address masked-port": its order and masked endpoint.
fn masked_cgpu(fields: &mut std::str::Split<'_, char>) -> Option<((i64, u32), SocketAddrV4)> {
    let order = (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
    Some((order, SocketAddrV4::new(fields.next()?.parse().ok()?, fields.next()?.parse().ok()?)))
}

/// A listed GPU's "rcuda-address rcuda-port gpu-number": where its rCUDA server listens.
fn rcuda_target(fields: &mut std::str::Split<'_, char>) -> Option<(SocketAddrV4, u32)> {
    let target = SocketAddrV4::new(fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
    Some((target, fields.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Db;

    /// SQLite's read by rowid ranges gives what the read by VM gives: every VM's cGPUs in attach
    /// order, whichever ranges they sit in, and no VM without cGPUs.
    #[tokio::test]
    async fn held_cgpus_by_rowid_ranges_match_the_read_by_vm() {
        let db = Db::connect("sqlite::memory:").await.unwrap();
        let mut conn = db.connection().await.unwrap();
        // The read is under test, not the references.
        sqlx::query("PRAGMA foreign_keys = OFF").execute(&mut *conn).await.unwrap();
        let (a, b, c) = (VmId::new_random(), VmId::new_random(), VmId::new_random());
        for (vm, project) in [(a, "pa"), (b, "pb"), (c, "pc")] {
            sqlx::query(
                "INSERT INTO vms (id, project, owner, name, request, policy, state, step, \
                 timings, created_ms, updated_ms) \
                 VALUES ($1, $2, 'o', 'n', '{}', 'first-fit', 'ready', 'done', '{}', 0, 0)",
            )
            .bind(vm.to_string())
            .bind(project)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        let at = ROWIDS_PER_READ;
        for (rowid, vm, idx, seq) in [
            (10, a, 0, 1),
            (at + 4_464, a, 1, 0),
            (at, b, 0, 0),
            (at + 1, b, 1, 0),
            (2 * at + 1, a, 2, 1),
        ] {
            sqlx::query(
                "INSERT INTO cgpus (rowid, vm, idx, gpu, memory_mib, mode, masked_address, \
                 masked_port, seq) VALUES ($1, $2, $3, $4, 1024, 'shared', '100.127.0.1', 8308, $5)",
            )
            .bind(rowid)
            .bind(vm.to_string())
            .bind(idx)
            .bind(format!("gpu-{idx}"))
            .bind(seq)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        let by_rowids = held_cgpus(&mut conn).await.unwrap();
        assert_eq!(by_rowids, held_cgpus_by_vm(&mut conn).await.unwrap());
        let mut expected = vec![(a, "pa", vec![1, 0, 2]), (b, "pb", vec![0, 1])];
        expected.sort_by_key(|(vm, ..)| *vm);
        let got: Vec<(VmId, &str, Vec<u32>)> = by_rowids
            .iter()
            .map(|h| (h.vm, h.project.as_str(), h.cgpus.iter().map(|c| c.index).collect()))
            .collect();
        assert_eq!(got, expected);
    }
}
