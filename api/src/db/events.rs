//! VM events: what happened to a VM that its owner should know of, such as cGPUs taken back.

use gpgpums::VmId;
use sqlx::{AnyConnection, Row};

use crate::error::Error;

/// One event of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEvent {
    pub at_ms: i64,
    /// `preempted`.
    pub kind: String,
    pub detail: String,
}

pub async fn insert_event(
    conn: &mut AnyConnection,
    vm: VmId,
    event: &VmEvent,
) -> Result<(), Error> {
    sqlx::query("INSERT INTO vm_events (vm, at_ms, kind, detail) VALUES ($1, $2, $3, $4)")
        .bind(vm.to_string())
        .bind(event.at_ms)
        .bind(&event.kind)
        .bind(&event.detail)
        .execute(conn)
        .await?;
    Ok(())
}

/// The VM's events, oldest first (the last 100).
pub async fn events_of(conn: &mut AnyConnection, vm: VmId) -> Result<Vec<VmEvent>, Error> {
    let rows = sqlx::query(
        "SELECT at_ms, kind, detail FROM vm_events WHERE vm = $1 ORDER BY at_ms DESC LIMIT 100",
    )
    .bind(vm.to_string())
    .fetch_all(conn)
    .await?;
    let mut events = rows
        .iter()
        .map(|row| {
            Ok(VmEvent { at_ms: row.try_get(0)?, kind: row.try_get(1)?, detail: row.try_get(2)? })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    events.reverse();
    Ok(events)
}
