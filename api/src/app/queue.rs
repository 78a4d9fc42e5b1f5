//! Serving the queue: launches accepted with `queue: true` that did not fit wait as VMs in state
//! `queued`; each round gives the waiting ones to the planner ([`gpgpums::queue::plan`]) and
//! starts what it decides, in one pool transaction.
//!
//! A round runs when capacity may have freed (a release, a detach, a host registering or
//! undrained, a quota raised) and on a timer, which also ends launches that waited past
//! `queue.queue_timeout_secs` (`error`, code [`QUEUE_TIMEOUT`]). It is a reconciler: no input,
//! idempotent, and safe on several replicas at once. The pool transaction serializes rounds, and
//! every VM write is conditional on the version read, so a queued VM terminated meanwhile is
//! never started: the round fails as a whole and the next one sees the queue without it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpgpums::queue::{plan, Ask, Books, Rules, Waiting};
use gpgpums::{ProjectId, VmId};
use tokio::sync::Notify;

use super::bookings::{cgpu_record, check_user_data};
use super::vms::VmDetails;
use super::App;
use crate::db::{self, now_ms, Claim, VmWrite, Written};
use crate::error::{Error, ErrorChain};
use crate::model::{CgpuRecord, CgpuState, SagaStep, VmRecord, VmState};

/// The error code of a queued launch that waited too long (the start of its `error`).
pub const QUEUE_TIMEOUT: &str = "queue_timeout";

#[derive(Debug, Default)]
pub(crate) struct QueueServer {
    trigger: Notify,
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRound {
    pub waiting: usize,
    pub started: Vec<VmId>,
    pub timed_out: Vec<VmId>,
    pub refused: Vec<VmId>,
    /// Preemptible VMs whose cGPUs are being taken back.
    pub preempted: Vec<VmId>,
}

impl App {
    /// Asks for a round as soon as possible.
    pub fn trigger_queue(&self) {
        self.queue.trigger.notify_one();
    }

    /// Serves the queue forever: on every trigger and every `queue.serve_interval_secs`.
    pub fn spawn_queue_server(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let app = self.clone();
        tokio::spawn(async move {
            let interval = Duration::from_secs(app.config.queue.serve_interval_secs);
            loop {
                if let Err(e) = app.serve_queue_once().await {
                    tracing::warn!(error = %ErrorChain(&e), "queue round");
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = app.queue.trigger.notified() => {}
                }
            }
        })
    }

    /// One round; see the module docs.
    pub async fn serve_queue_once(self: &Arc<Self>) -> Result<QueueRound, Error> {
        // Most rounds find nothing: only a waiting queue is worth a pool transaction.
        let empty = db::queue_lengths(&mut *self.db.conn().await?).await?.is_empty();
        if empty {
            return Ok(QueueRound::default());
        }
        let now = now_ms();
        let settings = self.config.queue;
        let mut pool_tx = self.pool_tx().await?;
        let (pool, quotas, tx) = pool_tx.parts_with_quotas();
        let queued = db::queued_vms(tx).await?;
        let mut round = QueueRound { waiting: queued.len(), ..QueueRound::default() };
        let mut writes: Vec<VmWrite> = Vec::new();
        let mut waiting = Vec::new();
        let mut by_vm: HashMap<VmId, &db::QueuedVm> = HashMap::new();
        for q in &queued {
            if q.deadline_ms.is_some_and(|deadline| deadline <= now) {
                let waited = (now - q.enqueued_ms) / 1000;
                writes.push(ended(
                    &q.vm,
                    VmState::Error,
                    format!(
                        "{QUEUE_TIMEOUT}: waited {waited} s for GPU capacity, longer than \
                         queue_timeout_secs ({})",
                        settings.queue_timeout_secs
                    ),
                    now,
                ));
                round.timed_out.push(q.vm.id);
                continue;
            }
            let Ok(project) = ProjectId::new(&q.vm.project) else {
                writes.push(ended(&q.vm, VmState::Error, "invalid project".into(), now));
                round.refused.push(q.vm.id);
                continue;
            };
            by_vm.insert(q.vm.id, q);
            waiting.push(Waiting {
                ticket: q.ticket,
                vm: q.vm.id,
                project,
                ask: Ask::Launch,
                request: q.vm.spec.gpus.clone(),
                policy: q.vm.policy.clone(),
                priority: q.vm.spec.priority,
                passed: q.passed,
            });
        }
        let mut vms_in_use = db::counted_vms(tx, None).await?;
        let preemptible = db::preemptible_vms(tx).await?;
        let reclaiming = db::detaching_cgpus(tx).await?;
        let rules = Rules {
            backfill: settings.backfill,
            max_passes: settings.max_passes,
            preemption: settings.preemption,
        };
        let planned = {
            let mut books = Books {
                pool: &mut *pool,
                quotas: &mut *quotas,
                vms_in_use: &mut vms_in_use,
                preemptible: &preemptible,
                reclaiming: &reclaiming,
            };
            plan(&mut books, &waiting, &rules)
        };

        let claim =
            Claim { owner: self.instance.clone(), now_ms: now, until_ms: now + self.lease_ms() };
        let mut started: Vec<VmDetails> = Vec::new();
        let mut new_cgpus: Vec<CgpuRecord> = Vec::new();
        for s in &planned.started {
            let q = by_vm[&s.vm];
            let mut vm = q.vm.clone();
            vm.state = VmState::Creating;
            vm.step = SagaStep::CreateVm;
            vm.policy = s.policy.clone();
            vm.updated_ms = now;
            let cgpus = s
                .cgpus
                .iter()
                .map(|c| cgpu_record(vm.id, c, &self.config.masking))
                .collect::<Result<Vec<_>, Error>>()
                .and_then(|cgpus| {
                    check_user_data(&vm, &cgpus, &self.config.masking).map(|()| cgpus)
                });
            match cgpus {
                Ok(cgpus) => {
                    writes.push(VmWrite { vm: vm.clone(), claim: Some(claim.clone()) });
                    new_cgpus.extend(cgpus.iter().cloned());
                    started.push(VmDetails { vm, cgpus });
                    round.started.push(s.vm);
                    let waited = (now - q.enqueued_ms).max(0) as f64 / 1000.0;
                    self.metrics.queue_wait_seconds.observe(waited);
                }
                Err(e) => {
                    pool.release(&s.vm);
                    quotas.release(&s.vm);
                    writes.push(ended(&q.vm, VmState::Error, e.to_string(), now));
                    round.refused.push(s.vm);
                }
            }
        }
        for (ticket, e) in &planned.refused {
            if let Some(w) = waiting.iter().find(|w| w.ticket == *ticket) {
                writes.push(ended(
                    &by_vm[&w.vm].vm,
                    VmState::Error,
                    Error::from(e.clone()).to_string(),
                    now,
                ));
                round.refused.push(w.vm);
            }
        }
        if let Some((ticket, passed)) = planned.head {
            let unchanged = waiting.iter().any(|w| w.ticket == ticket && w.passed == passed);
            if !unchanged {
                db::set_passed(tx, ticket, passed).await?;
            }
        }
        if !writes.is_empty() {
            let written = db::update_vms(tx, &mut writes).await?;
            if written.contains(&Written::Stale) {
                // A queued VM changed meanwhile (terminated): drop the round, the next re-reads.
                return Err(Error::Conflict("a queued VM changed during the queue round".into()));
            }
            db::insert_cgpus(tx, &new_cgpus).await?;
            let done: Vec<VmId> = writes.iter().map(|w| w.vm.id).collect();
            db::dequeue(tx, &done).await?;
        }
        if let Some(preemption) = &planned.preemption {
            for shrink in &preemption.victims {
                writes.push(shrink_vm(tx, shrink, &claim, now).await?);
                round.preempted.push(shrink.vm);
            }
        }
        pool_tx.commit().await?;

        let versions: HashMap<VmId, i64> = writes.iter().map(|w| (w.vm.id, w.vm.version)).collect();
        for write in &writes {
            self.watchers.changed(&write.vm);
        }
        for id in &round.preempted {
            tracing::info!(vm = %id, "cGPUs taken back from a preemptible VM");
            self.spawn_saga(*id);
        }
        for mut details in started {
            details.vm.version = versions[&details.vm.id];
            tracing::info!(vm = %details.vm.id, "a queued launch starts");
            self.spawn_saga_from(details.vm.id, Some(details));
        }
        Ok(round)
    }

    /// The VM's place in the queue (1: next at its priority), if it is queued.
    pub async fn queue_position(&self, vm: VmId) -> Result<Option<u64>, Error> {
        db::queue_position(&mut *self.db.conn().await?, vm).await
    }

    /// The VM's events, oldest first.
    pub async fn vm_events(&self, vm: VmId) -> Result<Vec<db::VmEvent>, Error> {
        db::events_of(&mut *self.db.conn().await?, vm).await
    }

    /// Cancels a queued launch: the VM ends `deleted` and leaves the queue. `Stale`: it changed
    /// meanwhile (it started, or another termination won), and nothing was written.
    pub(crate) async fn cancel_queued(&self, vm: &VmRecord) -> Result<(VmRecord, Written), Error> {
        let mut tx = self.db.begin().await?;
        let mut write = [ended(vm, VmState::Deleted, String::new(), now_ms())];
        write[0].vm.error = None;
        let written = db::update_vms(&mut tx, &mut write).await?;
        let [VmWrite { vm: cancelled, .. }] = write;
        if written.first() == Some(&Written::Done { claimed: false }) {
            db::dequeue(&mut tx, &[vm.id]).await?;
            tx.commit().await?;
            self.watchers.changed(&cancelled);
            return Ok((cancelled, Written::Done { claimed: false }));
        }
        Ok((vm.clone(), Written::Stale))
    }
}

/// Starts taking `shrink`'s cGPUs from its VM: the VM's detach step (claimed), its cGPUs
/// `detaching`, and an event for its owner. Any change of the VM since the plan read it fails the
/// round.
async fn shrink_vm(
    tx: &mut sqlx::AnyConnection,
    shrink: &gpgpums::queue::Shrink,
    claim: &Claim,
    now: i64,
) -> Result<VmWrite, Error> {
    let changed = || Error::Conflict("a preemptible VM changed during the queue round".into());
    let mut vm = db::vm(tx, shrink.vm).await?.ok_or_else(changed)?;
    if vm.state != VmState::Ready || vm.step != SagaStep::Done {
        return Err(changed());
    }
    vm.step = SagaStep::DetachCgpus;
    vm.updated_ms = now;
    let mut write = [VmWrite { vm, claim: Some(claim.clone()) }];
    if db::update_vms(tx, &mut write).await?.first() == Some(&Written::Stale) {
        return Err(changed());
    }
    for cgpu in &shrink.cgpus {
        let moved = db::set_cgpu_states(
            tx,
            shrink.vm,
            Some(cgpu.index),
            CgpuState::Live,
            CgpuState::Detaching,
        )
        .await?;
        if moved != 1 {
            return Err(changed());
        }
    }
    let indexes: Vec<String> = shrink.cgpus.iter().map(|c| c.index.to_string()).collect();
    let event = db::VmEvent {
        at_ms: now,
        kind: "preempted".into(),
        detail: format!(
            "{} cGPU(s) taken back (index {}) for a request of higher priority; this VM is \
             preemptible",
            shrink.cgpus.len(),
            indexes.join(", ")
        ),
    };
    db::insert_event(tx, shrink.vm, &event).await?;
    let [write] = write;
    Ok(write)
}

/// The queued VM, ended in `state` with `error`.
fn ended(vm: &VmRecord, state: VmState, error: String, now: i64) -> VmWrite {
    let mut vm = vm.clone();
    vm.state = state;
    vm.error = Some(error);
    vm.step = SagaStep::Done;
    vm.updated_ms = now;
    VmWrite { vm, claim: None }
}
