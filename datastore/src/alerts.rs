//! Host alerts: what a host's agent did that admins should know of, though nothing it asked for
//! was done (a report that claimed another host's rCUDA endpoint, a refusal naming another host's
//! GPU, fences it never confirmed). A hostile agent can cause them at will, so each host keeps
//! only its latest few.

use std::collections::HashMap;

use gpgpums::HostId;
use sqlx::{AnyConnection, Row};

use super::corrupt;
use crate::error::Error;

/// One alert of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAlert {
    pub at_ms: i64,
    /// `endpoint_conflict`, `foreign_refusal`, `fence_expired` or `server_over_share`.
    pub kind: String,
    pub detail: String,
}

/// How many alerts each host keeps: the oldest go as new ones come.
pub const ALERTS_PER_HOST: i64 = 20;

/// Records the alert as the host's latest, and forgets the host's alerts beyond
/// [`ALERTS_PER_HOST`].
pub async fn insert_host_alert(
    conn: &mut AnyConnection,
    host: &HostId,
    alert: &HostAlert,
) -> Result<(), Error> {
    let seq: i64 = sqlx::query(
        "INSERT INTO host_alerts (host, seq, at_ms, kind, detail) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM host_alerts WHERE host = $1 \
         RETURNING seq",
    )
    .bind(host.as_str())
    .bind(alert.at_ms)
    .bind(&alert.kind)
    .bind(&alert.detail)
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    if seq > ALERTS_PER_HOST {
        sqlx::query("DELETE FROM host_alerts WHERE host = $1 AND seq <= $2")
            .bind(host.as_str())
            .bind(seq - ALERTS_PER_HOST)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Every host's alerts, newest first.
pub async fn host_alerts(
    conn: &mut AnyConnection,
) -> Result<HashMap<HostId, Vec<HostAlert>>, Error> {
    let rows =
        sqlx::query("SELECT host, at_ms, kind, detail FROM host_alerts ORDER BY host, seq DESC")
            .fetch_all(conn)
            .await?;
    let mut alerts: HashMap<HostId, Vec<HostAlert>> = HashMap::new();
    for row in &rows {
        let host: String = row.try_get(0)?;
        let host = HostId::new(&host).map_err(|_| corrupt("host name", &host))?;
        alerts.entry(host).or_default().push(HostAlert {
            at_ms: row.try_get(1)?,
            kind: row.try_get(2)?,
            detail: row.try_get(3)?,
        });
    }
    Ok(alerts)
}
