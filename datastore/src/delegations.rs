//! The delegations of queued launches (see gsaas-clouds' `openstack::trusts`): which trust lets the
//! service create a VM's server as its tenant.

use gpgpums::VmId;
use sqlx::{AnyConnection, Row};

use crate::error::Error;

pub async fn insert_delegation(
    conn: &mut AnyConnection,
    vm: VmId,
    trust: &str,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query("INSERT INTO delegations (vm, trust, created_ms) VALUES ($1, $2, $3)")
        .bind(vm.to_string())
        .bind(trust)
        .bind(now_ms)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn delegation_of(conn: &mut AnyConnection, vm: VmId) -> Result<Option<String>, Error> {
    let row = sqlx::query("SELECT trust FROM delegations WHERE vm = $1")
        .bind(vm.to_string())
        .fetch_optional(conn)
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

pub async fn delete_delegation(conn: &mut AnyConnection, vm: VmId) -> Result<(), Error> {
    sqlx::query("DELETE FROM delegations WHERE vm = $1").bind(vm.to_string()).execute(conn).await?;
    Ok(())
}

/// The VMs whose delegation has done its work or can no longer do it, and must be ended (each
/// trust deleted in Keystone, then its row): VMs gone, ended (`deleted`, `error`) or running
/// (`ready`). A queued launch's, and a starting one's (whose saga may still act as its tenant
/// with it), are kept. At most `limit`, oldest first.
pub async fn delegations_to_end(conn: &mut AnyConnection, limit: i64) -> Result<Vec<VmId>, Error> {
    let rows = sqlx::query(
        "SELECT d.vm FROM delegations d LEFT JOIN vms v ON v.id = d.vm \
         WHERE v.id IS NULL OR v.state IN ('deleted', 'error', 'ready') \
         ORDER BY d.created_ms LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?;
    super::vm_ids(&rows)
}
