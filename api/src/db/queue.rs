//! The queue of launches waiting for capacity: one ticket per queued VM (see `app::queue`).

use gpgpums::{TicketId, VmId};
use sqlx::{AnyConnection, Row};

use super::corrupt;
use super::vms::{vm_from_row, VM_COLUMNS, VM_COLUMN_COUNT};
use crate::error::Error;
use crate::model::VmRecord;

/// A queued launch: its ticket and the VM (in state `queued`).
#[derive(Debug, Clone)]
pub struct QueuedVm {
    pub ticket: TicketId,
    pub vm: VmRecord,
    /// How often launches started ahead of it while it was the head.
    pub passed: u32,
    pub enqueued_ms: i64,
    pub deadline_ms: Option<i64>,
}

/// Gives `vm` the next ticket. Runs in the pool transaction, which serializes ticket numbers.
pub async fn enqueue(
    conn: &mut AnyConnection,
    vm: &VmRecord,
    now_ms: i64,
    deadline_ms: Option<i64>,
) -> Result<TicketId, Error> {
    let row =
        sqlx::query("SELECT COALESCE(MAX(ticket), 0) + 1 FROM queue").fetch_one(&mut *conn).await?;
    let ticket: i64 = row.try_get(0)?;
    sqlx::query(
        "INSERT INTO queue (ticket, vm, project, priority, passed, enqueued_ms, deadline_ms) \
         VALUES ($1, $2, $3, $4, 0, $5, $6)",
    )
    .bind(ticket)
    .bind(vm.id.to_string())
    .bind(&vm.project)
    .bind(i64::from(vm.spec.priority))
    .bind(now_ms)
    .bind(deadline_ms)
    .execute(conn)
    .await?;
    Ok(TicketId(ticket as u64))
}

/// Every queued launch with its VM, in ticket order.
pub async fn queued_vms(conn: &mut AnyConnection) -> Result<Vec<QueuedVm>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT {VM_COLUMNS}, q.ticket, q.passed, q.enqueued_ms, q.deadline_ms \
         FROM queue q JOIN vms v ON v.id = q.vm ORDER BY q.ticket"
    ))
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let at = VM_COLUMN_COUNT;
            let ticket: i64 = row.try_get(at)?;
            let passed: i64 = row.try_get(at + 1)?;
            Ok(QueuedVm {
                vm: vm_from_row(row)?,
                ticket: TicketId(
                    u64::try_from(ticket).map_err(|_| corrupt("ticket", &ticket.to_string()))?,
                ),
                passed: u32::try_from(passed).unwrap_or(u32::MAX),
                enqueued_ms: row.try_get(at + 2)?,
                deadline_ms: row.try_get(at + 3)?,
            })
        })
        .collect()
}

/// Takes the VMs' tickets out of the queue.
pub async fn dequeue(conn: &mut AnyConnection, vms: &[VmId]) -> Result<(), Error> {
    for vm in vms {
        sqlx::query("DELETE FROM queue WHERE vm = $1")
            .bind(vm.to_string())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Records how often the ticket's launch has been passed.
pub async fn set_passed(
    conn: &mut AnyConnection,
    ticket: TicketId,
    passed: u32,
) -> Result<(), Error> {
    sqlx::query("UPDATE queue SET passed = $1 WHERE ticket = $2")
        .bind(i64::from(passed))
        .bind(ticket.0 as i64)
        .execute(conn)
        .await?;
    Ok(())
}

/// The VM's place in the queue (1: next), counting the tickets of higher priority or of equal
/// priority and earlier; `None` when it is not queued.
pub async fn queue_position(conn: &mut AnyConnection, vm: VmId) -> Result<Option<u64>, Error> {
    let row = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM queue o WHERE o.priority > q.priority \
             OR (o.priority = q.priority AND o.ticket < q.ticket)) + 1 \
         FROM queue q WHERE q.vm = $1",
    )
    .bind(vm.to_string())
    .fetch_optional(conn)
    .await?;
    row.map(|row| Ok(row.try_get::<i64, _>(0)? as u64)).transpose()
}

/// How many launches wait at each priority.
pub async fn queue_lengths(conn: &mut AnyConnection) -> Result<Vec<(i64, i64)>, Error> {
    let rows =
        sqlx::query("SELECT priority, COUNT(*) FROM queue GROUP BY priority ORDER BY priority")
            .fetch_all(conn)
            .await?;
    rows.iter().map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).collect()
}

/// Ready VMs, with no change under way, whose cGPUs may be taken back, with their priority.
pub async fn preemptible_vms(
    conn: &mut AnyConnection,
) -> Result<std::collections::BTreeMap<VmId, i32>, Error> {
    let rows = sqlx::query(
        "SELECT id, priority FROM vms WHERE preemptible = 1 AND state = 'ready' AND step = 'done'",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            let priority: i64 = row.try_get(1)?;
            let id: VmId = id.parse().map_err(|_| corrupt("VM id", &id))?;
            Ok((
                id,
                i32::try_from(priority).map_err(|_| corrupt("priority", &priority.to_string()))?,
            ))
        })
        .collect()
}

/// cGPUs whose routes are being withdrawn: still booked, free once released.
pub async fn detaching_cgpus(conn: &mut AnyConnection) -> Result<Vec<(VmId, u32)>, Error> {
    let rows = sqlx::query("SELECT vm, idx FROM cgpus WHERE state = 'detaching' ORDER BY vm, idx")
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            let vm: String = row.try_get(0)?;
            let index: i64 = row.try_get(1)?;
            Ok((
                vm.parse().map_err(|_| corrupt("VM id", &vm))?,
                u32::try_from(index).map_err(|_| corrupt("cGPU index", &index.to_string()))?,
            ))
        })
        .collect()
}
