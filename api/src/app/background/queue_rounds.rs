//! Serving the queue: launches accepted with `queue: true` that did not fit wait as VMs in state
//! `queued`; attaches that did not fit wait beside them, their VM running as it is, and so do the
//! cGPUs a preemption took from a VM, to be given back (unless its launch said `give_back:
//! false`). Each round gives the waiting ones to the planner ([`gpgpums::queue::plan`]) and
//! starts what it decides, in one pool transaction; the VM's owner sees every attach that starts,
//! times out or is refused as an event on the VM.
//!
//! A round runs when capacity may have freed (a release, a detach, a host registering or
//! undrained, a quota raised) and on a timer, which also ends launches that waited past
//! `queue.queue_timeout_secs` (`error`, code [`QUEUE_TIMEOUT`]). It is a reconciler: no input,
//! idempotent, and safe on several replicas at once. The pool transaction serializes rounds, and
//! every VM write is conditional on the version read, so a queued VM terminated meanwhile is
//! never started: the round fails as a whole and the next one sees the queue without it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::queue::{plan, Ask, Books, Waiting};
use gpgpums::{ProjectId, TicketId, VmId};

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::bookings::{build_user_data, cgpu_record};
use crate::app::elastic::attach_host;
use crate::app::shared::{Extras, SagaStart, VmDetails};
pub use crate::app::shared::{QueueAndEvents, QueueEntry};
use crate::app::App;
use crate::config::Config;
use crate::db::{self, now_ms, Claim, VmWrite, Written};
use crate::error::Error;
use crate::model::{CgpuRecord, CgpuState, SagaStep, VmRecord, VmState};

/// The error code of a queued launch that waited too long (the start of its `error`).
pub const QUEUE_TIMEOUT: &str = "queue_timeout";

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRound {
    pub waiting: usize,
    /// Launches that start.
    pub started: Vec<VmId>,
    /// VMs that get cGPUs they waited for (asked for, or given back).
    pub attached: Vec<VmId>,
    pub timed_out: Vec<VmId>,
    pub refused: Vec<VmId>,
    /// Preemptible VMs whose cGPUs are being taken back.
    pub preempted: Vec<VmId>,
}

impl App {
    /// Asks for a round as soon as possible.
    pub fn trigger_queue(&self) {
        self.tasks.trigger(TaskName::QueueRounds);
    }

    /// One round; see the module docs.
    pub async fn serve_queue_once(self: &Arc<Self>) -> Result<QueueRound, Error> {
        // Most rounds find nothing: only a waiting queue is worth a pool transaction.
        let empty = self.db.queue_lengths().await?.is_empty();
        if empty {
            return Ok(QueueRound::default());
        }
        let now = now_ms();
        let settings = self.config.queue;
        let mut pool_tx = self.pool_tx().await?;
        let (pool, quotas, tx) = pool_tx.parts_with_quotas();
        let queued = tx.queued_vms().await?;
        let mut round = QueueRound { waiting: queued.len(), ..QueueRound::default() };
        let mut out = Outcome { now, ..Outcome::default() };
        let mut waiting = Vec::new();
        let mut by_ticket: HashMap<TicketId, &db::QueuedVm> = HashMap::new();
        for q in &queued {
            let attach = match &q.queued {
                db::Queued::Launch => None,
                db::Queued::Attach { attach, .. } => Some(attach),
            };
            if attach.is_some() && q.vm.state != VmState::Ready {
                // The VM ended (or failed): what it waited for goes with it.
                out.done.push(q.ticket);
                continue;
            }
            if q.deadline_ms.is_some_and(|deadline| deadline <= now) {
                let waited = (now - q.enqueued_ms) / 1000;
                let limit = settings.queue_timeout_secs;
                match attach {
                    None => out.end(
                        q,
                        format!(
                            "{QUEUE_TIMEOUT}: waited {waited} s for GPU capacity, longer than \
                             queue_timeout_secs ({limit})"
                        ),
                    ),
                    Some(attach) => {
                        let what = match q.queued {
                            db::Queued::Attach { give_back: true, .. } => "give-back",
                            _ => "attach",
                        };
                        out.event(
                            q,
                            QUEUE_TIMEOUT,
                            format!(
                                "the {what} of {} cGPU(s) waited {waited} s for GPU capacity, \
                                 longer than queue_timeout_secs ({limit}), and is cancelled",
                                attach.request.ncgpus
                            ),
                        )
                    }
                }
                round.timed_out.push(q.vm.id);
                continue;
            }
            if attach.is_some() && q.vm.step != SagaStep::Done {
                // It waits for the change under way to end.
                continue;
            }
            let project = ProjectId::new(&q.vm.project);
            // Only a running VM has a host its attaches are bound to.
            let on_host = if attach.is_some() { attach_host(&q.vm) } else { Ok(None) };
            let (Ok(project), Ok(on_host)) = (project, on_host) else {
                match attach {
                    None => out.end(q, "the VM's record is invalid (its project)".into()),
                    Some(_) => out.event(q, "attach_refused", "the VM's record is invalid".into()),
                }
                round.refused.push(q.vm.id);
                continue;
            };
            let (ask, mut request, policy, borrow) = match attach {
                None => {
                    let (request, policy) = (q.vm.spec.gpus.clone(), q.vm.policy.clone());
                    (Ask::Launch, request, policy, q.vm.spec.borrow)
                }
                Some(a) => (Ask::Attach { on_host }, a.request.clone(), a.policy.clone(), a.borrow),
            };
            let borrow = quotas.borrows(&project, borrow);
            // The VM's layer, whatever the waiting request says: one queued before layers were
            // told apart says none, and would take a GPU of any layer.
            request.constraints.remoting = Some(q.vm.spec.remoting());
            by_ticket.insert(q.ticket, q);
            waiting.push(Waiting {
                ticket: q.ticket,
                vm: q.vm.id,
                project,
                ask,
                request,
                policy,
                priority: q.priority,
                passed: q.passed,
                holding_since_ms: q.holding_since_ms,
                borrow,
            });
        }
        let mut vms_in_use = tx.counted_vms(None).await?;
        let preemptible = tx.preemptible_vms().await?;
        let reclaim_wait_ms = settings.reclaim_wait_secs.saturating_mul(1000) as i64;
        let reclaiming = tx.reclaiming_cgpus(now.saturating_sub(reclaim_wait_ms)).await?;
        // Loans are taken back only within a cohort: with none, the read is skipped.
        let loans = match quotas.cohorts().next() {
            Some(_) => tx.loans().await?,
            None => Vec::new(),
        };
        let rules = settings.rules();
        let planned = {
            let mut books = Books {
                pool: &mut *pool,
                quotas: &mut *quotas,
                vms_in_use: &mut vms_in_use,
                preemptible: &preemptible,
                reclaiming: &reclaiming,
                loans: &loans,
                now_ms: now,
            };
            plan(&mut books, &waiting, &rules)
        };

        let claim =
            Claim { owner: self.instance.clone(), now_ms: now, until_ms: now + self.lease_ms() };
        let masking = &self.config.masking;
        let mut started: Vec<SagaStart> = Vec::new();
        // How long each request that starts waited (observed once the round is committed).
        let mut waits: Vec<i64> = Vec::new();
        // Attaches that start, by VM: the VM as read, and each ticket's new cGPUs.
        let mut attaching: BTreeMap<VmId, (&VmRecord, Vec<Vec<CgpuRecord>>)> = BTreeMap::new();
        for s in &planned.started {
            let q = by_ticket[&s.ticket];
            let records = s.cgpus.iter().zip(&s.borrowed).map(|(c, &borrowed)| {
                let borrowed_ms = borrowed.then_some(now);
                cgpu_record(s.vm, c, masking).map(|record| CgpuRecord { borrowed_ms, ..record })
            });
            let records = records.collect::<Result<Vec<_>, Error>>();
            let waited = (now - q.enqueued_ms).max(0);
            match (&q.queued, records) {
                (db::Queued::Launch, records) => {
                    let mut vm = q.vm.clone();
                    vm.state = VmState::Creating;
                    vm.step = SagaStep::LAUNCH;
                    vm.policy = s.policy.clone();
                    vm.updated_ms = now;
                    let built = records.and_then(|cgpus| {
                        build_user_data(self, &vm, &cgpus).map(|data| (cgpus, data))
                    });
                    match built {
                        Ok((cgpus, user_data)) => {
                            out.writes.push(VmWrite { vm: vm.clone(), claim: Some(claim.clone()) });
                            out.new_cgpus.extend(cgpus.iter().cloned());
                            out.done.push(q.ticket);
                            let details = VmDetails { vm, cgpus, extras: Extras::Unknown };
                            started.push(SagaStart { details, user_data: Some(user_data) });
                            round.started.push(s.vm);
                        }
                        Err(e) => {
                            pool.release(&s.vm);
                            quotas.release(&s.vm);
                            out.end(q, e.to_string());
                            round.refused.push(s.vm);
                            continue;
                        }
                    }
                }
                (db::Queued::Attach { give_back, .. }, Ok(cgpus)) => {
                    let n = cgpus.len();
                    let (kind, detail) = if *give_back {
                        ("given_back", format!("{n} cGPU(s) given back after {} s", waited / 1000))
                    } else {
                        (
                            "attached",
                            format!(
                                "{n} cGPU(s) attached from the queue after waiting {} s",
                                waited / 1000
                            ),
                        )
                    };
                    out.event(q, kind, detail);
                    attaching.entry(s.vm).or_insert_with(|| (&q.vm, Vec::new())).1.push(cgpus);
                    round.attached.push(s.vm);
                }
                (db::Queued::Attach { .. }, Err(e)) => {
                    for cgpu in &s.cgpus {
                        pool.detach(&s.vm, cgpu.index);
                    }
                    quotas.refund(&s.vm, &pool.holding(&s.cgpus));
                    out.event(q, "attach_refused", e.to_string());
                    round.refused.push(s.vm);
                    continue;
                }
            }
            waits.push(waited);
        }
        let mut attached: Vec<VmDetails> = Vec::new();
        for (id, (vm, tickets)) in attaching {
            let mut cgpus = tx.cgpus_of(id).await?;
            let first_seq = cgpus.iter().map(|c| c.seq).max().map_or(1, |seq| seq + 1);
            for (seq, new) in (first_seq..).zip(tickets) {
                for mut cgpu in new {
                    cgpu.seq = seq;
                    cgpu.state = CgpuState::Attaching;
                    out.new_cgpus.push(cgpu.clone());
                    cgpus.push(cgpu);
                }
            }
            let vm =
                VmRecord { step: SagaStep::Attach, error: None, updated_ms: now, ..vm.clone() };
            out.writes.push(VmWrite { vm: vm.clone(), claim: Some(claim.clone()) });
            attached.push(VmDetails { vm, cgpus, extras: Extras::Unknown });
        }
        for (ticket, e) in &planned.refused {
            let q = by_ticket[ticket];
            let reason = Error::from(e.clone()).to_string();
            match q.queued {
                db::Queued::Launch => out.end(q, reason),
                db::Queued::Attach { .. } => out.event(q, "attach_refused", reason),
            }
            round.refused.push(q.vm.id);
        }
        tx.set_head(&planned.reset, planned.head.as_ref(), planned.awaiting_reclaim).await?;
        let Outcome { mut writes, new_cgpus, done, events, .. } = out;
        // The VMs whose sagas this round took: a saga another replica still holds (a change it
        // ended a moment ago and has not let go of) is resumed by that replica or the reconciler.
        let mut claimed: HashSet<VmId> = HashSet::new();
        if !writes.is_empty() {
            let written = tx.update_vms(&mut writes).await?;
            claimed = writes
                .iter()
                .zip(&written)
                .filter(|(_, w)| **w == Written::Done { claimed: true })
                .map(|(w, _)| w.vm.id)
                .collect();
            if written.contains(&Written::Stale) {
                // A VM changed meanwhile (terminated, or another change began): drop the round,
                // the next re-reads.
                return Err(Error::Conflict("a VM changed during the queue round".into()));
            }
            tx.insert_cgpus(&new_cgpus).await?;
        }
        tx.dequeue(&done).await?;
        for (vm, event) in &events {
            tx.insert_event(*vm, event).await?;
        }
        if let Some(preemption) = &planned.preemption {
            let give_back_deadline = self.queue_deadline(now);
            for shrink in &preemption.victims {
                let reclaims = preemption.reclaims_loans;
                let write =
                    shrink_vm(tx, shrink, &claim, now, give_back_deadline, reclaims).await?;
                writes.push(write);
                round.preempted.push(shrink.vm);
            }
        }
        pool_tx.commit().await?;
        for waited in waits {
            self.metrics.queue_wait_seconds.observe(waited as f64 / 1000.0);
        }
        for id in round.timed_out.iter().chain(&round.refused) {
            self.spawn_end_delegation(*id, None);
        }

        let versions: HashMap<VmId, i64> = writes.iter().map(|w| (w.vm.id, w.vm.version)).collect();
        for write in &writes {
            self.watchers.changed(&write.vm);
        }
        for id in &round.preempted {
            tracing::info!(vm = %id, "cGPUs taken back from a preemptible VM");
            self.spawn_saga(*id);
        }
        for mut start in started.into_iter().chain(attached.into_iter().map(SagaStart::from)) {
            let vm = &mut start.details.vm;
            vm.version = versions[&vm.id];
            tracing::info!(vm = %vm.id, step = vm.step.as_str(), "a queued request starts");
            let (id, ours) = (vm.id, claimed.contains(&vm.id));
            self.spawn_saga_from(id, ours.then_some(start));
        }
        Ok(round)
    }
}

/// Starts taking `shrink`'s cGPUs from its VM: the VM's detach step (claimed), its cGPUs
/// `detaching`, and an event for its owner. Any change of the VM since the plan read it fails the
/// round.
async fn shrink_vm(
    tx: &mut db::PoolChange,
    shrink: &gpgpums::queue::Shrink,
    claim: &Claim,
    now: i64,
    give_back_deadline_ms: Option<i64>,
    reclaims_loans: bool,
) -> Result<VmWrite, Error> {
    let changed = || Error::Conflict("a preemptible VM changed during the queue round".into());
    let mut vm = tx.vm(shrink.vm).await?.ok_or_else(changed)?;
    if vm.state != VmState::Ready || vm.step != SagaStep::Done {
        return Err(changed());
    }
    vm.step = SagaStep::Detach;
    vm.updated_ms = now;
    let mut write = [VmWrite { vm, claim: Some(claim.clone()) }];
    if tx.update_vms(&mut write).await?.first() == Some(&Written::Stale) {
        return Err(changed());
    }
    for cgpu in &shrink.cgpus {
        if !tx.reclaim_cgpu(shrink.vm, cgpu.index, now).await? {
            return Err(changed());
        }
    }
    let indexes: Vec<String> = shrink.cgpus.iter().map(|c| c.index.to_string()).collect();
    let vm = &write[0].vm;
    let after = if vm.spec.give_back {
        for (request, _) in shrink.give_back(&vm.spec.gpus.constraints, &vm.spec.gpus.network) {
            // A loan taken back is given back on loan again, whatever the VM's launch said.
            let borrow = if reclaims_loans { Some(true) } else { vm.spec.borrow };
            let policy = vm.policy.clone();
            let attach = Box::new(db::QueuedAttach { request, policy, borrow });
            let queued = db::Queued::Attach { attach, give_back: true };
            let ticket =
                db::NewTicket { vm, queued, now_ms: now, deadline_ms: give_back_deadline_ms };
            tx.enqueue(ticket).await?;
        }
        "they are given back when capacity returns"
    } else {
        "they are not given back (give_back is false)"
    };
    let (n, indexes) = (shrink.cgpus.len(), indexes.join(", "));
    let event = match reclaims_loans {
        false => db::VmEvent {
            at_ms: now,
            kind: "preempted".into(),
            detail: format!(
                "{n} cGPU(s) taken back (index {indexes}) for a request of higher priority, as \
                 this VM is preemptible; {after}"
            ),
        },
        true => db::VmEvent {
            at_ms: now,
            kind: "loan_reclaimed".into(),
            detail: format!(
                "{n} cGPU(s) on loan taken back (index {indexes}): a project of its cohort needs \
                 its own quota; {after}"
            ),
        },
    };
    tx.insert_event(shrink.vm, &event).await?;
    let [write] = write;
    Ok(write)
}

/// What a round writes besides the planner's bookings.
#[derive(Debug, Default)]
struct Outcome {
    now: i64,
    writes: Vec<VmWrite>,
    new_cgpus: Vec<CgpuRecord>,
    /// Tickets that leave the queue.
    done: Vec<TicketId>,
    events: Vec<(VmId, db::VmEvent)>,
}

impl Outcome {
    /// The queued launch ends in `error`.
    fn end(&mut self, q: &db::QueuedVm, error: String) {
        self.writes.push(ended(&q.vm, VmState::Error, error, self.now));
        self.done.push(q.ticket);
    }

    /// The attach leaves the queue, and its VM's owner is told why.
    fn event(&mut self, q: &db::QueuedVm, kind: &str, detail: String) {
        let event = db::VmEvent { at_ms: self.now, kind: kind.into(), detail };
        self.events.push((q.vm.id, event));
        self.done.push(q.ticket);
    }
}

/// The queued VM, ended in `state` with `error`.
pub(crate) fn ended(vm: &VmRecord, state: VmState, error: String, now: i64) -> VmWrite {
    let mut vm = vm.clone();
    vm.state = state;
    vm.error = Some(error);
    vm.step = SagaStep::Done;
    vm.updated_ms = now;
    VmWrite { vm, claim: None }
}

#[derive(Debug)]
pub(crate) struct QueueRounds;

#[async_trait]
impl Task for QueueRounds {
    fn name(&self) -> TaskName {
        TaskName::QueueRounds
    }
    fn describe(&self) -> &'static str {
        "Starts what waits in the queue when capacity frees; ends what waited too long."
    }
    fn period(&self, config: &Config) -> Duration {
        Duration::from_secs(config.queue.serve_interval_secs)
    }
    /// Requests wait on rounds (a queued launch starts in one).
    fn on_request_lane(&self) -> bool {
        true
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let round = app.serve_queue_once().await?;
        let report = Report::default().with("waiting", round.waiting);
        let report = report.with("started", round.started.len());
        let report = report.with("attached", round.attached.len());
        let report = report.with("timed_out", round.timed_out.len());
        let report = report.with("refused", round.refused.len());
        Ok(report.with("preempted", round.preempted.len()))
    }
}
