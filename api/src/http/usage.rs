//! `GET /v1/usage` and `GET /v1/usage/{project}`: usage reports (see [`crate::app::usage`]), as
//! JSON or as CSV (`?format=csv`, or `Accept: text/csv`) for a spreadsheet or a billing import.
//!
//! The CSV is long-form, a row per quantity with its unit, so a new resource adds rows, not
//! columns. Cells that a spreadsheet would run as a formula (a VM's name is the tenant's text)
//! are quoted and prefixed with `'`, as OWASP advises against CSV injection.

use std::fmt::Write;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gsaas_api_types::{ModelUsage, ProjectUsage, UsageReport, UsageSeries, UsageTotals, VmUsage};
use serde::Deserialize;

use super::{query, AppState, QueryResult};
use crate::app::usage::{Report, UsageAsk};
use crate::auth::Caller;
use crate::db::{UsageLine, VmUsageLine};
use crate::error::{Error, Problem};
use crate::openstack::time::format_ms as time;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    /// The period's start, included: RFC 3339, or a UTC day (`2026-11-01`). Default: the first
    /// day of `end`'s month (UTC).
    start: Option<String>,
    /// The period's end, excluded, as `start`. Default: now.
    end: Option<String>,
    /// Seconds per point of the use over time (`series`; at least 60, at most 1000 points).
    step: Option<u64>,
    /// `json` (the default) or `csv` (as `Accept: text/csv`).
    format: Option<Format>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Format {
    Json,
    Csv,
}

impl UsageQuery {
    fn ask(&self) -> UsageAsk {
        UsageAsk { start: self.start.clone(), end: self.end.clone(), step: self.step }
    }

    fn csv(&self, headers: &HeaderMap) -> bool {
        match self.format {
            Some(format) => format == Format::Csv,
            None => headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|accept| accept.contains("text/csv")),
        }
    }
}

/// Every project's usage in a period (admins), or your project's.
///
/// Each VM counts while `creating` or `ready`, each cGPU while `live` on such a VM; what crosses
/// the period's edges counts only inside it; `borrowed_cgpu_seconds` is the part of a cGPU's time
/// it was on loan from the project's cohort. With `step`, `series` gives the cGPU-seconds of
/// each step: per project (the 8 that used the most) for admins, per GPU model for a tenant.
#[utoipa::path(get, path = "/v1/usage", tag = "usage", params(UsageQuery),
    responses((status = 200, description = "The report",
            content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 422, description = "A bad period or step", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn usage(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    params: QueryResult<UsageQuery>,
) -> Result<Response, Error> {
    let q = query(params)?;
    let report = app.usage(&caller, &q.ask()).await?;
    Ok(answer(report, q.csv(&headers)))
}

/// A project's usage in a period, with each of its VMs' (purged VMs included).
#[utoipa::path(get, path = "/v1/usage/{project}", tag = "usage", params(
        ("project" = String, Path, description = "The project's id"), UsageQuery),
    responses((status = 200, description = "The report",
            content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 404, description = "No such project, or not the caller's", body = Problem),
        (status = 422, description = "A bad period or step", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn project_usage(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(project): Path<String>,
    params: QueryResult<UsageQuery>,
) -> Result<Response, Error> {
    let q = query(params)?;
    let report = app.project_usage(&caller, &project, &q.ask()).await?;
    Ok(answer(report, q.csv(&headers)))
}

fn answer(report: Report, csv: bool) -> Response {
    if csv {
        let text = render_csv(&report);
        ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response()
    } else {
        Json(view(report)).into_response()
    }
}

fn seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

fn totals(line: &UsageLine) -> UsageTotals {
    let by_model: Vec<ModelUsage> = line
        .cgpus
        .iter()
        .map(|c| ModelUsage {
            model: c.model.clone(),
            mode: c.mode.clone(),
            cgpu_seconds: seconds(c.cgpu_ms),
            gpu_memory_mib_seconds: (c.memory_mib_ms / 1000.0).round(),
            borrowed_cgpu_seconds: seconds(c.borrowed_ms),
            borrowed_gpu_memory_mib_seconds: (c.borrowed_memory_mib_ms / 1000.0).round(),
        })
        .collect();
    let exclusive_ms: i64 =
        line.cgpus.iter().filter(|c| c.mode == "exclusive").map(|c| c.cgpu_ms).sum();
    let mib_seconds = |mib_ms: f64| (mib_ms / 1000.0).round();
    UsageTotals {
        vm_seconds: seconds(line.vm_ms),
        cgpu_seconds: seconds(line.cgpus.iter().map(|c| c.cgpu_ms).sum()),
        gpu_memory_mib_seconds: mib_seconds(line.cgpus.iter().map(|c| c.memory_mib_ms).sum()),
        exclusive_gpu_seconds: seconds(exclusive_ms),
        borrowed_cgpu_seconds: seconds(line.cgpus.iter().map(|c| c.borrowed_ms).sum()),
        borrowed_gpu_memory_mib_seconds: mib_seconds(
            line.cgpus.iter().map(|c| c.borrowed_memory_mib_ms).sum(),
        ),
        by_model,
    }
}

fn vm_view(vm: &VmUsageLine) -> VmUsage {
    VmUsage {
        id: vm.vm.clone(),
        name: vm.name.clone(),
        started_ms: vm.started_ms,
        ended_ms: vm.ended_ms,
        usage: totals(&vm.usage),
    }
}

fn view(report: Report) -> UsageReport {
    let vms = report.vms.as_ref().map(|vms| vms.iter().map(vm_view).collect::<Vec<_>>());
    UsageReport {
        start: time(report.period.start_ms),
        end: time(report.period.end_ms),
        start_ms: report.period.start_ms,
        end_ms: report.period.end_ms,
        projects: report
            .projects
            .iter()
            .map(|(project, line)| ProjectUsage {
                project: project.clone(),
                usage: totals(line),
                vms: vms.clone(),
            })
            .collect(),
        series: report.series.map(|s| UsageSeries {
            step_seconds: (s.step_ms / 1000) as u64,
            by: s.by.as_str().to_owned(),
            lines: s
                .lines
                .into_iter()
                .map(|(label, points)| gsaas_api_types::UsageLine {
                    label,
                    cgpu_seconds: points.into_iter().map(seconds).collect(),
                })
                .collect(),
        }),
    }
}

/// The CSV's columns.
const CSV_HEADER: &str =
    "period_start,period_end,project,vm,vm_name,resource,model,mode,quantity,unit";

/// A CSV cell: quoted when it holds a separator, a quote or a line break; a text a spreadsheet
/// would take for a formula gets a `'` first.
fn cell(text: &str) -> String {
    let formula = text.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let text = if formula { format!("'{text}") } else { text.to_owned() };
    if formula || text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The rows of one project's (or VM's) usage: its VM-seconds, then per model and mode its
/// cGPU-seconds, GPU-memory MiB-seconds, (exclusive) GPU-seconds and, where any was on loan from
/// its cohort, the borrowed cGPU-seconds and GPU-memory MiB-seconds (parts of the first two).
fn csv_rows(out: &mut String, prefix: &str, line: &UsageLine) {
    if line.vm_ms > 0 {
        let _ = writeln!(out, "{prefix},vm,,,{},s", seconds(line.vm_ms));
    }
    for c in &line.cgpus {
        let (model, mode) = (cell(&c.model), cell(&c.mode));
        let _ = writeln!(out, "{prefix},cgpu,{model},{mode},{},s", seconds(c.cgpu_ms));
        let memory = (c.memory_mib_ms / 1000.0).round();
        let _ = writeln!(out, "{prefix},gpu_memory,{model},{mode},{memory},MiB*s");
        if c.mode == "exclusive" {
            let _ = writeln!(out, "{prefix},exclusive_gpu,{model},{mode},{},s", seconds(c.cgpu_ms));
        }
        if c.borrowed_ms > 0 {
            let borrowed = seconds(c.borrowed_ms);
            let _ = writeln!(out, "{prefix},borrowed_cgpu,{model},{mode},{borrowed},s");
            let memory = (c.borrowed_memory_mib_ms / 1000.0).round();
            let _ = writeln!(out, "{prefix},borrowed_gpu_memory,{model},{mode},{memory},MiB*s");
        }
    }
}

fn render_csv(report: &Report) -> String {
    let (start, end) = (time(report.period.start_ms), time(report.period.end_ms));
    let mut out = format!("{CSV_HEADER}\n");
    for (project, line) in &report.projects {
        let project = cell(project);
        match &report.vms {
            None => csv_rows(&mut out, &format!("{start},{end},{project},,"), line),
            Some(vms) => {
                for vm in vms {
                    let prefix =
                        format!("{start},{end},{project},{},{}", cell(&vm.vm), cell(&vm.name));
                    csv_rows(&mut out, &prefix, &vm.usage);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_never_run_as_formulas_nor_break_the_row() {
        assert_eq!(cell("train-1"), "train-1");
        assert_eq!(cell("=HYPERLINK(\"http://x\")"), "\"'=HYPERLINK(\"\"http://x\"\")\"");
        assert_eq!(cell("@SUM(A1)"), "\"'@SUM(A1)\"");
        assert_eq!(cell("a,b"), "\"a,b\"");
        assert_eq!(cell("two\nlines"), "\"two\nlines\"");
    }
}
