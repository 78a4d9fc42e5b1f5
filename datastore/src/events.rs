//! VM events: what happened to a VM that its owner should know of, such as cGPUs taken back.

use gpgpums::VmId;
use sqlx::{AnyConnection, Row};

use super::Db;
use crate::error::Error;

/// One event of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEvent {
    pub at_ms: i64,
    /// `preempted`, `given_back`, `attached`, `queue_timeout` or `attach_refused`.
    pub kind: String,
    pub detail: String,
}

/// How many events each VM keeps: the oldest go as new ones come.
pub const EVENTS_PER_VM: i64 = 100;

impl Db {
    /// Records `event` for each of `vms`, all or none.
    pub async fn record_events(
        &self,
        vms: impl IntoIterator<Item = VmId>,
        event: &VmEvent,
    ) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        for vm in vms {
            insert_event(&mut tx, vm, event).await?;
        }
        tx.commit().await
    }
}

/// Records the event as the VM's latest, and forgets the VM's events beyond [`EVENTS_PER_VM`].
pub async fn insert_event(
    conn: &mut AnyConnection,
    vm: VmId,
    event: &VmEvent,
) -> Result<(), Error> {
    let key = vm.to_string();
    let seq: i64 = sqlx::query(
        "INSERT INTO vm_events (vm, seq, at_ms, kind, detail) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM vm_events WHERE vm = $1 \
         RETURNING seq",
    )
    .bind(&key)
    .bind(event.at_ms)
    .bind(&event.kind)
    .bind(&event.detail)
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    super::extras_added(&mut *conn, vm).await?;
    if seq > EVENTS_PER_VM {
        sqlx::query("DELETE FROM vm_events WHERE vm = $1 AND seq <= $2")
            .bind(&key)
            .bind(seq - EVENTS_PER_VM)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// An event from its columns `at_ms, kind, detail`, starting at column `first`.
pub(super) fn event(row: &sqlx::any::AnyRow, first: usize) -> Result<VmEvent, Error> {
    Ok(VmEvent {
        at_ms: row.try_get(first)?,
        kind: row.try_get(first + 1)?,
        detail: row.try_get(first + 2)?,
    })
}

/// The VM's events, oldest first.
#[cfg(feature = "testing")]
pub async fn events_of(conn: &mut AnyConnection, vm: VmId) -> Result<Vec<VmEvent>, Error> {
    let rows = sqlx::query(
        "SELECT at_ms, kind, detail FROM vm_events WHERE vm = $1 ORDER BY seq DESC LIMIT $2",
    )
    .bind(vm.to_string())
    .bind(EVENTS_PER_VM)
    .fetch_all(conn)
    .await?;
    let mut events = rows.iter().map(|row| event(row, 0)).collect::<Result<Vec<_>, Error>>()?;
    events.reverse();
    Ok(events)
}
