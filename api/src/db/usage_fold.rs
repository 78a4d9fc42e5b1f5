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
//! [`plan_fold`] says, without I/O, what a batch of events does to the spans; [`Db::fold_usage`]
//! does it in SQL, without reading the events out of the database (through sqlx, 8,000 events a
//! second cost a fold on SQLite 30-60 ms a second, most of the old triggers' cost again), and the
//! tests compare the two on random batches.

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

/// Replays `events` (in `seq` order) against the spans: the specification the fold's SQL
/// ([`Db::fold_usage`]) implements, and the tests compare it with.
///
/// A span started in the batch ends at the first later event that ends it: for a cGPU, the next
/// event of the same cGPU (an end, or a start on another GPU) or an end of its VM; for a VM, its
/// next end or start. A span written by an earlier fold, if one is open, ends at the batch's
/// first event of its cGPU if that is an end and no end of its VM came before, or at the batch's
/// first event of its VM if that is an end (with its VM's cGPUs, those still open). A span never
/// ends before it started.
pub fn plan_fold(events: &[UsageEvent]) -> FoldPlan {
    let mut plan = FoldPlan::default();
    // Spans started in this batch, still counting: (vm, idx) -> index into plan.cgpu_spans.
    let mut open_cgpus: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    let mut open_vms: BTreeMap<&str, usize> = BTreeMap::new();
    // cGPUs with an event in the batch so far; VMs with an end, or an end or a start.
    let mut seen_cgpus: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut ended_vms: BTreeSet<&str> = BTreeSet::new();
    let mut seen_vms: BTreeSet<&str> = BTreeSet::new();
    let end = |span: &mut Option<i64>, start: i64, at: i64| *span = Some(at.max(start));
    for event in events {
        let (vm, at) = (event.vm.as_str(), event.at_ms);
        match &event.what {
            EventKind::CgpuEnded { idx } => {
                if let Some(i) = open_cgpus.remove(&(vm, *idx)) {
                    let span = &mut plan.cgpu_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                } else if !seen_cgpus.contains(&(vm, *idx)) && !ended_vms.contains(vm) {
                    plan.cgpu_ends.push((vm.to_owned(), *idx, at));
                }
                seen_cgpus.insert((vm, *idx));
            }
            EventKind::CgpuStarted(start) => {
                if let Some(i) = open_cgpus.remove(&(vm, start.idx)) {
                    let span = &mut plan.cgpu_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
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
                    let span = &mut plan.vm_spans[i];
                    end(&mut span.end_ms, span.start_ms, at);
                }
                if seen_vms.insert(vm) {
                    plan.vm_ends.push((vm.to_owned(), at));
                }
                ended_vms.insert(vm);
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

/// Every event of the batch (`{src}`: the log, or on PostgreSQL what the fold took out of it)
/// with what [`plan_fold`] asks of its neighbours: the previous and next event of its cGPU (ops 1
/// and 2 only; the VM events of a VM have `idx` NULL, a partition of their own), and the VM's
/// ends and starts before and after it.
fn plan_cte(src: &str) -> String {
    const AFTER: &str =
        "PARTITION BY vm ORDER BY seq ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING";
    const BEFORE: &str =
        "PARTITION BY vm ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING";
    format!(
        "plan AS (SELECT seq, op, at_ms, vm, idx, project, name, gpu, model, mode, memory_mib, \
           LAG(seq) OVER (PARTITION BY vm, idx ORDER BY seq) AS prev_of_cgpu, \
           LEAD(seq) OVER (PARTITION BY vm, idx ORDER BY seq) AS next_of_cgpu, \
           MIN(CASE WHEN op = 3 THEN seq END) OVER ({AFTER}) AS next_vm_end, \
           MIN(CASE WHEN op IN (3, 4) THEN seq END) OVER ({AFTER}) AS next_of_vm, \
           MAX(CASE WHEN op = 3 THEN seq END) OVER ({BEFORE}) AS prev_vm_end, \
           MAX(CASE WHEN op IN (3, 4) THEN seq END) OVER ({BEFORE}) AS prev_of_vm \
         FROM {src}), \
         cgpu_ends AS (SELECT vm, idx, at_ms FROM plan \
           WHERE op = 1 AND prev_of_cgpu IS NULL AND prev_vm_end IS NULL), \
         vm_ends AS (SELECT vm, at_ms FROM plan WHERE op = 3 AND prev_of_vm IS NULL)"
    )
}

/// `at_ms`, but never before `start`.
fn not_before(at: &str, start: &str) -> String {
    format!("CASE WHEN {at} IS NULL THEN NULL WHEN {at} > {start} THEN {at} ELSE {start} END")
}

/// The fold's writes, in their order, each over [`plan_cte`]'s names: the written cGPU spans
/// that end (at their cGPU's end, or else their VM's: one update, so no row is updated twice in
/// PostgreSQL's one statement), the written VM spans that end, the batch's spans.
fn fold_writes(src: &str) -> [String; 4] {
    let cgpu_end = not_before("x.at_ms", "cgpu_usage.start_ms");
    let vm_end = not_before("e.at_ms", "vm_usage.start_ms");
    let span_end = not_before("e.at_ms", "p.at_ms");
    [
        format!(
            "UPDATE cgpu_usage SET end_ms = {cgpu_end} \
             FROM (SELECT o.vm AS vm, o.idx AS idx, COALESCE(k.at_ms, v.at_ms) AS at_ms \
                   FROM (SELECT vm FROM cgpu_ends UNION SELECT vm FROM vm_ends) c \
                   JOIN cgpu_usage o ON o.vm = c.vm AND o.end_ms IS NULL \
                   LEFT JOIN cgpu_ends k ON k.vm = o.vm AND k.idx = o.idx \
                   LEFT JOIN vm_ends v ON v.vm = o.vm \
                   WHERE k.vm IS NOT NULL OR v.vm IS NOT NULL) x \
             WHERE cgpu_usage.vm = x.vm AND cgpu_usage.idx = x.idx AND cgpu_usage.end_ms IS NULL"
        ),
        format!(
            "UPDATE vm_usage SET end_ms = {vm_end} FROM vm_ends e \
             WHERE vm_usage.vm = e.vm AND vm_usage.end_ms IS NULL"
        ),
        format!(
            "INSERT INTO cgpu_usage \
               (project, vm, idx, gpu, model, mode, memory_mib, start_ms, end_ms) \
             SELECT p.project, p.vm, p.idx, p.gpu, p.model, p.mode, p.memory_mib, p.at_ms, \
                    {span_end} \
             FROM plan p LEFT JOIN {src} e ON e.seq = CASE \
                 WHEN p.next_of_cgpu IS NULL THEN p.next_vm_end \
                 WHEN p.next_vm_end IS NULL OR p.next_of_cgpu < p.next_vm_end THEN p.next_of_cgpu \
                 ELSE p.next_vm_end END \
             WHERE p.op = 2"
        ),
        format!(
            "INSERT INTO vm_usage (project, vm, name, start_ms, end_ms) \
             SELECT p.project, p.vm, p.name, p.at_ms, {span_end} \
             FROM plan p LEFT JOIN {src} e ON e.seq = p.next_of_vm WHERE p.op = 4"
        ),
    ]
}

impl Db {
    /// Folds every event logged so far into the spans, in one transaction that takes them out of
    /// the log (see the module docs), without reading them out of the database. Returns how many
    /// it folded.
    pub async fn fold_usage(&self) -> Result<u64, Error> {
        if self.backend() == Backend::Postgres {
            // One statement: what its DELETE takes is what it folds. The lock keeps a second
            // replica's fold from taking the events that the first's does not see yet (a span's
            // end before its start).
            let [cgpu_ends, vm_ends, cgpu_spans, vm_spans] = fold_writes("batch");
            let sql = format!(
                "WITH batch AS (DELETE FROM usage_events RETURNING *), {}, \
                   w1 AS ({cgpu_ends} RETURNING 1), w2 AS ({vm_ends} RETURNING 1), \
                   w3 AS ({cgpu_spans} RETURNING 1), w4 AS ({vm_spans} RETURNING 1) \
                 SELECT COUNT(*) FROM batch",
                plan_cte("batch")
            );
            let mut tx = self.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(FOLD_LOCK)
                .execute(&mut *tx)
                .await?;
            let folded: i64 = sqlx::query(&sql).fetch_one(&mut *tx).await?.try_get(0)?;
            tx.commit().await?;
            return Ok(folded as u64);
        }
        // SQLite: one connection, so nothing is logged between these statements.
        let mut tx = self.begin().await?;
        let logged: i64 = sqlx::query("SELECT COUNT(*) FROM usage_events")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        if logged == 0 {
            return Ok(0);
        }
        let with = format!("WITH {} ", plan_cte("usage_events"));
        for write in fold_writes("usage_events") {
            sqlx::query(&format!("{with}{write}")).execute(&mut *tx).await?;
        }
        sqlx::query("DELETE FROM usage_events").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(logged as u64)
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
