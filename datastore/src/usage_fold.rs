//! The usage log folded into spans (`migrations/0029_usage_log.*.sql`): the triggers append one
//! event per change of a cGPU or a VM that counts, inside the change's own transaction, and the
//! spans of `cgpu_usage` and `vm_usage` are written here, later, in one transaction per fold
//! that also takes the events it folded out of the log, so each event is folded exactly once
//! whichever replica folds (PostgreSQL: an advisory lock keeps folds one at a time).
//!
//! Appending one row without an index is what a launch and a termination pay now; writing each
//! span with its indexes in their transactions cost launch + terminate cycles 13-20% of their
//! throughput (BENCHMARKS.md). A fold writes a span that started and ended within it once, ended,
//! and never moves it between indexes. Spans keep the times the triggers recorded, but for a
//! cGPU logged ahead of its VM by one launch, which starts with its VM ([`plan_fold`]).
//!
//! A cGPU's span also records whether the cGPU was on loan from its project's cohort
//! (`migrations/0036_borrowed_usage.*.sql`): a change of its loan mark while it counts is logged
//! as an end and a start at one instant, as a re-home is, so the fold splits its span there with
//! nothing of its own to add, and each second of a cGPU is in one span, borrowed or not.
//!
//! [`plan_fold`] decides, without I/O, what a batch of events does to the spans; [`Db::fold_usage`]
//! reads the batch and writes the plan, each as one JSON document (a second's 8,000 events read
//! row by row through sqlx cost a fold 30-60 ms on SQLite; pairing them in SQL with window
//! functions, 200 ms).

use std::collections::{BTreeMap, BTreeSet};

use sqlx::Row;

use super::{Backend, Db};
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
    /// On loan from the project's cohort (`cgpus.borrowed_ms` set) for the whole span.
    pub borrowed: bool,
}

/// A span that started within the batch: written once, ended or still counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSpan<T> {
    pub vm: String,
    pub of: T,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
}

impl<T> NewSpan<T> {
    /// Ends the span at `at`, never before it started.
    fn end_at(&mut self, at: i64) {
        self.end_ms = Some(at.max(self.start_ms));
    }
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

/// Replays `events` (in `seq` order) against the spans.
///
/// A span started in the batch ends at the first later event that ends it: for a cGPU, the next
/// event of the same cGPU (an end, or a start on another GPU) or an end of its VM; for a VM, its
/// next end or start. A span written by an earlier fold, if one is open, ends at the batch's
/// first event of its cGPU if that is an end and no end of its VM came before, or at the batch's
/// first event of its VM if that is an end (with its VM's cGPUs, those still open). A span never
/// ends before it started, and a cGPU's never starts before its VM's: PostgreSQL fires the
/// triggers of a data-modifying `WITH` in the order its inserts finish, and a launch's one
/// statement (vms.rs, `insert_vms_with_cgpus`) inserts the VM last. A span keeps the loan mark its
/// start carried: a change of the mark is an end and a start, like any other split.
pub fn plan_fold(events: &[UsageEvent]) -> FoldPlan {
    let mut plan = FoldPlan::default();
    // Spans started in this batch, still counting: (vm, idx) -> index into plan.cgpu_spans.
    let mut open_cgpus: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    let mut open_vms: BTreeMap<&str, usize> = BTreeMap::new();
    // cGPUs with an event in the batch so far; VMs with an end; VMs with an end or a start.
    let mut seen_cgpus: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut ended_vms: BTreeSet<&str> = BTreeSet::new();
    let mut seen_vms: BTreeSet<&str> = BTreeSet::new();
    for event in events {
        let (vm, at) = (event.vm.as_str(), event.at_ms);
        match &event.what {
            EventKind::CgpuEnded { idx } => {
                if let Some(i) = open_cgpus.remove(&(vm, *idx)) {
                    plan.cgpu_spans[i].end_at(at);
                } else if !seen_cgpus.contains(&(vm, *idx)) && !ended_vms.contains(vm) {
                    plan.cgpu_ends.push((vm.to_owned(), *idx, at));
                }
                seen_cgpus.insert((vm, *idx));
            }
            EventKind::CgpuStarted(start) => {
                if let Some(i) = open_cgpus.remove(&(vm, start.idx)) {
                    plan.cgpu_spans[i].end_at(at);
                }
                seen_cgpus.insert((vm, start.idx));
                open_cgpus.insert((vm, start.idx), plan.cgpu_spans.len());
                plan.cgpu_spans.push(NewSpan {
                    vm: vm.to_owned(),
                    of: start.clone(),
                    start_ms: at,
                    end_ms: None,
                });
            }
            EventKind::VmEnded => {
                if let Some(i) = open_vms.remove(vm) {
                    plan.vm_spans[i].end_at(at);
                }
                if seen_vms.insert(vm) {
                    plan.vm_ends.push((vm.to_owned(), at));
                }
                ended_vms.insert(vm);
                let started: Vec<(&str, i64)> =
                    open_cgpus.range((vm, i64::MIN)..=(vm, i64::MAX)).map(|(k, _)| *k).collect();
                for key in started {
                    if let Some(i) = open_cgpus.remove(&key) {
                        plan.cgpu_spans[i].end_at(at);
                    }
                }
            }
            EventKind::VmStarted { project, name } => {
                if let Some(i) = open_vms.remove(vm) {
                    plan.vm_spans[i].end_at(at);
                }
                // Its cGPUs' spans started since its last end were logged ahead of it by the same
                // statement (a launch that books the VM and its cGPUs at once): they start with it.
                for (_, &i) in open_cgpus.range((vm, i64::MIN)..=(vm, i64::MAX)) {
                    let span = &mut plan.cgpu_spans[i];
                    span.start_ms = span.start_ms.max(at);
                }
                seen_vms.insert(vm);
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

/// An event as the fold reads it ([`EVENT_COLUMNS`], as a JSON array): seq, op, at_ms, vm, idx,
/// project, name, gpu, model, mode, memory_mib, borrowed.
type EventRow = (
    i64,
    i64,
    i64,
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// An event's columns as a JSON array, in [`EventRow`]'s order.
const EVENT_COLUMNS: &str =
    "seq, op, at_ms, vm, idx, project, name, gpu, model, mode, memory_mib, borrowed";

fn event(row: EventRow) -> Result<UsageEvent, Error> {
    let (seq, op, at_ms, vm, idx, project, name, gpu, model, mode, memory_mib, borrowed) = row;
    let lacks =
        |what: &str| super::corrupt("usage event", &format!("{seq} (op {op}) lacks {what}"));
    let what = match op {
        1 => EventKind::CgpuEnded { idx: idx.ok_or_else(|| lacks("idx"))? },
        2 => EventKind::CgpuStarted(CgpuSpanStart {
            idx: idx.ok_or_else(|| lacks("idx"))?,
            project: project.ok_or_else(|| lacks("project"))?,
            gpu: gpu.ok_or_else(|| lacks("gpu"))?,
            model: model.ok_or_else(|| lacks("model"))?,
            mode: mode.ok_or_else(|| lacks("mode"))?,
            memory_mib: memory_mib.ok_or_else(|| lacks("memory_mib"))?,
            // NULL: logged before 0036, when no start said so (not on loan).
            borrowed: borrowed.unwrap_or(0) != 0,
        }),
        3 => EventKind::VmEnded,
        4 => EventKind::VmStarted {
            project: project.ok_or_else(|| lacks("project"))?,
            name: name.ok_or_else(|| lacks("name"))?,
        },
        other => return Err(super::corrupt("usage event op", &other.to_string())),
    };
    Ok(UsageEvent { seq, at_ms, vm, what })
}

/// The rows of the JSON array bound as `$1`, each as `e.value` (whose `->> i` is its `i`th
/// element, text or integer as stored). On PostgreSQL `jsonb`, parsed once by the cast: `->>`
/// on `json` parses the row's text again each time, and a span has ten fields.
fn json_rows(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "json_each($1) AS e",
        Backend::Postgres => "jsonb_array_elements(CAST($1 AS jsonb)) AS e(value)",
    }
}

/// `at`, never before `start`.
fn not_before(at: &str, start: &str) -> String {
    format!("CASE WHEN {at} IS NULL THEN NULL WHEN {at} > {start} THEN {at} ELSE {start} END")
}

fn json(value: &impl serde::Serialize) -> Result<String, Error> {
    serde_json::to_string(value).map_err(|e| Error::internal(format!("usage fold: {e}")))
}

/// Writes `plan`: the written spans it ends (cGPUs' first, then VMs' with their cGPUs'), then
/// the spans the batch started, each list in one statement.
async fn write(
    conn: &mut sqlx::AnyConnection,
    backend: Backend,
    plan: FoldPlan,
) -> Result<(), Error> {
    let rows = json_rows(backend);
    let int = |i: usize| format!("CAST(e.value->>{i} AS BIGINT)");
    if !plan.cgpu_ends.is_empty() {
        let end = not_before("c.at_ms", "cgpu_usage.start_ms");
        sqlx::query(&format!(
            "UPDATE cgpu_usage SET end_ms = {end} \
             FROM (SELECT e.value->>0 AS vm, {} AS idx, {} AS at_ms FROM {rows}) c \
             WHERE cgpu_usage.vm = c.vm AND cgpu_usage.idx = c.idx AND cgpu_usage.end_ms IS NULL",
            int(1),
            int(2)
        ))
        .bind(json(&plan.cgpu_ends)?)
        .execute(&mut *conn)
        .await?;
    }
    if !plan.vm_ends.is_empty() {
        let ends = json(&plan.vm_ends)?;
        for table in ["cgpu_usage", "vm_usage"] {
            let end = not_before("c.at_ms", &format!("{table}.start_ms"));
            sqlx::query(&format!(
                "UPDATE {table} SET end_ms = {end} \
                 FROM (SELECT e.value->>0 AS vm, {} AS at_ms FROM {rows}) c \
                 WHERE {table}.vm = c.vm AND {table}.end_ms IS NULL",
                int(1)
            ))
            .bind(&ends)
            .execute(&mut *conn)
            .await?;
        }
    }
    if !plan.cgpu_spans.is_empty() {
        // A span that ended within the batch is added to `usage_totals` now (`rolled` = 1), so
        // it never enters the index of spans left to roll up (usage.rs, `roll_up_usage`).
        let mut totals: BTreeMap<(&str, &str, &str), (i64, f64)> = BTreeMap::new();
        let spans: Vec<_> = plan
            .cgpu_spans
            .iter()
            .map(|s| {
                let o = &s.of;
                if let Some(end) = s.end_ms {
                    let total = totals.entry((&o.project, &o.model, &o.mode)).or_default();
                    total.0 += end - s.start_ms;
                    total.1 += (end - s.start_ms) as f64 * o.memory_mib as f64;
                }
                let rolled = i64::from(s.end_ms.is_some());
                let (project, vm, gpu, model, mode) =
                    (&o.project, &s.vm, &o.gpu, &o.model, &o.mode);
                let borrowed = i64::from(o.borrowed);
                let (start, end) = (s.start_ms, s.end_ms);
                (project, vm, o.idx, gpu, model, mode, o.memory_mib, start, end, rolled, borrowed)
            })
            .collect();
        sqlx::query(&format!(
            "INSERT INTO cgpu_usage \
               (project, vm, idx, gpu, model, mode, memory_mib, start_ms, end_ms, rolled, \
                borrowed) \
             SELECT e.value->>0, e.value->>1, {}, e.value->>3, e.value->>4, e.value->>5, {}, {}, \
                    {}, {}, {} \
             FROM {rows}",
            int(2),
            int(6),
            int(7),
            int(8),
            int(9),
            int(10)
        ))
        .bind(json(&spans)?)
        .execute(&mut *conn)
        .await?;
        if !totals.is_empty() {
            let totals: Vec<_> = totals
                .into_iter()
                .map(|((p, model, mode), (ms, mib_ms))| (p, model, mode, ms, mib_ms))
                .collect();
            // `WHERE true`: SQLite's upsert from a SELECT needs a WHERE to parse.
            sqlx::query(&format!(
                "INSERT INTO usage_totals (project, model, mode, cgpu_ms, memory_mib_ms) \
                 SELECT e.value->>0, e.value->>1, e.value->>2, {}, \
                        CAST(e.value->>4 AS DOUBLE PRECISION) \
                 FROM {rows} WHERE true {}",
                int(3),
                super::usage::ADD_TO_TOTALS
            ))
            .bind(json(&totals)?)
            .execute(&mut *conn)
            .await?;
        }
    }
    if !plan.vm_spans.is_empty() {
        let spans: Vec<_> =
            plan.vm_spans.iter().map(|s| (&s.of.0, &s.vm, &s.of.1, s.start_ms, s.end_ms)).collect();
        sqlx::query(&format!(
            "INSERT INTO vm_usage (project, vm, name, start_ms, end_ms) \
             SELECT e.value->>0, e.value->>1, e.value->>2, {}, {} FROM {rows}",
            int(3),
            int(4)
        ))
        .bind(json(&spans)?)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

impl Db {
    /// Folds every event logged so far into the spans, in one transaction that takes them out of
    /// the log (see the module docs). Returns how many it folded.
    pub async fn fold_usage(&self) -> Result<u64, Error> {
        let backend = self.backend();
        let mut tx = self.begin_write().await?;
        let taken: Option<String> = if backend == Backend::Postgres {
            // What the DELETE takes is what is folded; the lock keeps a second replica's fold from
            // taking later events than the first's before the first has written its spans.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(FOLD_LOCK)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&format!(
                "WITH b AS (DELETE FROM usage_events RETURNING {EVENT_COLUMNS}) \
                 SELECT CAST(json_agg(json_build_array({EVENT_COLUMNS})) AS TEXT) FROM b"
            ))
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?
        } else {
            // One connection: nothing is logged between the read and the delete.
            let taken: Option<String> = sqlx::query(&format!(
                "SELECT CASE WHEN COUNT(*) > 0 THEN json_group_array(json_array({EVENT_COLUMNS})) \
                 END FROM usage_events"
            ))
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
            if taken.is_some() {
                sqlx::query("DELETE FROM usage_events").execute(&mut *tx).await?;
            }
            taken
        };
        let Some(taken) = taken else { return Ok(0) };
        let rows: Vec<EventRow> = serde_json::from_str(&taken)
            .map_err(|e| super::corrupt("usage events", &e.to_string()))?;
        let mut events = rows.into_iter().map(event).collect::<Result<Vec<_>, _>>()?;
        events.sort_by_key(|e| e.seq);
        write(&mut tx, backend, plan_fold(&events)).await?;
        tx.commit().await?;
        Ok(events.len() as u64)
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
            borrowed: false,
        })
    }

    /// A start of a cGPU on loan.
    fn lent(idx: i64) -> EventKind {
        let EventKind::CgpuStarted(start) = started(idx) else { unreachable!() };
        EventKind::CgpuStarted(CgpuSpanStart { borrowed: true, ..start })
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
    fn a_cgpu_logged_ahead_of_its_vm_by_one_launch_starts_with_it() {
        let events = [
            ev(1, 9, "a", started(0)),
            ev(2, 10, "a", started(1)),
            ev(3, 12, "a", vm_started()),
            // A later start keeps its own time.
            ev(4, 15, "a", started(2)),
            ev(5, 20, "a", EventKind::VmEnded),
        ];
        let plan = plan_fold(&events);
        let want = [("a", 0, 12, Some(20)), ("a", 1, 12, Some(20)), ("a", 2, 15, Some(20))];
        assert_eq!(spans(&plan), want);
        assert_eq!((plan.vm_spans[0].start_ms, plan.vm_spans[0].end_ms), (12, Some(20)));
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

    /// (idx, start, end, borrowed) of the batch's spans.
    fn marked(plan: &FoldPlan) -> Vec<(i64, i64, Option<i64>, bool)> {
        plan.cgpu_spans.iter().map(|s| (s.of.idx, s.start_ms, s.end_ms, s.of.borrowed)).collect()
    }

    #[test]
    fn a_loan_mark_taken_off_splits_the_span_at_its_instant() {
        // cGPU 1 is on loan from its launch until its mark is taken off at 20 (the trigger logs
        // an end and a start at one instant), then its own until its VM ends.
        let events = [
            ev(1, 10, "a", vm_started()),
            ev(2, 10, "a", started(0)),
            ev(3, 10, "a", lent(1)),
            ev(4, 20, "a", EventKind::CgpuEnded { idx: 1 }),
            ev(5, 20, "a", started(1)),
            ev(6, 30, "a", EventKind::VmEnded),
        ];
        let plan = plan_fold(&events);
        let want = [(0, 10, Some(30), false), (1, 10, Some(20), true), (1, 20, Some(30), false)];
        assert_eq!(marked(&plan), want);
        // Each second once: cGPU 1's spans meet, borrowed 10 ms of its 20.
        let of = |idx: i64, borrowed: bool| -> i64 {
            marked(&plan)
                .iter()
                .filter(|s| s.0 == idx && s.3 == borrowed)
                .map(|s| s.2.unwrap() - s.1)
                .sum()
        };
        assert_eq!((of(1, true), of(1, false), of(0, true), of(0, false)), (10, 10, 0, 20));
    }

    #[test]
    fn a_loan_mark_change_ends_a_written_span_and_the_next_keeps_counting() {
        // The borrowed span was written by an earlier fold: it ends at the change, once; the
        // next, its own, counts on. A mark set again later splits it again.
        let events = [
            ev(1, 40, "a", EventKind::CgpuEnded { idx: 1 }),
            ev(2, 40, "a", started(1)),
            ev(3, 55, "a", EventKind::CgpuEnded { idx: 1 }),
            ev(4, 55, "a", lent(1)),
        ];
        let plan = plan_fold(&events);
        assert_eq!(plan.cgpu_ends, [("a".to_owned(), 1, 40)]);
        assert_eq!(marked(&plan), [(1, 40, Some(55), false), (1, 55, None, true)]);
    }

    #[test]
    fn a_vm_counting_again_restarts_its_loans_borrowed() {
        let events = [
            ev(1, 5, "a", EventKind::VmEnded),
            ev(2, 9, "a", vm_started()),
            ev(3, 9, "a", lent(0)),
            ev(4, 9, "a", started(1)),
        ];
        let plan = plan_fold(&events);
        assert_eq!(plan.vm_ends, [("a".to_owned(), 5)]);
        assert_eq!(marked(&plan), [(0, 9, None, true), (1, 9, None, false)]);
    }
}
