//! Usage: the billable lifetimes of VMs and cGPUs (`migrations/0027_usage.*.sql`; written by
//! folding the log of 0029's triggers, [`super::usage_fold`]), read back for any period.
//!
//! A span that crosses a period's edge counts only its part inside the period, to the millisecond:
//! each span is clipped to `[start, end)` in SQL and the clipped parts added up, so a month's
//! report of a million spans is one scan the database does, not a million rows decoded here. A
//! span still counting ends, for a report, at the `now` its reader passes. Spans are never
//! deleted: a purged VM leaves them. Each ended span is added to the totals of `/metrics` once:
//! by the fold that writes it, if it ended within that fold, otherwise by the reconciler's
//! roll-up.
//!
//! A span of a cGPU on loan from its project's cohort is marked `borrowed` (0036: a change of the
//! mark splits the span), and a report adds the borrowed spans' time apart, in the same statement
//! (one snapshot: never more borrowed than in all), through an index of their own: the covering
//! index every report reads stays as it was, and few spans are borrowed.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::Db;
use crate::error::Error;

/// A report's period, in milliseconds since the Unix epoch, `start < end`; spans still counting
/// end at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub start_ms: i64,
    pub end_ms: i64,
    pub now_ms: i64,
}

/// Time on GPUs of one model in one mode, in milliseconds (memory: MiB-milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct CgpuTime {
    pub model: String,
    pub mode: String,
    pub cgpu_ms: i64,
    pub memory_mib_ms: f64,
    /// The part of `cgpu_ms` on loan from the project's cohort (0 in `/metrics`' totals).
    pub borrowed_ms: i64,
    /// The part of `memory_mib_ms` on loan.
    pub borrowed_memory_mib_ms: f64,
}

/// What a project, or one of its VMs, used in a period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageLine {
    pub vm_ms: i64,
    /// By model, then mode.
    pub cgpus: Vec<CgpuTime>,
}

/// A VM's usage in a period, with what is known of it beyond its purge.
#[derive(Debug, Clone, PartialEq)]
pub struct VmUsageLine {
    pub vm: String,
    pub name: String,
    /// When it first counted and last stopped counting (`None`: it still counts); `None` both
    /// when only its cGPUs counted in the period (its own span ended before).
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub usage: UsageLine,
}

/// A span's part inside `[$1, $2)`, a span still counting ending at `$3`: an expression over
/// `start_ms` and `end_ms`, the same on both stores.
const CLIPPED: &str = "(CASE WHEN COALESCE(end_ms, $3) < $2 THEN COALESCE(end_ms, $3) ELSE $2 END \
     - CASE WHEN start_ms > $1 THEN start_ms ELSE $1 END)";

/// Spans that overlap the period (`$1`, `$2`; a span still counting may).
const OVERLAPS: &str = "start_ms < $2 AND (end_ms > $1 OR end_ms IS NULL)";

fn period_query<'q>(
    sql: &'q str,
    period: Period,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    sqlx::query(sql).bind(period.start_ms).bind(period.end_ms).bind(period.now_ms)
}

/// cGPU time by project (or by VM), model and mode: the clipped parts summed (`d`, positive
/// only: a span that started after `now` by the database's clock adds nothing), then the borrowed
/// spans' alone (NULL: none), in one statement. Every borrowed span is in the first sum too, so
/// its group is there to join. `borrowed = 1` is the partial index's own condition
/// (`cgpu_usage_borrowed`), which both stores then read instead of the table.
fn cgpu_time_sql(key: &str, filter: &str) -> String {
    let sums = |only: &str| {
        format!(
            "SELECT {key}, model, mode, CAST(SUM(d) AS BIGINT) AS ms, \
             SUM(CAST(d AS DOUBLE PRECISION) * memory_mib) AS mib_ms \
             FROM (SELECT {key}, model, mode, memory_mib, {CLIPPED} AS d FROM cgpu_usage \
                   WHERE {OVERLAPS}{filter}{only}) s \
             WHERE d > 0 GROUP BY {key}, model, mode"
        )
    };
    format!(
        "SELECT a.{key}, a.model, a.mode, a.ms, a.mib_ms, b.ms, b.mib_ms \
         FROM ({}) a LEFT JOIN ({}) b \
           ON b.{key} = a.{key} AND b.model = a.model AND b.mode = a.mode \
         ORDER BY a.{key}, a.model, a.mode",
        sums(""),
        sums(" AND borrowed = 1")
    )
}

/// A row of [`cgpu_time_sql`].
fn cgpu_time(row: &AnyRow) -> Result<CgpuTime, Error> {
    Ok(CgpuTime {
        model: row.try_get(1)?,
        mode: row.try_get(2)?,
        cgpu_ms: row.try_get(3)?,
        memory_mib_ms: row.try_get(4)?,
        borrowed_ms: row.try_get::<Option<i64>, _>(5)?.unwrap_or(0),
        borrowed_memory_mib_ms: row.try_get::<Option<f64>, _>(6)?.unwrap_or(0.0),
    })
}

/// Every project's usage in the period (or only `project`'s), by project.
pub async fn usage_by_project(
    conn: &mut AnyConnection,
    period: Period,
    project: Option<&str>,
) -> Result<BTreeMap<String, UsageLine>, Error> {
    let filter = if project.is_some() { " AND project = $4" } else { "" };
    let mut lines: BTreeMap<String, UsageLine> = BTreeMap::new();
    let sql = cgpu_time_sql("project", filter);
    let mut query = period_query(&sql, period);
    if let Some(project) = project {
        query = query.bind(project);
    }
    for row in query.fetch_all(&mut *conn).await? {
        lines.entry(row.try_get(0)?).or_default().cgpus.push(cgpu_time(&row)?);
    }
    let sql = format!(
        "SELECT project, CAST(SUM(d) AS BIGINT) FROM (SELECT project, {CLIPPED} AS d \
         FROM vm_usage WHERE {OVERLAPS}{filter}) s WHERE d > 0 GROUP BY project"
    );
    let mut query = period_query(&sql, period);
    if let Some(project) = project {
        query = query.bind(project);
    }
    for row in query.fetch_all(&mut *conn).await? {
        lines.entry(row.try_get(0)?).or_default().vm_ms = row.try_get(1)?;
    }
    Ok(lines)
}

/// One project's usage in the period, by VM (in VM id order).
pub async fn usage_by_vm(
    conn: &mut AnyConnection,
    period: Period,
    project: &str,
) -> Result<Vec<VmUsageLine>, Error> {
    let mut vms: BTreeMap<String, VmUsageLine> = BTreeMap::new();
    let sql = format!(
        "SELECT vm, MIN(name), CAST(SUM(d) AS BIGINT), MIN(start_ms), \
         MAX(CASE WHEN end_ms IS NULL THEN 1 ELSE 0 END), MAX(end_ms) \
         FROM (SELECT vm, name, start_ms, end_ms, {CLIPPED} AS d FROM vm_usage \
               WHERE {OVERLAPS} AND project = $4) s WHERE d > 0 GROUP BY vm"
    );
    for row in period_query(&sql, period).bind(project).fetch_all(&mut *conn).await? {
        let vm: String = row.try_get(0)?;
        let counting: i64 = row.try_get(4)?;
        vms.insert(
            vm.clone(),
            VmUsageLine {
                vm,
                name: row.try_get(1)?,
                started_ms: Some(row.try_get(3)?),
                ended_ms: if counting == 1 { None } else { row.try_get(5)? },
                usage: UsageLine { vm_ms: row.try_get(2)?, cgpus: Vec::new() },
            },
        );
    }
    let sql = cgpu_time_sql("vm", " AND project = $4");
    for row in period_query(&sql, period).bind(project).fetch_all(&mut *conn).await? {
        let vm: String = row.try_get(0)?;
        match vms.get_mut(&vm) {
            Some(line) => line.usage.cgpus.push(cgpu_time(&row)?),
            // Not by the triggers' rules (a cGPU counts only while its VM does); shown anyway.
            None => {
                vms.insert(
                    vm.clone(),
                    VmUsageLine {
                        vm,
                        name: String::new(),
                        started_ms: None,
                        ended_ms: None,
                        usage: UsageLine { vm_ms: 0, cgpus: vec![cgpu_time(&row)?] },
                    },
                );
            }
        }
    }
    Ok(vms.into_values().collect())
}

/// One span of cGPU time, as [`cgpu_spans`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub project: String,
    pub model: String,
    pub start_ms: i64,
    /// `None`: still counting.
    pub end_ms: Option<i64>,
}

/// The cGPU spans of `projects` that overlap the period (for a plot over time).
pub async fn cgpu_spans(
    conn: &mut AnyConnection,
    period: Period,
    projects: &[&str],
) -> Result<Vec<Span>, Error> {
    let mut spans = Vec::new();
    for project in projects {
        let sql = format!(
            "SELECT project, model, start_ms, end_ms FROM cgpu_usage \
             WHERE {OVERLAPS} AND project = $3"
        );
        let rows = sqlx::query(&sql)
            .bind(period.start_ms)
            .bind(period.end_ms)
            .bind(*project)
            .fetch_all(&mut *conn)
            .await?;
        for row in rows {
            spans.push(Span {
                project: row.try_get(0)?,
                model: row.try_get(1)?,
                start_ms: row.try_get(2)?,
                end_ms: row.try_get(3)?,
            });
        }
    }
    Ok(spans)
}

/// Every cGPU's time since usage was first recorded, by project, model and mode, spans still
/// counting up to `now_ms`: what the `/metrics` counters show. One statement, so that a roll-up
/// committed meanwhile ([`Db::roll_up_usage`]) is seen either wholly or not at all.
pub async fn usage_totals(
    conn: &mut AnyConnection,
    now_ms: i64,
) -> Result<Vec<(String, CgpuTime)>, Error> {
    let rows = sqlx::query(
        "SELECT project, model, mode, CAST(SUM(ms) AS BIGINT), SUM(memory_mib_ms) FROM ( \
           SELECT project, model, mode, cgpu_ms AS ms, memory_mib_ms FROM usage_totals \
           UNION ALL \
           SELECT project, model, mode, end_ms - start_ms AS ms, \
                  CAST(end_ms - start_ms AS DOUBLE PRECISION) * memory_mib \
           FROM cgpu_usage WHERE rolled = 0 AND end_ms IS NOT NULL \
           UNION ALL \
           SELECT project, model, mode, $1 - start_ms AS ms, \
                  CAST($1 - start_ms AS DOUBLE PRECISION) * memory_mib \
           FROM cgpu_usage WHERE end_ms IS NULL AND start_ms < $1 \
         ) t GROUP BY project, model, mode ORDER BY project, model, mode",
    )
    .bind(now_ms)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let time = CgpuTime {
                model: row.try_get(1)?,
                mode: row.try_get(2)?,
                cgpu_ms: row.try_get(3)?,
                memory_mib_ms: row.try_get(4)?,
                borrowed_ms: 0,
                borrowed_memory_mib_ms: 0.0,
            };
            Ok((row.try_get(0)?, time))
        })
        .collect()
}

/// The end of an `INSERT INTO usage_totals (project, model, mode, cgpu_ms, memory_mib_ms)` that
/// adds to a row already there (the roll-up's, and the fold's for spans ended within it).
pub(super) const ADD_TO_TOTALS: &str = "ON CONFLICT (project, model, mode) DO UPDATE SET \
    cgpu_ms = usage_totals.cgpu_ms + excluded.cgpu_ms, \
    memory_mib_ms = usage_totals.memory_mib_ms + excluded.memory_mib_ms";

impl Db {
    /// Adds every ended cGPU span not yet counted to `usage_totals`, each once, whichever
    /// replica does it (on PostgreSQL one statement, whose row locks make a second replica's
    /// skip the spans the first took). Returns how many it added.
    pub async fn roll_up_usage(&self) -> Result<u64, Error> {
        if self.backend() == super::Backend::Postgres {
            let row = sqlx::query(&format!(
                "WITH r AS (UPDATE cgpu_usage SET rolled = 1 \
                   WHERE rolled = 0 AND end_ms IS NOT NULL \
                   RETURNING project, model, mode, end_ms - start_ms AS ms, memory_mib), \
                 added AS (INSERT INTO usage_totals (project, model, mode, cgpu_ms, memory_mib_ms) \
                   SELECT project, model, mode, SUM(ms), \
                          SUM(CAST(ms AS DOUBLE PRECISION) * memory_mib) \
                   FROM r GROUP BY project, model, mode {ADD_TO_TOTALS}) \
                 SELECT COUNT(*) FROM r"
            ))
            .fetch_one(&mut *self.connection().await?)
            .await?;
            return Ok(row.try_get::<i64, _>(0)? as u64);
        }
        // `+project`: grouped by a temporary b-tree over the few spans ended since the last
        // roll-up (the partial index), not in the covering index's order over every span.
        let mut tx = self.begin_write().await?;
        sqlx::query(&format!(
            "INSERT INTO usage_totals (project, model, mode, cgpu_ms, memory_mib_ms) \
             SELECT project, model, mode, SUM(end_ms - start_ms), \
                    SUM(CAST(end_ms - start_ms AS DOUBLE PRECISION) * memory_mib) \
             FROM cgpu_usage WHERE rolled = 0 AND end_ms IS NOT NULL \
             GROUP BY +project, model, mode {ADD_TO_TOTALS}"
        ))
        .execute(&mut *tx)
        .await?;
        let rolled =
            sqlx::query("UPDATE cgpu_usage SET rolled = 1 WHERE rolled = 0 AND end_ms IS NOT NULL")
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(rolled)
    }
}
