//! Purging deleted VMs: a deleted VM's row, and what is kept about it, stay until an operator
//! purges them (`gsaasd db purge --older-than 30d`), as Nova keeps deleted instances until
//! `nova-manage db archive_deleted_rows`. Until then its owner can still list it
//! (`GET /v1/vms?deleted=true`) and a retried launch with its Idempotency-Key still answers it.

use sqlx::Row;

use super::{fetch_batched, keys, Db, MAX_ROWS};
use crate::error::Error;

/// What a purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub vms: u64,
}

/// The tables that keep rows about a VM, purged before the VM's own row.
const KEPT_ABOUT_A_VM: [&str; 3] = ["vm_events", "attach_keys", "queue"];

/// Deletes up to `batch` VMs at a time that were deleted (their last change) before `before_ms`,
/// each with its events, attach keys and queue tickets, a transaction per batch, until none is
/// left. A VM whose bookings a fence still holds stays, and so does one whose delegation (a
/// Keystone trust that lets gsaasd act as its tenant) Keystone has not confirmed deleted yet:
/// forgetting it would leave a live trust nobody knows of. `dry_run`: counts, deletes nothing.
pub async fn purge_deleted_vms(
    db: &Db,
    before_ms: i64,
    batch: usize,
    dry_run: bool,
) -> Result<Purged, Error> {
    const PURGEABLE: &str = "FROM vms v WHERE v.state = 'deleted' AND v.updated_ms < $1 \
        AND NOT EXISTS (SELECT 1 FROM cgpus c WHERE c.vm = v.id) \
        AND NOT EXISTS (SELECT 1 FROM fences f WHERE f.vm = v.id) \
        AND NOT EXISTS (SELECT 1 FROM delegations d WHERE d.vm = v.id)";
    if dry_run {
        let row = sqlx::query(&format!("SELECT COUNT(*) {PURGEABLE}"))
            .bind(before_ms)
            .fetch_one(&mut *db.connection().await?)
            .await?;
        return Ok(Purged { vms: row.try_get::<i64, _>(0)? as u64 });
    }
    let mut purged = Purged::default();
    loop {
        let mut tx = db.begin_write().await?;
        let rows = sqlx::query(&format!("SELECT v.id {PURGEABLE} ORDER BY v.updated_ms LIMIT $2"))
            .bind(before_ms)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            return Ok(purged);
        }
        let ids: Vec<String> =
            rows.iter().map(|row| row.try_get::<String, _>(0)).collect::<Result<_, _>>()?;
        for table in KEPT_ABOUT_A_VM.iter().chain(&["vms"]) {
            let column = if *table == "vms" { "id" } else { "vm" };
            fetch_batched(&mut tx, keys(ids.iter().map(String::as_str)), MAX_ROWS, |values| {
                format!("DELETE FROM {table} WHERE {column} IN (VALUES {values})")
            })
            .await?;
        }
        tx.commit().await?;
        purged.vms += ids.len() as u64;
        tracing::info!(vms = ids.len(), "purged deleted VMs");
        if ids.len() < batch {
            return Ok(purged);
        }
    }
}
