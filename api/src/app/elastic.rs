//! cGPUs that come and go on a running VM (the dissertation's progressive attach, 5.2.2).
//!
//! A cGPU is one masked endpoint more or less on the VM's host, so nothing in the VM has to move:
//! - **attach** books the new cGPUs (`attaching`) and writes the VM's step `attach_cgpus` in one
//!   pool transaction, all or nothing; the saga step (`sagas/attach.rs`) pushes the host's table
//!   (which serves live and attaching cGPUs), then marks them live. If the push fails, the attach
//!   turns into a detach of the same cGPUs, and the VM's error says why;
//! - **detach** marks the cGPU `detaching` and writes the step `detach_cgpus` in one transaction;
//!   the saga step (`sagas/detach.rs`) pushes the table without it (the agent cuts open
//!   connections), then releases the booking in the same transaction that ends the step.
//!
//! Every write is conditional on the VM's version, like the launch saga's: one change at a time
//! per VM (another gets 409), and a termination arriving meanwhile takes over (its undo steps
//! withdraw and release every cGPU, whatever its state). The step is stored with the VM, so a
//! crash resumes it; pushing a whole table twice is harmless.
//!
//! A cGPU keeps its index, and so its masked port, for its whole life; the rCUDA environment lists
//! the live ones contiguously, in attach order (`seq`).

use std::sync::Arc;

use gpgpums::{Locality, Mode, Request, VmId};

use super::bookings::{Attachment, Booked, VM_CHANGED_CGPUS};
use super::fields::{check_text, FieldChecks};
use super::vms::{digest, Extras, VmDetails, MAX_NAME};
use super::App;
use crate::auth::Caller;
use crate::db::{now_ms, Claim, VmWrite};
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{CgpuState, SagaStep, VmRecord, VmState};
use crate::policy::actions;

/// An attach request, validated by the HTTP layer for shape.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AttachInput {
    pub ncgpus: u32,
    pub gpu_memory_mib: Option<u64>,
    pub mode: Mode,
    pub distinct_gpus: bool,
    pub policy: Option<String>,
    /// Wait in the queue when the GPUs are not there now.
    pub queue: bool,
    /// Each new cGPU's share of its GPU's SMs, percent (see [`Request::compute_percent`]).
    pub compute_percent: Option<u32>,
    /// Whether the new cGPUs may be borrowed past the project's quota; absent: its default.
    pub borrow: Option<bool>,
}

/// The VM's host, where cGPUs attached to it must be (a `local` VM's) or near which they must be
/// (a VM with a network constraint); `None`: anywhere, for the others.
pub(super) fn attach_host(vm: &VmRecord) -> Result<Option<gpgpums::HostId>, Error> {
    let anywhere = vm.spec.gpus.locality != Locality::Local && vm.spec.gpus.network.is_empty();
    if anywhere {
        return Ok(None);
    }
    vm.host
        .clone()
        .map(Some)
        .ok_or_else(|| Error::internal(format!("ready VM {} has no host recorded", vm.id)))
}

/// Why the VM cannot take an attach or detach now, if it cannot.
fn check_changeable(vm: &VmRecord) -> Result<(), Error> {
    match vm.state {
        VmState::Ready if vm.step == SagaStep::Done => Ok(()),
        VmState::Ready => Err(Error::Conflict(format!(
            "the VM's cGPUs are being changed ({}): wait until it settles, then retry",
            vm.step.as_str()
        ))),
        VmState::Deleting | VmState::Deleted => Err(Error::Conflict(format!(
            "the VM is {}: its cGPUs cannot change",
            vm.state.as_str()
        ))),
        state => Err(Error::Conflict(format!(
            "the VM is {}: cGPUs are attached and detached on ready VMs only",
            state.as_str()
        ))),
    }
}

impl App {
    fn claim_now(&self) -> Claim {
        let now = now_ms();
        Claim { owner: self.instance.clone(), now_ms: now, until_ms: now + self.lease_ms() }
    }

    /// Attaches cGPUs to a ready VM: see the module docs. Returns the VM as written (its new
    /// cGPUs `attaching`), or as it is for a retry with the same Idempotency-Key.
    pub async fn attach(
        self: &Arc<Self>,
        caller: &Caller,
        id: VmId,
        input: AttachInput,
        idempotency_key: Option<String>,
    ) -> Result<VmDetails, Error> {
        let details = self.visible_vm(caller, id, actions::CGPU_ATTACH).await?;
        let request_digest =
            digest(serde_json::to_string(&(id, &input)).expect("request serializes").as_bytes());
        if let Some(key) = &idempotency_key {
            check_text("Idempotency-Key", key, MAX_NAME)?;
            match self.earlier_attach(&details.vm.project, key, id, &request_digest).await? {
                Some(true) => return self.visible_vm(caller, id, actions::CGPU_ATTACH).await,
                Some(false) => {
                    return Err(Error::invalid(
                        "Idempotency-Key",
                        "was already used for a different attach request",
                    ))
                }
                None => {}
            }
        }
        let refused = |e: Error| {
            inc(&self.metrics.elastic.attaches_refused);
            e
        };
        let request = Request {
            ncgpus: input.ncgpus,
            gpu_memory_mib: input.gpu_memory_mib,
            mode: input.mode,
            locality: details.vm.spec.gpus.locality,
            distinct_gpus: input.distinct_gpus,
            // New cGPUs follow the VM's own constraints: the GPU its code was built for.
            constraints: details.vm.spec.gpus.constraints.clone(),
            // And its network: near the host it runs on.
            network: details.vm.spec.gpus.network.clone(),
            compute_percent: input.compute_percent,
            // A local VM that holds no cGPU now takes its CPU and memory again with the first.
            vm_resources: details.vm.spec.gpus.vm_resources,
        };
        let mut checks = FieldChecks::new();
        for (field, reason) in request.problems() {
            checks.fail(field, reason);
        }
        // What the VM's layer cannot do, before the attach may wait in the queue.
        let layer = details.vm.spec.remoting();
        if let Some(problem) = layer.attach_problem(details.cgpus.len(), input.ncgpus) {
            checks.fail("ncgpus", problem);
        }
        checks.finish().map_err(refused)?;
        check_changeable(&details.vm).map_err(refused)?;
        let VmDetails { vm, cgpus, .. } = details;
        let on_host = attach_host(&vm)?;
        let mut next = vm.clone();
        next.step = SagaStep::Attach;
        next.error = None;
        next.updated_ms = now_ms();
        let attachment = Attachment {
            vm: next,
            claim: self.claim_now(),
            request,
            policy: input.policy.clone().unwrap_or_else(|| vm.policy.clone()),
            on_host,
            seq: cgpus.iter().map(|c| c.seq).max().map_or(1, |seq| seq + 1),
            idempotency_key: idempotency_key.clone(),
            request_digest: request_digest.clone(),
            queue: input.queue,
            borrow: input.borrow,
        };
        let (written, added, claimed) = match self.book_attachment(attachment).await {
            Ok(Booked::Attached(written, added, claimed)) => (*written, added, claimed),
            Ok(Booked::AttachQueued(ticket)) => {
                inc(&self.metrics.elastic.attaches_queued);
                tracing::info!(vm = %id, ticket = ticket.0, "an attach waits in the queue");
                return Ok(VmDetails { vm, cgpus, extras: Extras::Unknown });
            }
            Ok(_) => return Err(Error::internal("an attachment answered as something else")),
            Err(Error::Conflict(_)) if idempotency_key.is_some() => {
                // A concurrent retry with the same key may have won the race.
                let key = idempotency_key.as_deref().unwrap_or_default();
                return match self.earlier_attach(&vm.project, key, id, &request_digest).await? {
                    Some(true) => self.visible_vm(caller, id, actions::CGPU_ATTACH).await,
                    _ => Err(refused(Error::Conflict(VM_CHANGED_CGPUS.into()))),
                };
            }
            Err(e) => return Err(refused(e)),
        };
        inc(&self.metrics.elastic.attaches_accepted);
        self.watchers.changed(&written);
        let mut all = cgpus;
        all.extend(added);
        let details = VmDetails { vm: written, cgpus: all, extras: Extras::Unknown };
        self.spawn_saga_from(id, claimed.then(|| details.clone().into()));
        Ok(details)
    }

    /// Whether an earlier attach took `key` in `project`: `Some(true)` for this same request to
    /// this VM, `Some(false)` for another.
    async fn earlier_attach(
        &self,
        project: &str,
        key: &str,
        id: VmId,
        request_digest: &str,
    ) -> Result<Option<bool>, Error> {
        let earlier = self.db.attach_by_idempotency_key(project, key).await?;
        Ok(earlier.map(|(vm, digest)| vm == id && digest == request_digest))
    }

    /// Detaches the VM's cGPU `index`: see the module docs. Returns the VM as written (the cGPU
    /// `detaching`); a cGPU already detaching is answered as it is.
    pub async fn detach(
        self: &Arc<Self>,
        caller: &Caller,
        id: VmId,
        index: u32,
    ) -> Result<VmDetails, Error> {
        let mut details = self.visible_vm(caller, id, actions::CGPU_DETACH).await?;
        let refused = |e: Error| {
            inc(&self.metrics.elastic.detaches_refused);
            e
        };
        let Some(at) = details.cgpus.iter().position(|c| c.index == index) else {
            return Err(refused(Error::NotFound { kind: "cGPU", id: index.to_string() }));
        };
        if details.cgpus[at].state == CgpuState::Detaching {
            return Ok(details);
        }
        check_changeable(&details.vm).map_err(refused)?;
        let mut write = [VmWrite {
            vm: VmRecord {
                step: SagaStep::Detach,
                error: None,
                updated_ms: now_ms(),
                ..details.vm.clone()
            },
            claim: Some(self.claim_now()),
        }];
        // A lost cGPU (its GPU failed, nowhere to re-home it) is detached like a live one.
        let from = details.cgpus[at].state;
        let Some(claimed) = self.db.begin_detach(&mut write, index, from).await? else {
            return Err(refused(Error::Conflict(VM_CHANGED_CGPUS.into())));
        };
        inc(&self.metrics.elastic.detaches_accepted);
        let [VmWrite { vm, .. }] = write;
        self.watchers.changed(&vm);
        details.vm = vm;
        details.cgpus[at].state = CgpuState::Detaching;
        self.spawn_saga_from(id, claimed.then(|| details.clone().into()));
        Ok(details)
    }
}
