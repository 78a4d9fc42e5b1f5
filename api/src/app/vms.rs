//! Launch and terminate as requests: check, reserve, record, and hand the rest to the saga.
//!
//! A launch does everything that can refuse the request before answering: validation, the cloud's
//! check of the VM part, and the atomic reservation of every cGPU with its masked endpoint. A refused
//! request changes nothing. What follows (creating the VM, waiting for it, routes) runs in the saga,
//! and the client follows the VM's state.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use gpgpums::VmId;

use super::batch::{fail_all, Queued};
use super::bookings::Reservation;
use super::fields::{check_text, FieldChecks};
use super::pool::BoxFuture;
pub use super::shared::{gpu_env, vm_user_data, Extras, ViewVersions, VmDetails};
use super::App;
use crate::auth::Caller;
use crate::cloud::{CloudError, TenantToken};
use crate::db::{self, now_ms, VmWrite, Written};
use crate::error::{Error, ErrorChain, FieldError};
use crate::metrics::inc;
use crate::model::{CgpuRecord, LaunchSpec, SagaStep, Timings, VmRecord, VmState};
use crate::policy::{actions, Action, Target};

/// A launch request, validated by the HTTP layer for shape.
#[derive(Debug, Clone)]
pub struct LaunchInput {
    pub spec: LaunchSpec,
    pub policy: Option<String>,
    pub idempotency_key: Option<String>,
    /// The tenant's own cloud credential (its Keystone token): a cloud that needs one creates
    /// the VM with it, in the tenant's project.
    pub tenant: Option<TenantToken>,
    /// Wait in the queue rather than fail when the GPUs are not there now.
    pub queue: bool,
}

/// The longest name (of the VM, an image, a flavor, a network) a launch may give, in characters
/// (Nova's limit for names).
pub const MAX_NAME: usize = 255;
/// The most networks a launch may name.
pub const MAX_NETWORKS: usize = 16;
/// The longest user_data a launch may carry, in bytes (with GSaaS's part it must still fit the
/// cloud's limit).
pub const MAX_USER_DATA: usize = 64 * 1024;

/// Everything wrong with a launch on its own, every field at once, its placement policy's name
/// included: all of it is refused before capacity or the queue is looked at (an unknown policy
/// was a 507 while the queue held).
fn problems(spec: &LaunchSpec, policy: &str, max_priority: i32) -> FieldChecks {
    let mut checks = FieldChecks::new();
    if !spec.vm.name.is_empty() {
        checks.text("name", &spec.vm.name, MAX_NAME);
    }
    for (field, value) in [("image", &spec.vm.image), ("flavor", &spec.vm.flavor)] {
        if value.is_empty() {
            let why =
                format!("is required: this service names no default (launch.default_{field})");
            checks.fail(field, why);
        } else {
            checks.text(field, value, MAX_NAME);
        }
    }
    if spec.vm.networks.len() > MAX_NETWORKS {
        checks.fail("networks", format!("at most {MAX_NETWORKS} networks"));
    }
    for (i, network) in spec.vm.networks.iter().enumerate() {
        checks.text(&format!("networks[{i}]"), network, MAX_NAME);
    }
    if let Some(user_data) = &spec.user_data {
        if user_data.len() > MAX_USER_DATA {
            checks.fail("user_data", format!("must be at most {MAX_USER_DATA} bytes"));
        }
    }
    for (field, reason) in spec.gpus.problems() {
        checks.fail(field, reason);
    }
    if !(0..=max_priority).contains(&spec.priority) {
        checks.fail("priority", format!("must be between 0 and {max_priority}"));
    }
    if let Err(gpgpums::Error::InvalidRequest { field, reason }) = POLICIES.resolve(policy) {
        checks.fail(field, reason);
    }
    checks
}

/// The placement policies a launch may name: gpgpums' built-in ones, which the pool places with.
static POLICIES: LazyLock<gpgpums::PolicyRegistry> =
    LazyLock::new(gpgpums::PolicyRegistry::builtin);

/// FNV-1a: a stable digest of a request, to recognise a retried launch.
pub(super) fn digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

pub(crate) fn cloud_error(e: CloudError) -> Error {
    match e {
        CloudError::Invalid { field, reason } => Error::invalid(field, reason),
        CloudError::Quota(reason) => Error::Conflict(format!("cloud quota exceeded: {reason}")),
        e => Error::unavailable("cloud", e),
    }
}

impl App {
    /// A launch that names no layer gets the service's, and keeps it for life; one that names no
    /// image or flavor, the service's (refused by [`problems`] when there is none).
    fn fill_defaults(&self, spec: &mut LaunchSpec) {
        spec.gpus.constraints.remoting.get_or_insert(self.config.remoting.default);
        let vm = &mut spec.vm;
        for (value, default) in [
            (&mut vm.image, &self.config.launch.default_image),
            (&mut vm.flavor, &self.config.launch.default_flavor),
        ] {
            if value.is_empty() {
                value.clone_from(default.as_ref().unwrap_or(&String::new()));
            }
        }
    }

    /// What is wrong with a launch's fields on their own (what [`App::launch`] refuses first): for
    /// a body whose other fields have type errors, so that one answer names them all.
    pub fn launch_problems(&self, mut spec: LaunchSpec, policy: Option<&str>) -> Vec<FieldError> {
        self.fill_defaults(&mut spec);
        let policy = policy.unwrap_or(&self.config.default_policy);
        problems(&spec, policy, self.config.queue.max_priority).into_errors()
    }

    /// Launches a VM: see the module docs. Returns the VM and whether this call created it (false
    /// for a retry with the same Idempotency-Key).
    pub async fn launch(
        self: &Arc<Self>,
        caller: &Caller,
        input: LaunchInput,
    ) -> Result<(VmDetails, bool), Error> {
        let received = Instant::now();
        let project = caller.tenant_project()?.to_owned();
        self.policy.authorize(actions::VM_CREATE, caller, Target::Project(&project))?;
        let policy = input.policy.clone().unwrap_or_else(|| self.config.default_policy.clone());
        // Over the request as received: a retry matches its first try whatever the service's
        // default layer is now.
        let request_digest = digest(
            serde_json::to_string(&(&input.spec, &policy)).expect("request serializes").as_bytes(),
        );
        let mut input = input;
        self.fill_defaults(&mut input.spec);
        problems(&input.spec, &policy, self.config.queue.max_priority).finish()?;
        if let Some(key) = &input.idempotency_key {
            check_text("Idempotency-Key", key, MAX_NAME)?;
            if let Some(existing) = self.replay(&project, key, &request_digest).await? {
                return Ok((existing, false));
            }
        }
        if self.cloud.needs_tenant_token() && input.tenant.is_none() {
            return Err(Error::invalid(
                "token",
                "VMs belong to a project of the cloud: launch with your Keystone token \
                 (X-Auth-Token), not a gsaasd token",
            ));
        }
        let checked =
            self.cloud.check(&input.spec.vm, input.tenant.as_ref()).await.map_err(|e| {
                inc(&self.metrics.launches_refused);
                cloud_error(e)
            })?;
        let check = received.elapsed().as_secs_f64();

        // Time-ordered (UUIDv7): VMs launched together sit together in the id indexes, so a batch
        // of launches writes a few index pages, not one page per VM.
        let id = VmId::from_uuid(uuid::Uuid::now_v7());
        let now = now_ms();
        // A launch that may wait is created as its tenant later, perhaps by another replica and
        // after its token expired: it delegates now (see `delegations`).
        let delegated = match &input.tenant {
            Some(tenant) if input.queue => {
                self.delegate_for_queue(id, tenant, now).await.inspect_err(|_| {
                    inc(&self.metrics.launches_refused);
                })?;
                true
            }
            _ => false,
        };
        let mut spec = input.spec.clone();
        // A local VM runs on its GPUs' host: the flavor's CPU and memory are booked there.
        if spec.gpus.locality == gpgpums::Locality::Local {
            spec.gpus.vm_resources = checked.flavor_resources;
            if let Some((_, why)) = checked.flavor_resources.and_then(|r| r.problem()) {
                inc(&self.metrics.launches_refused);
                if delegated {
                    self.spawn_end_delegation(id, input.tenant.clone());
                }
                return Err(Error::invalid("flavor", format!("a local VM's flavor: {why}")));
            }
        }
        if spec.vm.name.trim().is_empty() {
            spec.vm.name = format!("gsaas-{}", &id.to_string()[..8]);
        }
        // The saga's parameter: every creation of the server takes these ids, not the names.
        spec.resolved = Some(checked);
        let record = VmRecord {
            id,
            project: project.clone(),
            owner: caller.subject.clone(),
            name: spec.vm.name.clone(),
            spec,
            policy,
            state: VmState::Creating,
            error: None,
            step: SagaStep::LAUNCH,
            server_id: None,
            host: None,
            fixed_ip: None,
            tap: None,
            routes_on: false,
            timings: Timings { check: Some(check), ..Timings::default() },
            created_ms: now,
            updated_ms: now,
            version: 0,
            extras_version: 0,
        };
        let reservation = Reservation {
            record,
            idempotency_key: input.idempotency_key.clone(),
            request_digest: request_digest.clone(),
            queue: input.queue,
        };
        let start = match self.reserve(reservation).await {
            Ok(start) => start,
            Err(Error::Conflict(_)) if input.idempotency_key.is_some() => {
                // A concurrent retry with the same key won the race.
                if delegated {
                    self.spawn_end_delegation(id, input.tenant.clone());
                }
                let key = input.idempotency_key.as_deref().unwrap_or_default();
                return match self.replay(&project, key, &request_digest).await? {
                    Some(existing) => Ok((existing, false)),
                    None => Err(Error::Conflict(
                        "a concurrent launch with this Idempotency-Key failed".into(),
                    )),
                };
            }
            Err(e) => {
                inc(&self.metrics.launches_refused);
                if delegated {
                    self.spawn_end_delegation(id, input.tenant.clone());
                }
                return Err(e);
            }
        };
        inc(&self.metrics.launches_accepted);
        let details = start.details.clone();
        if details.vm.state == VmState::Queued {
            // The queue starts its saga when it places it; its delegation stands for the token.
            return Ok((details, true));
        }
        if delegated {
            self.spawn_end_delegation(id, input.tenant.clone());
        }
        if let Some(tenant) = input.tenant.clone() {
            self.sagas.tenant_tokens.lock().expect("tenant tokens").insert(id, tenant);
        }
        if let Some(seconds) = details.vm.timings.gpu_selection {
            self.metrics.decision_seconds.observe(seconds);
        }
        self.spawn_saga_from(id, Some(start));
        Ok((details, true))
    }

    /// The VM an earlier launch with `key` created, if the request is the same.
    async fn replay(
        &self,
        project: &str,
        key: &str,
        request_digest: &str,
    ) -> Result<Option<VmDetails>, Error> {
        let Some((id, stored_digest)) = self.db.vm_by_idempotency_key(project, key).await? else {
            return Ok(None);
        };
        if stored_digest != request_digest {
            return Err(Error::invalid(
                "Idempotency-Key",
                "was already used for a different launch request",
            ));
        }
        self.details(id).await
    }

    /// The VM with its cGPUs as stored, read in the next batch of reads.
    pub(crate) async fn details(&self, id: VmId) -> Result<Option<VmDetails>, Error> {
        self.batchers.vm_reads.submit(id).await.map(|details| details.map(|d| *d))
    }

    /// A VM the policy lets the caller take `action` on (by default: its project's, or any for
    /// admins). One it may not see is "not found"; one it sees but may not act on, forbidden.
    pub async fn visible_vm(
        &self,
        caller: &Caller,
        id: VmId,
        action: Action,
    ) -> Result<VmDetails, Error> {
        let Some(details) = self.details(id).await? else {
            return Err(Error::vm_not_found(&id));
        };
        match self.policy.authorize(action, caller, Target::Project(&details.vm.project)) {
            Ok(()) => Ok(details),
            Err(Error::NotFound { .. }) => Err(Error::vm_not_found(&id)),
            Err(e) => Err(e),
        }
    }

    /// A page of the VMs `filter` shows, newest first: the caller's project's (an admin's: every
    /// project's, or `filter.project`'s), up to `limit` after the VM `marker`. A marker the
    /// caller may not see is refused as unknown.
    pub async fn list_vms(
        &self,
        caller: &Caller,
        mut filter: db::VmFilter<'_>,
        marker: Option<VmId>,
        limit: usize,
    ) -> Result<VmPage, Error> {
        let visible = self.policy.list_scope(caller, actions::VM_LIST, actions::VM_LIST_ALL)?;
        filter.project = visible.or(filter.project);
        let after = match marker {
            Some(marker) => match self.db.list_position(marker).await? {
                Some(p) if visible.is_none_or(|v| p.project == v) => Some(p),
                _ => {
                    return Err(Error::invalid(
                        "marker",
                        format!("no VM {marker} to continue after"),
                    ))
                }
            },
            None => None,
        };
        let mut vms: Vec<VmDetails> = self
            .db
            .vm_page(&filter, after.as_ref(), limit.saturating_add(1))
            .await?
            .into_iter()
            .map(|(vm, cgpus)| VmDetails { vm, cgpus, extras: Extras::Unknown })
            .collect();
        let more = vms.len() > limit;
        vms.truncate(limit);
        let ids: Vec<VmId> = vms.iter().map(|d| d.vm.id).collect();
        let extras = self.queue_and_events(&ids, LIST_EVENTS_PER_VM).await?;
        Ok(VmPage { vms, more, extras })
    }

    /// Terminates a VM (idempotent): withdraws its routes, deletes it, releases its cGPUs.
    pub async fn terminate(
        self: &Arc<Self>,
        caller: &Caller,
        id: VmId,
    ) -> Result<VmDetails, Error> {
        self.terminate_because(caller, id, None).await
    }

    /// [`App::terminate`], recording `reason` as the VM's error (a termination gsaasd starts
    /// itself, such as for a server deleted outside GSaaS).
    pub(crate) async fn terminate_because(
        self: &Arc<Self>,
        caller: &Caller,
        id: VmId,
        reason: Option<&str>,
    ) -> Result<VmDetails, Error> {
        loop {
            let mut details = self.visible_vm(caller, id, actions::VM_DELETE).await?;
            let vm = &mut details.vm;
            if vm.state == VmState::Queued {
                let (cancelled, written) = self.cancel_queued(vm).await?;
                if written != Written::Stale {
                    self.sagas.tenant_tokens.lock().expect("tenant tokens").remove(&id);
                    inc(&self.metrics.terminations);
                    inc(&self.metrics.terminations_done);
                    details.vm = cancelled;
                    return Ok(details);
                }
                continue;
            }
            if matches!(vm.state, VmState::Deleting | VmState::Deleted) {
                if vm.step != SagaStep::Done {
                    self.spawn_saga(id);
                }
                return Ok(details);
            }
            vm.state = VmState::Deleting;
            if let Some(reason) = reason {
                vm.error = Some(reason.to_owned());
            }
            if vm.step == SagaStep::Done {
                // Routes off in the same write; the saga's withdraw step then only pushes.
                vm.step = SagaStep::TERMINATE;
                vm.routes_on = false;
            }
            vm.updated_ms = now_ms();
            // One conditional write that also claims the saga if nobody runs it.
            let now = now_ms();
            let claim = db::Claim {
                owner: self.instance.clone(),
                now_ms: now,
                until_ms: now + self.lease_ms(),
            };
            // A read that found nothing queued: the write tells whether anything was since.
            let queue_empty_at = (details.extras != Extras::Unknown).then_some(vm.extras_version);
            let write = VmWrite { vm: vm.clone(), claim: Some(claim) };
            let (written_vm, written) = self.write_termination(write, queue_empty_at).await?;
            if let Written::Done { claimed } = written {
                *vm = written_vm;
                self.watchers.changed_alone(vm);
                inc(&self.metrics.terminations);
                self.wake_saga(id);
                self.spawn_saga_from(id, claimed.then(|| details.clone().into()));
                return Ok(details);
            }
        }
    }
}

/// A VM write waiting for its batch.
#[derive(Debug)]
pub(crate) struct BatchedVmWrite {
    write: VmWrite,
    /// A termination's: once written, what the VM waits for leaves the queue at once (a round
    /// would end it later, but until then it would count against its project's waiting
    /// requests and could hold others back as the queue's head).
    leaves_queue: bool,
    /// The `extras_version` at which a read found nothing queued for the VM: if the write finds
    /// it unchanged, nothing is, and the queue is left alone.
    queue_empty_at: Option<i64>,
}

/// Writes one batch of VM writes (the [`super::batch::Batcher`] task's work): one statement per
/// round, and a VM written twice in the batch has its second write in the next round; then what
/// the terminated VMs waited for leaves the queue, in one statement.
pub(crate) fn write_vms(
    app: Arc<App>,
    queued: Vec<Queued<BatchedVmWrite, (VmRecord, Written)>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut pending = queued;
        while !pending.is_empty() {
            let mut in_round = std::collections::HashSet::new();
            let (round, later): (Vec<_>, Vec<_>) =
                pending.into_iter().partition(|(op, _)| in_round.insert(op.write.vm.id));
            pending = later;
            let (ops, replies): (Vec<_>, Vec<_>) = round.into_iter().unzip();
            let leaving: Vec<(bool, Option<i64>)> =
                ops.iter().map(|op| (op.leaves_queue, op.queue_empty_at)).collect();
            let mut writes: Vec<VmWrite> = ops.into_iter().map(|op| op.write).collect();
            let outcome = async {
                let written = app.db.update_vms(&mut writes).await?;
                let terminated: Vec<VmId> = writes
                    .iter()
                    .zip(&written)
                    .zip(&leaving)
                    .filter(|((write, written), (leaves, queue_empty_at))| {
                        *leaves
                            && matches!(written, Written::Done { .. })
                            && *queue_empty_at != Some(write.vm.extras_version)
                    })
                    .map(|((write, _), _)| write.vm.id)
                    .collect();
                if !terminated.is_empty() {
                    if let Err(e) = app.db.dequeue_vms(&terminated).await {
                        // The VMs are written; a round takes their requests out later.
                        let error = ErrorChain(&e);
                        tracing::warn!(vms = terminated.len(), %error, "dequeueing terminated VMs");
                    }
                }
                Ok::<_, Error>(written)
            }
            .await;
            match outcome {
                Ok(written) => {
                    for ((write, reply), written) in writes.into_iter().zip(replies).zip(written) {
                        let _ = reply.send(Ok((write.vm, written)));
                    }
                }
                Err(e) => {
                    let failed = writes.into_iter().zip(replies).collect();
                    fail_all(failed, e);
                }
            }
        }
    })
}

/// The VMs' cGPUs as the reads of VMs last found them, each as of its VM's `cgpus_version`: a
/// read asks the database for a VM's cGPUs only when they changed since (see
/// [`db::vms_with_cgpus_by_id`]). A VM of 75 cGPUs polled every 20 ms otherwise read and
/// converted its 75 cGPUs on every poll. Bounded by the cGPUs it holds (a few hundred bytes
/// each): when full, it starts again empty.
#[derive(Debug, Default)]
pub(crate) struct ReadCgpus {
    held: Mutex<HeldCgpus>,
}

#[derive(Debug, Default)]
struct HeldCgpus {
    /// Each VM's cGPUs and the `cgpus_version` they are as of.
    by_vm: HashMap<VmId, (i64, Arc<[CgpuRecord]>)>,
    /// How many cGPUs `by_vm` holds in all.
    cgpus: usize,
}

/// The most cGPUs [`ReadCgpus`] holds.
const READ_CGPUS_KEPT: usize = 65_536;

impl ReadCgpus {
    /// Each VM with the `cgpus_version` its cGPUs are held as of (`None`: not held).
    fn versions_of(&self, vms: &[VmId]) -> Vec<(VmId, Option<i64>)> {
        let held = self.held.lock().expect("read cGPUs");
        vms.iter().map(|&vm| (vm, held.by_vm.get(&vm).map(|(version, _)| *version))).collect()
    }

    /// The VM's cGPUs as of `version` (held, or just read), keeping what was read.
    fn settle(
        &self,
        vm: &VmRecord,
        version: i64,
        read: Option<Vec<CgpuRecord>>,
    ) -> Option<Vec<CgpuRecord>> {
        let mut held = self.held.lock().expect("read cGPUs");
        let Some(read) = read else {
            let (held_version, cgpus) = held.by_vm.get(&vm.id)?;
            return (*held_version == version).then(|| cgpus.to_vec());
        };
        if let Some((_, gone)) = held.by_vm.remove(&vm.id) {
            held.cgpus -= gone.len();
        }
        if !read.is_empty() && vm.state != VmState::Deleted && read.len() <= READ_CGPUS_KEPT {
            if held.cgpus + read.len() > READ_CGPUS_KEPT {
                *held = HeldCgpus::default();
            }
            held.cgpus += read.len();
            held.by_vm.insert(vm.id, (version, read.as_slice().into()));
        }
        Some(read)
    }
}

/// Reads one batch of VMs (the [`super::batch::Batcher`] task's work), with their cGPUs from
/// [`ReadCgpus`] where they did not change.
pub(crate) fn read_vms(
    app: Arc<App>,
    queued: Vec<Queued<VmId, Option<Box<VmDetails>>>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut ids: Vec<VmId> = queued.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        let cache = &app.batchers.read_cgpus;
        let mut wanted = cache.versions_of(&ids);
        let found = async {
            let mut by_id = HashMap::with_capacity(wanted.len());
            // A VM whose held cGPUs were dropped since the read began is read again, whole (so
            // at most twice).
            while !wanted.is_empty() {
                let read = app.db.vms_with_cgpus_by_id(&wanted).await?;
                let mut again = Vec::new();
                for db::ReadVm { vm, cgpus, cgpus_version, extras } in read {
                    match cache.settle(&vm, cgpus_version, cgpus) {
                        Some(cgpus) => {
                            let extras = if extras {
                                Extras::Unknown
                            } else {
                                let versions =
                                    ViewVersions { vm: vm.version, cgpus: cgpus_version };
                                Extras::None { versions: Some(versions) }
                            };
                            by_id.insert(vm.id, VmDetails { vm, cgpus, extras });
                        }
                        None => again.push((vm.id, None)),
                    }
                }
                wanted = again;
            }
            Ok::<_, Error>(by_id)
        }
        .await;
        match found {
            Ok(mut by_id) => {
                let mut asked: HashMap<VmId, usize> = HashMap::new();
                for (id, _) in &queued {
                    *asked.entry(*id).or_default() += 1;
                }
                for (id, reply) in queued {
                    // The last caller asking for a VM takes it; the others get copies.
                    let left = asked.get_mut(&id).expect("counted above");
                    *left -= 1;
                    let details =
                        if *left == 0 { by_id.remove(&id) } else { by_id.get(&id).cloned() };
                    let _ = reply.send(Ok(details.map(Box::new)));
                }
            }
            Err(e) => fail_all(queued, e),
        }
    })
}

impl App {
    /// Writes the VM if nobody changed it since it was read (see [`db::update_vms`]), in the
    /// next batch. Returns the VM as written (its new version) or as given, and how it went.
    pub(crate) async fn write_vm(&self, write: VmWrite) -> Result<(VmRecord, Written), Error> {
        let write = BatchedVmWrite { write, leaves_queue: false, queue_empty_at: None };
        self.batchers.vm_writes.submit(write).await
    }

    /// [`Self::write_vm`] for a termination: once written, what the VM waits for leaves the
    /// queue (see [`BatchedVmWrite::queue_empty_at`]).
    async fn write_termination(
        &self,
        write: VmWrite,
        queue_empty_at: Option<i64>,
    ) -> Result<(VmRecord, Written), Error> {
        let write = BatchedVmWrite { write, leaves_queue: true, queue_empty_at };
        self.batchers.vm_writes.submit(write).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stable_and_differ() {
        assert_eq!(digest(b"abc"), digest(b"abc"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
        assert_eq!(digest(b""), "cbf29ce484222325");
    }
}

/// How many of each VM's events a list shows (one VM's view shows more).
const LIST_EVENTS_PER_VM: usize = 20;

/// A page of VMs (see [`App::list_vms`]).
#[derive(Debug)]
pub struct VmPage {
    pub vms: Vec<VmDetails>,
    /// More VMs follow the last of `vms`.
    pub more: bool,
    /// What they wait for in the queue, and their latest events.
    pub extras: super::shared::QueueAndEvents,
}
