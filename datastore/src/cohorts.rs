//! Cohorts (see `gpgpums::quota::cohort`): which projects lend each other their unused quota, on
//! what terms, as the ledger is loaded from and as operators set them.

use std::collections::BTreeMap;

use gpgpums::{CohortName, CohortTerms, ProjectId, VmId};
use sqlx::{AnyConnection, Row};

use super::corrupt;
use crate::error::Error;

/// A cohort's members and their terms.
pub type Members = BTreeMap<ProjectId, CohortTerms>;

/// Every cohort with its members, by name (a cohort is never stored without members).
pub async fn cohorts(conn: &mut AnyConnection) -> Result<Vec<(CohortName, Members)>, Error> {
    let rows = sqlx::query(
        "SELECT m.cohort, m.project, m.terms FROM cohort_members m \
         JOIN cohorts c ON c.name = m.cohort ORDER BY m.cohort, m.project",
    )
    .fetch_all(conn)
    .await?;
    let mut out: Vec<(CohortName, Members)> = Vec::new();
    for row in &rows {
        let (cohort, project, terms): (String, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let cohort = CohortName::new(&cohort).map_err(|_| corrupt("cohort", &cohort))?;
        let project = ProjectId::new(&project).map_err(|_| corrupt("project", &project))?;
        let terms: CohortTerms =
            serde_json::from_str(&terms).map_err(|_| corrupt("cohort terms", &terms))?;
        match out.last_mut() {
            Some((name, members)) if *name == cohort => {
                members.insert(project, terms);
            }
            _ => out.push((cohort, BTreeMap::from([(project, terms)]))),
        }
    }
    Ok(out)
}

/// Makes cohort `name` hold exactly `members` (`None` or empty: no such cohort). The caller has
/// checked that no member is in another cohort.
pub async fn set_cohort(
    conn: &mut AnyConnection,
    name: &CohortName,
    members: Option<&Members>,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query("DELETE FROM cohort_members WHERE cohort = $1")
        .bind(name.as_str())
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM cohorts WHERE name = $1")
        .bind(name.as_str())
        .execute(&mut *conn)
        .await?;
    let Some(members) = members.filter(|m| !m.is_empty()) else { return Ok(()) };
    sqlx::query("INSERT INTO cohorts (name, updated_ms) VALUES ($1, $2)")
        .bind(name.as_str())
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
    for (project, terms) in members {
        let terms = serde_json::to_string(terms).expect("terms serialize");
        sqlx::query("INSERT INTO cohort_members (project, cohort, terms) VALUES ($1, $2, $3)")
            .bind(project.as_str())
            .bind(name.as_str())
            .bind(terms)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The cGPUs on loan that are not being taken back already: what a queue round may reclaim.
pub async fn loans(conn: &mut AnyConnection) -> Result<Vec<gpgpums::Loan>, Error> {
    let rows = sqlx::query(
        "SELECT vm, idx, borrowed_ms FROM cgpus \
         WHERE borrowed_ms IS NOT NULL AND state <> 'detaching' ORDER BY vm, idx",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let (vm, index, since_ms): (String, i64, i64) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let index =
                u32::try_from(index).map_err(|_| corrupt("cGPU index", &index.to_string()))?;
            Ok(gpgpums::Loan { vm: super::vm_id(&vm)?, index, since_ms })
        })
        .collect()
}

impl super::Db {
    /// Takes the loan mark off `loans` (cGPUs whose project is back within its quota: its own
    /// now), with the versions of their VMs' cGPUs, in one transaction; how many it took off (a
    /// cGPU gone meanwhile is not counted).
    pub async fn settle_loans(&self, loans: &[(VmId, u32)]) -> Result<u64, Error> {
        if loans.is_empty() {
            return Ok(0);
        }
        let mut tx = self.begin_write().await?;
        let mut settled = 0;
        for (vm, index) in loans {
            settled += sqlx::query(
                "UPDATE cgpus SET borrowed_ms = NULL \
                 WHERE vm = $1 AND idx = $2 AND borrowed_ms IS NOT NULL",
            )
            .bind(vm.to_string())
            .bind(i64::from(*index))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        super::cgpus::bump_cgpus_versions(&mut tx, loans.iter().map(|(vm, _)| *vm)).await?;
        tx.commit().await?;
        Ok(settled)
    }
}
