//! Projects' own quota limits (see [`gpgpums::quota`]), and what the ledger is loaded from.

use std::collections::{BTreeMap, HashMap};

use gpgpums::{ModelLimits, ProjectId, Quota};
use sqlx::{AnyConnection, Row};

use super::{corrupt, fetch_batched, keys, MAX_ROWS};
use crate::error::Error;

/// Every project's own limits.
pub async fn quotas(conn: &mut AnyConnection) -> Result<Vec<(ProjectId, Quota)>, Error> {
    let rows = sqlx::query(
        "SELECT project, cgpus, memory_mib, exclusive_gpus, vms, max_priority, models \
         FROM quotas ORDER BY project",
    )
    .fetch_all(conn)
    .await?;
    let limit = |row: &sqlx::any::AnyRow, i: usize| -> Result<Option<u64>, Error> {
        match row.try_get::<Option<i64>, _>(i)? {
            None => Ok(None),
            Some(n) => {
                u64::try_from(n).map(Some).map_err(|_| corrupt("quota limit", &n.to_string()))
            }
        }
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let project: String = row.try_get(0)?;
        let project = ProjectId::new(&project).map_err(|_| corrupt("project", &project))?;
        let quota = Quota {
            cgpus: limit(row, 1)?,
            memory_mib: limit(row, 2)?,
            exclusive_gpus: limit(row, 3)?,
            vms: limit(row, 4)?,
            max_priority: match limit(row, 5)? {
                None => None,
                Some(n) => {
                    Some(u32::try_from(n).map_err(|_| corrupt("max_priority", &n.to_string()))?)
                }
            },
            models: match row.try_get::<Option<String>, _>(6)? {
                None => BTreeMap::new(),
                Some(json) => serde_json::from_str(&json).map_err(|_| corrupt("models", &json))?,
            },
        };
        out.push((project, quota));
    }
    Ok(out)
}

/// Limits per model as stored: JSON by model, or NULL for none.
fn models_json(models: &BTreeMap<String, ModelLimits>) -> Option<String> {
    (!models.is_empty()).then(|| serde_json::to_string(models).expect("limits serialize"))
}

/// Sets the project's own limits (`Some`), or removes them (`None`: back to the defaults).
pub async fn set_quota(
    conn: &mut AnyConnection,
    project: &ProjectId,
    quota: Option<&Quota>,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query("DELETE FROM quotas WHERE project = $1")
        .bind(project.as_str())
        .execute(&mut *conn)
        .await?;
    if let Some(quota) = quota {
        // Limits are range-checked to fit (at most i64::MAX) before they get here.
        let limit = |n: Option<u64>| n.map(|n| n as i64);
        sqlx::query(
            "INSERT INTO quotas \
             (project, cgpus, memory_mib, exclusive_gpus, vms, updated_ms, max_priority, models) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(project.as_str())
        .bind(limit(quota.cgpus))
        .bind(limit(quota.memory_mib))
        .bind(limit(quota.exclusive_gpus))
        .bind(limit(quota.vms))
        .bind(now_ms)
        .bind(quota.max_priority.map(i64::from))
        .bind(models_json(&quota.models))
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// The VMs each of `projects` (`None`: every project) has that count against its quota: those
/// being created or ready (a failed or terminated VM no longer counts).
pub async fn counted_vms(
    conn: &mut AnyConnection,
    projects: Option<&[&ProjectId]>,
) -> Result<HashMap<ProjectId, u64>, Error> {
    const COUNTED: &str = "state IN ('creating', 'ready')";
    let rows = match projects {
        Some(projects) => {
            fetch_batched(conn, keys(projects.iter().map(|p| p.as_str())), MAX_ROWS, |values| {
                format!(
                    "SELECT project, COUNT(*) FROM vms WHERE project IN (VALUES {values}) \
                     AND {COUNTED} GROUP BY project"
                )
            })
            .await?
        }
        None => {
            sqlx::query(&format!(
                "SELECT project, COUNT(*) FROM vms WHERE {COUNTED} GROUP BY project"
            ))
            .fetch_all(conn)
            .await?
        }
    };
    let mut counts = HashMap::new();
    for row in rows {
        let project: String = row.try_get(0)?;
        let project = ProjectId::new(&project).map_err(|_| corrupt("project", &project))?;
        let count: i64 = row.try_get(1)?;
        counts.insert(project, u64::try_from(count).unwrap_or(0));
    }
    Ok(counts)
}
