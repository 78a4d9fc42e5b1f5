//! Usage reports for billing and show-back: what each project used of VMs and cGPUs in a period,
//! from the lifetimes the database records (`usage.rs` of gsaas-datastore), with each VM's lines for one
//! project and, with a step, the use over time that the dashboard plots.
//!
//! The policy decides who sees what (`gpu:usage:show`, `gpu:usage:list:all_projects`): by
//! default an admin every project, a tenant its own; another project is 404, as if it had used
//! nothing. A report is read as it is asked for (nothing cached), after the usage log is folded
//! ([`super::background::usage_fold`]), so every replica answers the same, with every change
//! committed before it was asked.

use std::collections::BTreeMap;

use super::App;
use crate::auth::Caller;
use crate::db::{self, now_ms, Period, Span, UsageLine, VmUsageLine};
use crate::error::{Error, FieldError};
use crate::openstack::time::{month_start_ms, parse_utc};
use crate::policy::actions;

/// The fewest seconds a step of a series may span.
pub const MIN_STEP_SECONDS: u64 = 60;
/// The most seconds a step may span (ten years).
pub const MAX_STEP_SECONDS: u64 = 10 * 365 * 86_400;
/// The most points a series may have.
pub const MAX_STEPS: i64 = 1000;
/// The most projects an all-projects series plots (those that used the most cGPU time).
pub const SERIES_PROJECTS: usize = 8;

/// What a report asks for, as the request gave it.
#[derive(Debug, Clone, Default)]
pub struct UsageAsk {
    /// The period's start (default: the first day of `end`'s month, UTC).
    pub start: Option<String>,
    /// The period's end (default: now).
    pub end: Option<String>,
    /// Seconds per point of a series over the period; none without it.
    pub step: Option<u64>,
}

/// A report: the period, each project's usage, and the series asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub period: Period,
    pub projects: BTreeMap<String, UsageLine>,
    /// One project's VMs (`project_usage`).
    pub vms: Option<Vec<VmUsageLine>>,
    pub series: Option<Series>,
}

/// cGPU time over the period, a point per step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub step_ms: i64,
    pub by: SeriesBy,
    /// Each line's label and milliseconds per step.
    pub lines: Vec<(String, Vec<i64>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesBy {
    Model,
    Project,
}

impl SeriesBy {
    pub fn as_str(self) -> &'static str {
        match self {
            SeriesBy::Model => "model",
            SeriesBy::Project => "project",
        }
    }
}

/// The period and step `ask` names, every problem with them at once.
fn checked(ask: &UsageAsk, now: i64) -> Result<(Period, Option<i64>), Error> {
    let mut errors = Vec::new();
    let mut time = |field: &str, value: &Option<String>| {
        let raw = value.as_deref()?;
        let parsed = parse_utc(raw)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok());
        if parsed.is_none() {
            errors.push(FieldError {
                field: field.to_owned(),
                detail: format!(
                    "{raw:?} is not a time: use RFC 3339 (2026-11-01T00:00:00Z) or a UTC day \
                     (2026-11-01)"
                ),
            });
        }
        parsed
    };
    let end = time("end", &ask.end);
    let start = time("start", &ask.start);
    let end_ms = end.unwrap_or(now);
    let start_ms = start.unwrap_or_else(|| month_start_ms(end_ms - 1));
    if errors.is_empty() && start_ms >= end_ms {
        errors.push(FieldError {
            field: "start".to_owned(),
            detail: "must be before end".to_owned(),
        });
    }
    let mut step_ms = None;
    if let Some(step) = ask.step {
        // A step longer than the period gives one point, cut short by the period's end.
        let length = (end_ms - start_ms).max(1);
        let ms = i64::try_from(step.saturating_mul(1000)).unwrap_or(i64::MAX).min(i64::MAX / 4);
        let points = || steps_in(length, ms);
        if !(MIN_STEP_SECONDS..=MAX_STEP_SECONDS).contains(&step) {
            errors.push(FieldError {
                field: "step".to_owned(),
                detail: format!("must be from {MIN_STEP_SECONDS} to {MAX_STEP_SECONDS} seconds"),
            });
        } else if points() > MAX_STEPS {
            errors.push(FieldError {
                field: "step".to_owned(),
                detail: format!(
                    "gives more than {MAX_STEPS} points over the period: take a longer step"
                ),
            });
        } else {
            step_ms = Some(ms);
        }
    }
    Error::invalid_fields(errors)?;
    Ok((Period { start_ms, end_ms, now_ms: now }, step_ms))
}

/// How many steps of `step_ms` cover `length_ms` (the last may be cut short).
fn steps_in(length_ms: i64, step_ms: i64) -> i64 {
    length_ms / step_ms + i64::from(length_ms % step_ms != 0)
}

/// Adds up `spans`' time in each step of the period, by `label`.
pub fn series(
    period: Period,
    step_ms: i64,
    spans: &[Span],
    label: impl Fn(&Span) -> &str,
) -> Vec<(String, Vec<i64>)> {
    let steps = steps_in(period.end_ms - period.start_ms, step_ms) as usize;
    let mut lines: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for span in spans {
        let from = span.start_ms.max(period.start_ms);
        let to = span.end_ms.unwrap_or(period.now_ms).min(period.end_ms);
        if to <= from {
            continue;
        }
        let points = lines.entry(label(span).to_owned()).or_insert_with(|| vec![0; steps]);
        let first = ((from - period.start_ms) / step_ms) as usize;
        let last = ((to - 1 - period.start_ms) / step_ms) as usize;
        for (i, point) in points.iter_mut().enumerate().take(last + 1).skip(first) {
            let step_start = period.start_ms + i as i64 * step_ms;
            let step_end = step_start.saturating_add(step_ms).min(period.end_ms);
            *point += to.min(step_end) - from.max(step_start);
        }
    }
    lines.into_iter().collect()
}

/// The projects' use over the period, one line per GPU model (a tenant's view of its own).
async fn model_series(
    db: &db::Db,
    period: Period,
    step_ms: i64,
    projects: &[&str],
) -> Result<Series, Error> {
    let spans = db.cgpu_spans(period, projects).await?;
    let lines = series(period, step_ms, &spans, |s| &s.model);
    Ok(Series { step_ms, by: SeriesBy::Model, lines })
}

impl App {
    /// Every project's usage in the period (admins), or the caller's project's.
    pub async fn usage(&self, caller: &Caller, ask: &UsageAsk) -> Result<Report, Error> {
        let own = self.policy.list_scope(caller, actions::USAGE_SHOW, actions::USAGE_LIST_ALL)?;
        let (period, step) = checked(ask, now_ms())?;
        self.fold_usage().await?;
        let projects = self.db.usage_by_project(period, own).await?;
        let series = match step {
            None => None,
            Some(step_ms) if own.is_some() => {
                let own: Vec<&str> = own.into_iter().collect();
                Some(model_series(&self.db, period, step_ms, &own).await?)
            }
            Some(step_ms) => {
                let mut most: Vec<(&String, i64)> = projects
                    .iter()
                    .map(|(p, line)| (p, line.cgpus.iter().map(|c| c.cgpu_ms).sum()))
                    .filter(|(_, ms)| *ms > 0)
                    .collect();
                most.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
                let top: Vec<&str> =
                    most.iter().take(SERIES_PROJECTS).map(|(p, _)| p.as_str()).collect();
                let spans = self.db.cgpu_spans(period, &top).await?;
                let lines = series(period, step_ms, &spans, |s| &s.project);
                Some(Series { step_ms, by: SeriesBy::Project, lines })
            }
        };
        Ok(Report { period, projects, vms: None, series })
    }

    /// One project's usage in the period, with each of its VMs' (purged ones too).
    pub async fn project_usage(
        &self,
        caller: &Caller,
        project: &str,
        ask: &UsageAsk,
    ) -> Result<Report, Error> {
        let project =
            super::quotas::visible_project(&self.policy, caller, project, actions::USAGE_SHOW)?;
        let (period, step) = checked(ask, now_ms())?;
        self.fold_usage().await?;
        let mut projects = self.db.usage_by_project(period, Some(project.as_str())).await?;
        // A project that used nothing still gets its line (of zeros), as it may see itself.
        projects.entry(project.to_string()).or_default();
        let vms = self.db.usage_by_vm(period, project.as_str()).await?;
        let series = match step {
            Some(step_ms) => {
                Some(model_series(&self.db, period, step_ms, &[project.as_str()]).await?)
            }
            None => None,
        };
        Ok(Report { period, projects, vms: Some(vms), series })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(model: &str, start_ms: i64, end_ms: Option<i64>) -> Span {
        Span { project: "p".into(), model: model.into(), start_ms, end_ms }
    }

    #[test]
    fn a_series_splits_each_span_at_the_steps_and_the_period() {
        let period = Period { start_ms: 1000, end_ms: 3500, now_ms: 3200 };
        let spans = [
            span("A100", 0, Some(1500)),    // 500 in the first step
            span("A100", 1900, Some(2100)), // 100 + 100
            span("H100", 2500, None),       // counts to now: 500 + 200
            span("H100", 4000, Some(5000)), // after the period
        ];
        let lines = series(period, 1000, &spans, |s| &s.model);
        assert_eq!(
            lines,
            vec![("A100".to_owned(), vec![600, 100, 0]), ("H100".to_owned(), vec![0, 500, 200])]
        );
    }

    #[test]
    fn periods_are_checked_field_by_field() {
        let now = 1_764_000_000_000; // 2025-11-24T16:00:00Z
        let (period, step) = checked(&UsageAsk::default(), now).unwrap();
        assert_eq!((period.start_ms, period.end_ms, step), (1_761_955_200_000, now, None));
        let ask = UsageAsk {
            start: Some("2025-11-02".into()),
            end: Some("2025-11-01T00:00:00Z".into()),
            step: None,
        };
        let Err(Error::Invalid(errors)) = checked(&ask, now) else { panic!() };
        assert_eq!(errors[0].field, "start");
        let ask = UsageAsk { start: Some("last week".into()), end: None, step: Some(1) };
        let Err(Error::Invalid(errors)) = checked(&ask, now) else { panic!() };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["start", "step"]);
        let ask = UsageAsk { start: Some("2025-01-01".into()), end: None, step: Some(60) };
        let Err(Error::Invalid(errors)) = checked(&ask, now) else { panic!() };
        assert!(errors[0].detail.contains("more than 1000 points"), "{}", errors[0].detail);
        let ask = UsageAsk { start: None, end: None, step: Some(u64::MAX) };
        assert!(matches!(checked(&ask, now), Err(Error::Invalid(_))));
        let ask = UsageAsk { start: None, end: None, step: Some(MAX_STEP_SECONDS) };
        let (period, step) = checked(&ask, now).unwrap();
        let spans = [span("A100", 0, None)];
        let lines = series(period, step.unwrap(), &spans, |s| &s.model);
        assert_eq!(lines[0].1, vec![period.end_ms - period.start_ms], "one point: the period");
    }
}
