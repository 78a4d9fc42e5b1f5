//! The launch saga, and its undo steps, which also carry out terminations.
//!
//! Forward: create the VM (cloud-init with the rCUDA environment) -> wait for ACTIVE (learn host,
//! fixed IP, tap) -> concurrently wait for the VM's network and push the host's routes -> ready.
//! Undo: withdraw the routes -> delete the VM -> release the cGPUs. The reservation itself is made by
//! the launch request, before the saga starts.
//!
//! The next step is stored with the VM, and every write is conditional on the VM's version, so:
//! - a crash at any point resumes from the stored step when any gsaasd starts (or its lease runs
//!   out); each action treats "already done" as success (the cloud finds the server created for this
//!   VM, route tables are whole tables) and each undo treats "not found" as success;
//! - a termination arriving mid-launch changes the stored state; the saga notices at its next write
//!   (or is woken from a wait) and unwinds instead.
//!
//! A failed forward step turns into the undo steps with the VM in `error`. A failed undo step is
//! retried a few times, then left for the reconciler. A ready VM's attach and detach steps (see
//! [`super::elastic`]) run in the same loop, and are retried like undo steps.
//!
//! This module runs the steps (claim, lease, write, unwind); each saga's steps, with their undo
//! beside them, have a file: `launch.rs`, `attach.rs`, `detach.rs`, `terminate.rs` (the undo steps,
//! which carry out terminations and unwind failed launches).

mod attach;
mod detach;
mod launch;
mod terminate;

use std::sync::Arc;
use std::time::Duration;

use gpgpums::{HostId, VmId};
use tokio::sync::Notify;

use super::shared::SagaStart;
use super::{App, RunningSaga};
use crate::cloud::CloudError;
use crate::db::{self, now_ms, VmWrite, Written};
use crate::error::{Error, ErrorChain};
use crate::metrics::inc;
use crate::model::{CgpuRecord, LaunchStep, SagaStep, VmRecord, VmState};

const UNDO_ATTEMPTS: u32 = 5;

/// What a successful step leaves to record.
enum Progress {
    /// Write the VM before the next step.
    ToRecord,
    /// The step wrote the VM itself.
    Recorded,
    /// Go on without writing: the next step repeats this one's idempotent work after a crash.
    Unrecorded,
}

/// What the process that wrote a launch handed its saga, used by its first creation of the
/// server instead of reading or building it again (see [`SagaStart`]).
#[derive(Default)]
pub(super) struct Handed {
    pub cgpus: Option<Vec<CgpuRecord>>,
    pub user_data: Option<Vec<u8>>,
}

/// Why a step did not complete.
pub(crate) enum StepError {
    /// A termination arrived; reload and decide again.
    Interrupted,
    /// The step failed; the message goes into the VM's error.
    Failed(String),
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Failed(client_message(&e))
    }
}

impl From<db::Error> for StepError {
    fn from(e: db::Error) -> Self {
        Error::from(e).into()
    }
}

/// What a tenant may read about a failure: the error without internal sources, which go to the
/// log (an internal error is a bug or bad data: an operator needs its cause).
fn client_message(e: &Error) -> String {
    match e {
        Error::Internal(_) => {
            tracing::error!(error = %ErrorChain(e), "a saga step failed on an internal error");
            "internal error".into()
        }
        e => e.to_string(),
    }
}

pub(crate) fn cloud_failure(stage: &str, e: &CloudError) -> StepError {
    tracing::warn!(stage, error = %ErrorChain(e), "cloud step failed");
    StepError::Failed(format!("{stage}: {e}"))
}

impl App {
    pub(crate) fn lease_ms(&self) -> i64 {
        (self.config.launch.saga_lease_secs * 1000) as i64
    }

    /// Starts the VM's saga in this process unless it already runs here.
    pub(crate) fn spawn_saga(self: &Arc<Self>, id: VmId) {
        self.spawn_saga_from(id, None);
    }

    /// Starts the saga of a VM this process has just written and holds the claim of (a launch):
    /// the saga starts from `start` instead of claiming and reading it again.
    pub(crate) fn spawn_saga_from(self: &Arc<Self>, id: VmId, mut start: Option<SagaStart>) {
        let wake = {
            let mut running = self.sagas.running.lock().expect("running sagas");
            if let Some(saga) = running.get_mut(&id) {
                saga.again = true;
                return;
            }
            let wake = Arc::new(Notify::new());
            running.insert(id, RunningSaga { wake: wake.clone(), task: None, again: false });
            wake
        };
        let app = self.clone();
        let task = self.spawn_background(async move {
            let renew_every = Duration::from_millis((app.lease_ms() / 3).max(1) as u64);
            let renew = async {
                loop {
                    tokio::time::sleep(renew_every).await;
                    let now = now_ms();
                    // Renewed as it was claimed; a failed renewal is tried again next time.
                    let _ = app.db.claim_saga(id, &app.instance, now, now + app.lease_ms()).await;
                }
            };
            tokio::pin!(renew);
            let released = loop {
                let outcome = tokio::select! {
                    outcome = app.run_saga(id, &wake, start.take()) => outcome,
                    () = &mut renew => Ok(false),
                };
                let released = outcome.unwrap_or_else(|e| {
                    tracing::warn!(vm = %id, error = %ErrorChain(&e), "saga stopped; the reconciler resumes it");
                    false
                });
                let mut running = app.sagas.running.lock().expect("running sagas");
                match running.get_mut(&id) {
                    Some(saga) if saga.again => saga.again = false,
                    _ => {
                        running.remove(&id);
                        break released;
                    }
                }
            };
            app.sagas.tenant_tokens.lock().expect("tenant tokens").remove(&id);
            if !released {
                let _ = app.db.release_saga(id, &app.instance).await;
            }
        });
        if let Some(saga) = self.sagas.running.lock().expect("running sagas").get_mut(&id) {
            saga.task = Some(task.abort_handle());
        }
    }

    /// Wakes the VM's saga if it waits in this process (a termination arrived).
    pub(crate) fn wake_saga(&self, id: VmId) {
        if let Some(saga) = self.sagas.running.lock().expect("running sagas").get(&id) {
            saga.wake.notify_one();
        }
    }

    /// Runs the saga to its end (or until an undo step keeps failing).
    ///
    /// The VM is claimed and read from the database when the saga starts (unless the launch hands
    /// it over) and whenever a write finds it changed (a termination) or a step was interrupted;
    /// after a successful write the in-memory copy is current (every write is conditional on the
    /// version), so the next step runs without re-reading it. The lease is kept by the renewal task
    /// in [`App::spawn_saga`]. Returns whether the saga ended with a write that released the lease.
    ///
    /// Progress is written when the next step needs it durable: the host and `routes_on` (with the
    /// server id) before routes are pushed (the push reads them), and the end. The server's
    /// creation is not recorded by itself: the cloud finds the server it created for a VM, so a
    /// creation repeated after a crash, or a deletion that finds no recorded id, gets the same
    /// server. What the cloud's check resolved is the launch's stored parameter
    /// (`LaunchSpec::resolved`, written with the launch), so every creation uses it as it is; only
    /// the first attempt, made by the process that wrote the launch, skips the search for an
    /// earlier server. The tenant's token is the one thing kept in memory only (a secret is never
    /// stored): elsewhere the launch's delegation stands for it. The undo steps
    /// are idempotent too, so withdrawing routes and deleting the server are not recorded one by
    /// one: the release of the cGPUs records the end in its own transaction, and a crash before it
    /// repeats the undo from the recorded step.
    async fn run_saga(
        self: &Arc<Self>,
        id: VmId,
        wake: &Notify,
        start: Option<SagaStart>,
    ) -> Result<bool, Error> {
        let mut undo_failures = 0u32;
        // The VM as of our last successful write (or the undo steps since): current unless someone
        // else wrote since.
        let mut current: Option<VmRecord> = None;
        // Its cGPUs, and the cloud-init built for them, when the launch handed them over (they
        // do not change during a saga).
        let mut handed = Handed::default();
        // Where the undo steps' withdrawal could not be confirmed (see [`super::fences`]).
        let mut fence_on: Option<HostId> = None;
        // Whether the server's creation, if this run makes it, is the launch's first: the launch
        // (or the queue's round that placed it) just wrote the VM as ours at its first step.
        let mut first_creation = false;
        if let Some(SagaStart { details, user_data }) = start {
            first_creation = details.vm.step == SagaStep::LAUNCH;
            current = Some(details.vm);
            handed = Handed { cgpus: Some(details.cgpus), user_data };
        }
        loop {
            // Ours when it comes from our own write: a write that ends the saga releases the lease.
            let written_by_us = current.is_some();
            let mut vm = match current.take() {
                Some(vm) => vm,
                None => {
                    // Someone else may have written it, even tried its creation: no shortcuts.
                    first_creation = false;
                    let now = now_ms();
                    let claimed =
                        self.db.claim_saga(id, &self.instance, now, now + self.lease_ms()).await?;
                    if !claimed {
                        return Ok(false);
                    }
                    let Some(vm) = self.db.vm(id).await? else { return Ok(false) };
                    vm
                }
            };
            if vm.step == SagaStep::Done {
                return Ok(written_by_us);
            }
            if vm.state == VmState::Deleting && !vm.step.is_unwinding() {
                // Routes off in the same write (the withdraw step then only pushes).
                vm.step = SagaStep::TERMINATE;
                vm.routes_on = false;
                if self.save(&mut vm).await? {
                    current = Some(vm);
                }
                continue;
            }
            let step = vm.step;
            let outcome =
                self.run_step(&mut vm, &mut handed, &mut first_creation, &mut fence_on, wake).await;
            match outcome {
                Ok(Progress::Unrecorded) => current = Some(vm),
                Ok(Progress::Recorded) => current = Some(vm),
                Ok(Progress::ToRecord) => {
                    if !self.save(&mut vm).await? {
                        continue;
                    }
                    if step == SagaStep::Launch(LaunchStep::ConfigureRoutes)
                        && vm.state == VmState::Ready
                    {
                        inc(&self.metrics.launches_ready);
                        self.metrics.observe_launch(&vm.timings);
                    }
                    current = Some(vm);
                }
                Err(StepError::Interrupted) => continue,
                // An attach or detach is retried like an undo step: a failed push to the agent is
                // handled inside the attach step, so what fails here is storage.
                Err(StepError::Failed(reason)) if !step.is_unwinding() && !step.changes_cgpus() => {
                    tracing::info!(vm = %id, ?step, reason, "launch failed; unwinding");
                    inc(&self.metrics.launches_failed);
                    if vm.state != VmState::Deleting {
                        vm.state = VmState::Error;
                        vm.error = Some(self.tenant_message(&reason).await);
                    }
                    vm.step = SagaStep::TERMINATE;
                    if self.save(&mut vm).await? {
                        current = Some(vm);
                    }
                }
                Err(StepError::Failed(reason)) => {
                    undo_failures += 1;
                    tracing::warn!(vm = %id, ?step, reason, attempt = undo_failures, "undo step failed");
                    if undo_failures >= UNDO_ATTEMPTS {
                        return Err(Error::unavailable("cloud or host agent", reason));
                    }
                    // Retry from the recorded step, reading the VM again.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100 << undo_failures)) => {}
                        _ = wake.notified() => {}
                    }
                }
            }
        }
    }

    /// Writes the VM if nobody changed it meanwhile; false means reload and decide again.
    async fn save(&self, vm: &mut VmRecord) -> Result<bool, Error> {
        vm.updated_ms = now_ms();
        let (written_vm, written) = self.write_vm(VmWrite { vm: vm.clone(), claim: None }).await?;
        if written == Written::Stale {
            return Ok(false);
        }
        *vm = written_vm;
        self.watchers.changed_alone(vm);
        Ok(true)
    }

    async fn run_step(
        self: &Arc<Self>,
        vm: &mut VmRecord,
        handed: &mut Handed,
        first_creation: &mut bool,
        fence_on: &mut Option<HostId>,
        wake: &Notify,
    ) -> Result<Progress, StepError> {
        match vm.step {
            SagaStep::Launch(step) => {
                self.launch_step(step, vm, handed, first_creation, wake).await
            }
            SagaStep::Attach => self.attach_step(vm).await,
            SagaStep::Detach => self.detach_step(vm).await,
            SagaStep::Terminate(step) => self.terminate_step(step, vm, fence_on).await,
            SagaStep::Done => Ok(Progress::ToRecord),
        }
    }
}
