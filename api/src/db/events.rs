//! VM events: what happened to a VM that its owner should know of, such as cGPUs taken back.

use std::collections::HashMap;

use gpgpums::VmId;
use sqlx::{AnyConnection, Row};

use crate::error::Error;

/// One event of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEvent {
    pub at_ms: i64,
    /// `preempted`, `given_back`, `attached`, `queue_timeout` or `attach_refused`.
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

/// The events of `project`'s VMs (every project's for `None`) that are not deleted, oldest first,
/// the last `per_vm` of each, in one query.
pub async fn events_of_project(
    conn: &mut AnyConnection,
    project: Option<&str>,
    per_vm: usize,
) -> Result<HashMap<VmId, Vec<VmEvent>>, Error> {
    let filter = if project.is_some() { "AND v.project = $1" } else { "" };
    let sql = format!(
        "SELECT e.vm, e.at_ms, e.kind, e.detail FROM vm_events e JOIN vms v ON v.id = e.vm \
         WHERE v.state <> 'deleted' {filter} ORDER BY e.vm, e.at_ms"
    );
    let mut query = sqlx::query(&sql);
    if let Some(project) = project {
        query = query.bind(project);
    }
    let mut events: HashMap<VmId, Vec<VmEvent>> = HashMap::new();
    for row in query.fetch_all(conn).await? {
        let vm: String = row.try_get(0)?;
        let vm: VmId = vm.parse().map_err(|_| super::corrupt("VM id", &vm))?;
        let event =
            VmEvent { at_ms: row.try_get(1)?, kind: row.try_get(2)?, detail: row.try_get(3)? };
        events.entry(vm).or_default().push(event);
    }
    for list in events.values_mut() {
        let extra = list.len().saturating_sub(per_vm);
        list.drain(..extra);
    }
    Ok(events)
}
