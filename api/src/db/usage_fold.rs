//! The usage log folded into spans (`migrations/0029_usage_log.*.sql`): the triggers append one
//! event per change of a cGPU or a VM that counts, inside the change's own transaction, and the
//! spans of `cgpu_usage` and `vm_usage` are written here, later, in one transaction per fold
//! that also takes the events it folded out of the log, so each event is folded exactly once
//! whichever replica folds (PostgreSQL: an advisory lock keeps folds one at a time).
//!
//! Appending one row without an index is what a launch and a termination pay now; writing each
//! span with its indexes in their transactions cost launch + terminate cycles 13-20% of their
//! throughput (BENCHMARKS.md). A fold writes a span that started and ended within it once, ended,
//! and never moves it between indexes. Spans keep the times the triggers recorded.
//!
//! [`plan_fold`] decides, without I/O, what a batch of events does to the spans; [`Db::fold_usage`]
//! reads the batch and writes the plan.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{AnyConnection, Row};

use super::{fetch_batched, Backend, Db, Param, MAX_ROWS};
use crate::error::Error;

/// The key of PostgreSQL's advisory lock that keeps folds one at a time.
const FOLD_LOCK: i64 = 0x6773_6161_7375_7361; // "gsaasusa"

/// One event of the log, as the triggers wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEvent {
    pub seq: i64,
    pub at_ms: i64,
    pub vm: String,
    pub what: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A cGPU stopped counting (op 1).
    CgpuEnded { idx: i64 },
    /// A cGPU started counting (op 2).
    CgpuStarted(CgpuSpanStart),
    /// A VM, and every cGPU of it, stopped counting (op 3).
    VmEnded,
    /// A VM started counting (op 4).
    VmStarted { project: String, name: String },
}

/// What a cGPU span records when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgpuSpanStart {
    pub idx: i64,
    pub project: String,
    pub gpu: String,
    pub model: String,
    pub mode: String,
    pub memory_mib: i64,
}

/// A span that started within the batch: written once, ended or still counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSpan<T> {
    pub vm: String,
    pub of: T,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
}

/// What a batch of events does to the spans: ends of spans already written (cGPUs' first, then
/// VMs', which end the cGPU spans of theirs still open too), and the spans the batch started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FoldPlan {
    pub cgpu_ends: Vec<(String, i64, i64)>,
    pub vm_ends: Vec<(String, i64)>,
    pub cgpu_spans: Vec<NewSpan<CgpuSpanStart>>,
    pub vm_spans: Vec<NewSpan<(String, String)>>,
}

/// Replays `events` (in `seq` order) against the spans: a span is ended at most once, at the
/// first event that ends it, never before it started. An end of a span the batch did not start
/// is an end of a span already written, if one is open (the database's update finds none
/// otherwise).
pub fn plan_fold(events: &[UsageEvent]) -> FoldPlan {
    let mut plan = FoldPlan::default();
    // Spans started in this batch, still counting: (vm, idx) -> index into plan.cgpu_spans.
    let mut open_cgpus: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    let mut open_vms: BTreeMap<&str, usize> = BTreeMap::new();
    // Written spans this batch ended already: cGPUs by key, and every cGPU of a VM.
    let mut ended_cgpus: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut ended_vms: BTreeSet<&str> = BTreeSet::new();
    let end = |span: &mut Option<i64>, start: i64, at: i64| *span = Some(at.max(start));
    for event in events {
        let (vm, at) = (event.vm.as_str(), event.at_ms);
        match &event.what {
            EventKind::CgpuEnded { idx } => {
                if let Some(i) = open_cgpus.remove(&(vm, *idx)) {
                    let span = &mut plan.cgpu_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                } else if !ended_vms.contains(vm) && ended_cgpus.insert((vm, *idx)) {
                    plan.cgpu_ends.push((vm.to_owned(), *idx, at));
                }
            }
            EventKind::CgpuStarted(start) => {
                // One span counts per cGPU: a start ends one the batch left open (never so by
                // the triggers, which end it first).
                if let Some(i) = open_cgpus.remove(&(vm, start.idx)) {
                    let span = &mut plan.cgpu_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                }
                open_cgpus.insert((vm, start.idx), plan.cgpu_spans.len());
                plan.cgpu_spans.push(NewSpan {
                    vm: vm.to_owned(),
                    of: start.clone(),
                    start_ms: at,
                    end_ms: None,
                });
            }
            EventKind::VmEnded => {
                // Its written spans end now, or ended before: a VM that started counting in
                // this batch had none open (a cGPU counts only while its VM does).
                let started_here = open_vms.remove(vm);
                if let Some(i) = started_here {
                    let span = &mut plan.vm_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                }
                if ended_vms.insert(vm) && started_here.is_none() {
                    plan.vm_ends.push((vm.to_owned(), at));
                }
                let started: Vec<(&str, i64)> =
                    open_cgpus.range((vm, i64::MIN)..=(vm, i64::MAX)).map(|(k, _)| *k).collect();
                for key in started {
                    if let Some(i) = open_cgpus.remove(&key) {
                        let span = &mut plan.cgpu_spans[i];
                        end(&mut span.end_ms, span.start_ms, at);
                    }
                }
            }
            EventKind::VmStarted { project, name } => {
                if let Some(i) = open_vms.remove(vm) {
                    let span = &mut plan.vm_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                }
                open_vms.insert(vm, plan.vm_spans.len());
                plan.vm_spans.push(NewSpan {
                    vm: vm.to_owned(),
                    of: (project.clone(), name.clone()),
                    start_ms: at,
                    end_ms: None,
                });
            }
        }
    }
    plan
}

/// The columns an event is read with, in [`event`]'s order.
const EVENT_COLUMNS: &str = "seq, op, at_ms, vm, idx, project, name, gpu, model, mode, memory_mib";

fn event(row: &sqlx::any::AnyRow) -> Result<UsageEvent, Error> {
    let op: i64 = row.try_get(1)?;
    let text = |i: usize| -> Result<String, Error> {
        let value: Option<String> = row.try_get(i)?;
        value.ok_or_else(|| super::corrupt("usage event", &format!("op {op} lacks column {i}")))
    };
    let int = |i: usize| -> Result<i64, Error> {
        let value: Option<i64> = row.try_get(i)?;
        value.ok_or_else(|| super::corrupt("usage event", &format!("op {op} lacks column {i}")))
    };
    let what = match op {
        1 => EventKind::CgpuEnded { idx: int(4)? },
        2 => EventKind::CgpuStarted(CgpuSpanStart {
            idx: int(4)?,
            project: text(5)?,
            gpu: text(7)?,
            model: text(8)?,
            mode: text(9)?,
            memory_mib: int(10)?,
        }),
        3 => EventKind::VmEnded,
        4 => EventKind::VmStarted { project: text(5)?, name: text(6)? },
        other => return Err(super::corrupt("usage event op", &other.to_string())),
    };
    Ok(UsageEvent { seq: row.try_get(0)?, at_ms: row.try_get(2)?, vm: row.try_get(3)?, what })
}

/// The end of a written span that `c` names (`at_ms`), never before it started.
const ENDED_AT: &str = "CASE WHEN start_ms > c.at_ms THEN start_ms ELSE c.at_ms END";

async fn write(conn: &mut AnyConnection, plan: FoldPlan) -> Result<(), Error> {
    if !plan.cgpu_ends.is_empty() {
        let rows = plan
            .cgpu_ends
            .into_iter()
            .map(|(vm, idx, at)| vec![Param::text(vm), Param::Int(Some(idx)), Param::Int(Some(at))])
            .collect();
        fetch_batched(conn, rows, 8 * MAX_ROWS, |values| {
            format!(
                "WITH c (vm, idx, at_ms) AS (VALUES {values}) \
                 UPDATE cgpu_usage SET end_ms = {ENDED_AT} FROM c \
                 WHERE cgpu_usage.vm = c.vm AND cgpu_usage.idx = c.idx \
                   AND cgpu_usage.end_ms IS NULL"
            )
        })
        .await?;
    }
    if !plan.vm_ends.is_empty() {
        let rows: Vec<Vec<Param>> = plan
            .vm_ends
            .into_iter()
            .map(|(vm, at)| vec![Param::text(vm), Param::Int(Some(at))])
            .collect();
        for table in ["cgpu_usage", "vm_usage"] {
            fetch_batched(conn, rows.clone(), 8 * MAX_ROWS, |values| {
                format!(
                    "WITH c (vm, at_ms) AS (VALUES {values}) \
                     UPDATE {table} SET end_ms = {ENDED_AT} FROM c \
                     WHERE {table}.vm = c.vm AND {table}.end_ms IS NULL"
                )
            })
            .await?;
        }
    }
    if !plan.cgpu_spans.is_empty() {
        const COLUMNS: &str = "project, vm, idx, gpu, model, mode, memory_mib, start_ms, end_ms";
        let rows = plan
            .cgpu_spans
            .into_iter()
            .map(|s| {
                vec![
                    Param::text(s.of.project),
                    Param::text(s.vm),
                    Param::Int(Some(s.of.idx)),
                    Param::text(s.of.gpu),
                    Param::text(s.of.model),
                    Param::text(s.of.mode),
                    Param::Int(Some(s.of.memory_mib)),
                    Param::Int(Some(s.start_ms)),
                    Param::Int(s.end_ms),
                ]
            })
            .collect();
        fetch_batched(conn, rows, 4 * MAX_ROWS, |values| {
            format!(
                "WITH s ({COLUMNS}) AS (VALUES {values}) \
                 INSERT INTO cgpu_usage ({COLUMNS}) SELECT {COLUMNS} FROM s WHERE vm IS NOT NULL"
            )
        })
        .await?;
    }
    if !plan.vm_spans.is_empty() {
        const COLUMNS: &str = "project, vm, name, start_ms, end_ms";
        let rows = plan
            .vm_spans
            .into_iter()
            .map(|s| {
                vec![
                    Param::text(s.of.0),
                    Param::text(s.vm),
                    Param::text(s.of.1),
                    Param::Int(Some(s.start_ms)),
                    Param::Int(s.end_ms),
                ]
            })
            .collect();
        fetch_batched(conn, rows, 8 * MAX_ROWS, |values| {
            format!(
                "WITH s ({COLUMNS}) AS (VALUES {values}) \
                 INSERT INTO vm_usage ({COLUMNS}) SELECT {COLUMNS} FROM s WHERE vm IS NOT NULL"
            )
        })
        .await?;
    }
    Ok(())
}

impl Db {
    /// Folds every event logged so far into the spans, in one transaction that takes them out of
    /// the log (see the module docs). Returns how many it folded.
    pub async fn fold_usage(&self) -> Result<usize, Error> {
        let mut tx = self.begin().await?;
        let mut events = if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(FOLD_LOCK)
                .execute(&mut *tx)
                .await?;
            let rows = sqlx::query(&format!("DELETE FROM usage_events RETURNING {EVENT_COLUMNS}"))
                .fetch_all(&mut *tx)
                .await?;
            rows.iter().map(event).collect::<Result<Vec<_>, _>>()?
        } else {
            let rows = sqlx::query(&format!("SELECT {EVENT_COLUMNS} FROM usage_events"))
                .fetch_all(&mut *tx)
                .await?;
            if !rows.is_empty() {
                sqlx::query("DELETE FROM usage_events").execute(&mut *tx).await?;
            }
            rows.iter().map(event).collect::<Result<Vec<_>, _>>()?
        };
        if events.is_empty() {
            return Ok(0);
        }
        events.sort_by_key(|e| e.seq);
        let folded = events.len();
        write(&mut tx, plan_fold(&events)).await?;
        tx.commit().await?;
        Ok(folded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: i64, at_ms: i64, vm: &str, what: EventKind) -> UsageEvent {
        UsageEvent { seq, at_ms, vm: vm.into(), what }
    }

    fn started(idx: i64) -> EventKind {
        EventKind::CgpuStarted(CgpuSpanStart {
            idx,
            project: "p".into(),
            gpu: "g".into(),
            model: "A100".into(),
            mode: "shared".into(),
            memory_mib: 100,
        })
    }

    fn vm_started() -> EventKind {
        EventKind::VmStarted { project: "p".into(), name: "n".into() }
    }

    fn spans(plan: &FoldPlan) -> Vec<(&str, i64, i64, Option<i64>)> {
        plan.cgpu_spans.iter().map(|s| (s.vm.as_str(), s.of.idx, s.start_ms, s.end_ms)).collect()
    }

    #[test]
    fn a_life_within_one_fold_is_written_once_ended() {
        let events = [
            ev(1, 10, "a", vm_started()),
            ev(2, 10, "a", started(0)),
            ev(3, 11, "a", started(1)),
            ev(4, 20, "a", EventKind::CgpuEnded { idx: 1 }),
            ev(5, 30, "a", EventKind::VmEnded),
            // A release after the VM's end ends nothing more.
            ev(6, 31, "a", EventKind::CgpuEnded { idx: 0 }),
        ];
        let plan = plan_fold(&events);
        assert_eq!(spans(&plan), [("a", 0, 10, Some(30)), ("a", 1, 11, Some(20))]);
        assert_eq!(plan.vm_spans.len(), 1);
        assert_eq!((plan.vm_spans[0].start_ms, plan.vm_spans[0].end_ms), (10, Some(30)));
        assert!(plan.cgpu_ends.is_empty() && plan.vm_ends.is_empty());
    }

    #[test]
    fn written_spans_end_once_at_their_first_end() {
        let events = [
            ev(1, 5, "a", EventKind::CgpuEnded { idx: 0 }),
            ev(2, 6, "a", EventKind::CgpuEnded { idx: 0 }),
            ev(3, 7, "b", EventKind::VmEnded),
            // b's cGPU was ended with its VM: not again.
            ev(4, 8, "b", EventKind::CgpuEnded { idx: 0 }),
            // b counts again, then stops: the new spans end in the batch, the old stay ended.
            ev(5, 9, "b", vm_started()),
            ev(6, 9, "b", started(0)),
            ev(7, 12, "b", EventKind::VmEnded),
            // A span whose end the database's clock put before its start ends at its start.
            ev(8, 20, "c", started(3)),
            ev(9, 19, "c", EventKind::CgpuEnded { idx: 3 }),
        ];
        let plan = plan_fold(&events);
        assert_eq!(plan.cgpu_ends, [("a".to_owned(), 0, 5)]);
        assert_eq!(plan.vm_ends, [("b".to_owned(), 7)]);
        assert_eq!(spans(&plan), [("b", 0, 9, Some(12)), ("c", 3, 20, Some(20))]);
        assert_eq!((plan.vm_spans[0].start_ms, plan.vm_spans[0].end_ms), (9, Some(12)));
    }

    #[test]
    fn a_rehome_ends_one_span_and_starts_the_next_still_counting() {
        let events = [
            ev(1, 5, "a", EventKind::CgpuEnded { idx: 0 }),
            ev(2, 5, "a", started(0)),
            ev(3, 6, "a", started(0)),
        ];
        let plan = plan_fold(&events);
        assert_eq!(plan.cgpu_ends, [("a".to_owned(), 0, 5)]);
        assert_eq!(spans(&plan), [("a", 0, 5, Some(6)), ("a", 0, 6, None)]);
    }
}
