//! Reservations and releases of cGPUs, written in batches (see [`super::batch`]).
//!
//! A reservation decides on the in-memory pool (gpgpums) and records the VM with its cGPUs; a
//! release records the end of a VM's saga and frees its cGPUs. Both change bookings, so both run in
//! a pool transaction ([`super::pool`]): batched, one transaction carries every reservation and
//! release queued meanwhile, with one statement per table. Releases go first, so they make room for
//! the reservations beside them. One operation's refusal (no capacity, a VM changed meanwhile)
//! does not fail the others. If the batch's writes fail as a whole (an Idempotency-Key taken by a
//! concurrent launch), each operation is tried again alone, so one caller's conflict is nobody
//! else's.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use std::collections::HashMap;

use gpgpums::{Pool, ProjectId, QuotaLedger, Refusal, Shortfall, Usage};

use super::batch::Queued;
use super::fences;
use super::pool::BoxFuture;
use super::shared::{vm_user_data, Extras, SagaStart, VmDetails, MAX_DELEGATED_WAIT};
use super::App;
use crate::config::MaskingConfig;
use crate::db::{self, now_ms, NewVm, VmWrite, Written};
use crate::error::Error;
use crate::model::{CgpuRecord, CgpuState, SagaStep, VmRecord, VmState};

/// The reason of the conflict that refuses a release whose VM changed meanwhile.
pub(crate) const VM_CHANGED: &str = "the VM changed during its release";

/// A launch to reserve cGPUs for and record.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    /// The VM as it is recorded; `policy` is the requested one until the placement names it.
    pub record: VmRecord,
    pub idempotency_key: Option<String>,
    pub request_digest: String,
    /// Wait in the queue (state `queued`) rather than fail for want of capacity.
    pub queue: bool,
}

#[derive(Debug, Clone)]
pub(crate) enum Booking {
    Reserve(Box<Reservation>),
    /// Release the VM's cGPUs and write `ended`, the VM at the end of its saga, unless the VM
    /// changed since `ended` was read (then a conflict with [`VM_CHANGED`]).
    Release(Box<Ending>),
    /// Book more cGPUs for a running VM (see [`super::elastic`]).
    Attach(Box<Attachment>),
    /// Release the VM's `detaching` cGPUs and write `ended`, unless the VM changed since `ended`
    /// was read (then a conflict with [`VM_CHANGED`]).
    Detach(Box<Ending>),
}

/// The end of a saga or of a detach: the VM to write, and where its cGPUs' routes may still be
/// live (`fence_on`: that host's agent could not confirm them withdrawn), in which case their
/// bookings go to a fence instead of being released (see [`super::fences`]).
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    pub ended: VmRecord,
    pub fence_on: Option<gpgpums::HostId>,
}

#[derive(Debug)]
pub(crate) enum Booked {
    /// The VM as written, with the cloud-init its placement built (none when it waits).
    Reserved(Box<SagaStart>),
    /// The VM as written, and whether requests wait in the queue (the freed room may serve
    /// them).
    Released(Box<VmRecord>, bool),
    /// The VM as written, its new cGPUs, and whether the write claimed its saga.
    Attached(Box<VmRecord>, Vec<CgpuRecord>, bool),
    /// The attach waits in the queue, with this ticket; the VM is as it was.
    AttachQueued(gpgpums::TicketId),
}

/// cGPUs to book for a running VM, with the VM's write that starts their saga step.
#[derive(Debug, Clone)]
pub(crate) struct Attachment {
    /// The VM as read, with its step set to attach: written if nobody changed it meanwhile.
    pub vm: VmRecord,
    pub claim: db::Claim,
    pub request: gpgpums::Request,
    pub policy: String,
    /// Where the new cGPUs must be (a `local` VM's host).
    pub on_host: Option<gpgpums::HostId>,
    /// Their attach order, after every cGPU the VM holds.
    pub seq: i64,
    pub idempotency_key: Option<String>,
    pub request_digest: String,
    /// Wait in the queue rather than fail for want of capacity.
    pub queue: bool,
    /// Whether the new cGPUs may be borrowed past the project's quota (absent: its default).
    pub borrow: Option<bool>,
}

/// Writes one batch of bookings (the [`super::batch::Batcher`] task's work).
pub(crate) fn write_bookings(
    app: Arc<App>,
    queued: Vec<Queued<Booking, Booked>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let (bookings, replies): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
        match app.apply_bookings(&bookings).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(outcome);
                }
            }
            Err(e) if bookings.len() == 1 => {
                let _ = replies.into_iter().next().expect("one reply").send(Err(e));
            }
            Err(e) => {
                tracing::debug!(error = %e, size = bookings.len(), "batch of bookings failed; one at a time");
                for (booking, reply) in bookings.into_iter().zip(replies) {
                    let outcome = app
                        .apply_bookings(std::slice::from_ref(&booking))
                        .await
                        .and_then(|outcomes| outcomes.into_iter().next().expect("one outcome"));
                    let _ = reply.send(outcome);
                }
            }
        }
    })
}

impl App {
    /// Reserves the launch's cGPUs and records its VM, in the next batch.
    pub(crate) async fn reserve(&self, reservation: Reservation) -> Result<SagaStart, Error> {
        match self.batchers.bookings.submit(Booking::Reserve(Box::new(reservation))).await? {
            Booked::Reserved(start) => Ok(*start),
            _ => Err(Error::internal("a reservation answered as something else")),
        }
    }

    /// Releases (or fences) the VM's cGPUs and writes the VM, in the next batch (see
    /// [`Booking::Release`]).
    pub(crate) async fn release(&self, ending: Ending) -> Result<VmRecord, Error> {
        match self.batchers.bookings.submit(Booking::Release(Box::new(ending))).await? {
            Booked::Released(ended, queue_waits) => {
                if queue_waits {
                    self.trigger_queue();
                }
                Ok(*ended)
            }
            _ => Err(Error::internal("a release answered as something else")),
        }
    }

    /// Books the attachment's cGPUs and writes its VM, or queues it, in the next batch.
    pub(crate) async fn book_attachment(&self, attachment: Attachment) -> Result<Booked, Error> {
        match self.batchers.bookings.submit(Booking::Attach(Box::new(attachment))).await? {
            booked @ (Booked::Attached(..) | Booked::AttachQueued(_)) => Ok(booked),
            _ => Err(Error::internal("an attachment answered as something else")),
        }
    }

    /// When a request queued at `now` ends with `queue_timeout`; `None`: never. On a cloud that
    /// creates servers as their tenant a launch waits on a trust, and every trust ends: there it
    /// is at most [`MAX_DELEGATED_WAIT`] away.
    pub(crate) fn queue_deadline(&self, now: i64) -> Option<i64> {
        let timeout_secs = self.config.queue.queue_timeout_secs;
        let timeout_ms = (timeout_secs > 0).then(|| timeout_secs as i64 * 1000);
        let delegated_ms =
            self.cloud.needs_tenant_token().then(|| MAX_DELEGATED_WAIT.as_millis() as i64);
        [timeout_ms, delegated_ms].into_iter().flatten().min().map(|ms| now + ms)
    }

    /// Releases the VM's `detaching` cGPUs and writes `ended`, in the next batch (see
    /// [`Booking::Detach`]).
    pub(crate) async fn release_detached(&self, ending: Ending) -> Result<VmRecord, Error> {
        match self.batchers.bookings.submit(Booking::Detach(Box::new(ending))).await? {
            Booked::Released(ended, queue_waits) => {
                if queue_waits {
                    self.trigger_queue();
                }
                Ok(*ended)
            }
            _ => Err(Error::internal("a detach answered as something else")),
        }
    }

    /// Applies `bookings` in one pool transaction. The outer error means nothing was written.
    async fn apply_bookings(
        &self,
        bookings: &[Booking],
    ) -> Result<Vec<Result<Booked, Error>>, Error> {
        let mut pool_tx = self.pool_tx().await?;
        let queue_head = pool_tx.queue_head();
        // Whether a request waits; the batch's own queued requests count too, for the detaches
        // after them.
        let mut queue_waits = pool_tx.queue_waits();
        let (pool, quotas, tx) = pool_tx.parts_with_quotas();
        let mut outcomes: Vec<Option<Result<Booked, Error>>> =
            bookings.iter().map(|_| None).collect();
        let mut wrote = false;

        let mut ends = Vec::new();
        let mut positions = Vec::new();
        let mut releasing = HashSet::new();
        for (i, booking) in bookings.iter().enumerate() {
            if let Booking::Release(ending) = booking {
                if releasing.insert(ending.ended.id) {
                    ends.push(VmWrite { vm: ending.ended.clone(), claim: None });
                    positions.push(i);
                } else {
                    outcomes[i] = Some(Err(Error::Conflict(VM_CHANGED.into())));
                }
            }
        }
        if !ends.is_empty() {
            let written = tx.update_vms_releasing_cgpus(&mut ends).await?;
            let mut released = Vec::new();
            for ((i, end), written) in positions.into_iter().zip(ends).zip(written) {
                outcomes[i] = Some(match written {
                    Written::Stale => Err(Error::Conflict(VM_CHANGED.into())),
                    Written::Done { .. } => {
                        let Booking::Release(ending) = &bookings[i] else {
                            unreachable!("positions of releases")
                        };
                        if let Some(host) = &ending.fence_on {
                            fences::fence_cgpus(pool, tx, &end.vm, host, db::Fenced::All).await?;
                        }
                        released.push(end.vm.id);
                        Ok(Booked::Released(Box::new(end.vm), queue_waits))
                    }
                });
            }
            if !released.is_empty() {
                tx.delete_cgpus(&released).await?;
                for id in &released {
                    // Fenced cGPUs have left the VM's placement already.
                    pool.release(id);
                    quotas.release(id);
                }
                wrote = true;
            }
        }

        let mut reserved = Vec::new();
        let reserving: Vec<&Reservation> = bookings
            .iter()
            .filter_map(|b| if let Booking::Reserve(r) = b { Some(&**r) } else { None })
            .collect();
        let mut projects = Vec::new();
        for reservation in &reserving {
            match project_id(&reservation.record.project) {
                Ok(project) => projects.push(project),
                Err(e) => tracing::error!(error = %e, "a reservation of an invalid project"),
            }
        }
        // Only a limit on VMs needs the project's VMs counted: a count over them in the store,
        // at thousands of VMs a project most of a launch's time on PostgreSQL.
        projects.retain(|project| quotas.limits(project).0.vms.is_some());
        let mut vms = if projects.is_empty() {
            Default::default()
        } else {
            tx.counted_vms(Some(&projects.iter().collect::<Vec<_>>())).await?
        };
        let now = now_ms();
        let max_waiting = self.config.queue.max_waiting_per_project;
        let books = |b: &Booking| matches!(b, Booking::Reserve(_) | Booking::Attach(_));
        let mut gate = HeadGate {
            head: if bookings.iter().any(books) { queue_head } else { None },
            rules: self.config.queue.rules(),
            now_ms: now,
            passes: 0,
        };
        // Requests waiting per project, as the batch's queued ones add to them.
        let mut waiting: HashMap<String, u64> = HashMap::new();
        for (i, booking) in bookings.iter().enumerate() {
            if let Booking::Reserve(reservation) = booking {
                let mut ledgers = Ledgers { pool: &mut *pool, quotas: &mut *quotas, vms: &mut vms };
                let priority = reservation.record.spec.priority;
                let borrowing = ledgers.launch_borrows(&reservation.record);
                let held = gate.holds(priority, borrowing);
                match place_cgpus(&mut ledgers, self, &reservation.record, held) {
                    Ok(start) => {
                        gate.started(&reservation.record.project, priority, borrowing);
                        reserved.push((i, start));
                    }
                    Err(Error::InsufficientCapacity(s)) if reservation.queue && !s.never_fits => {
                        let project = &reservation.record.project;
                        let n = match waiting.get(project) {
                            Some(n) => *n,
                            None => tx.waiting_in_project(project).await?,
                        };
                        if n >= max_waiting {
                            outcomes[i] = Some(Err(too_many_waiting(max_waiting)));
                            continue;
                        }
                        waiting.insert(project.clone(), n + 1);
                        // It waits: recorded as queued, holding nothing, with a ticket.
                        let mut vm = reservation.record.clone();
                        vm.state = VmState::Queued;
                        vm.step = SagaStep::Done;
                        let details = VmDetails { vm, cgpus: Vec::new(), extras: Extras::Unknown };
                        reserved.push((i, details.into()));
                    }
                    Err(e) => outcomes[i] = Some(Err(e)),
                }
            }
        }
        if !reserved.is_empty() {
            let lease_until_ms = now_ms() + self.lease_ms();
            let new: Vec<NewVm<'_>> = reserved
                .iter()
                .map(|(i, SagaStart { details, .. })| {
                    let Booking::Reserve(reservation) = &bookings[*i] else {
                        unreachable!("reserved from a reservation")
                    };
                    NewVm {
                        record: &details.vm,
                        idempotency_key: reservation.idempotency_key.as_deref(),
                        request_digest: Some(&reservation.request_digest),
                        saga_owner: &self.instance,
                        // A queued VM has no saga yet: whichever replica's round starts it takes it.
                        lease_until_ms: if details.vm.state == VmState::Queued {
                            0
                        } else {
                            lease_until_ms
                        },
                    }
                })
                .collect();
            let cgpus: Vec<CgpuRecord> = reserved
                .iter()
                .flat_map(|(_, start)| start.details.cgpus.iter().cloned())
                .collect();
            tx.insert_vms_with_cgpus(&new, &cgpus).await?;
            let deadline = self.queue_deadline(now);
            let queued = reserved.iter().map(|(_, s)| &s.details.vm);
            for vm in queued.filter(|vm| vm.state == VmState::Queued) {
                let ticket = db::NewTicket {
                    vm,
                    queued: db::Queued::Launch,
                    now_ms: now,
                    deadline_ms: deadline,
                };
                tx.enqueue(ticket).await?;
                queue_waits = true;
            }
            for (i, start) in reserved {
                outcomes[i] = Some(Ok(Booked::Reserved(Box::new(start))));
            }
            wrote = true;
        }

        // Attaches and detaches are rare beside launches: one at a time, after them.
        for (i, booking) in bookings.iter().enumerate() {
            let outcome = match booking {
                Booking::Attach(attachment) => {
                    let queue = QueueTerms { deadline_ms: self.queue_deadline(now), max_waiting };
                    let priority = attachment.vm.spec.priority;
                    let borrowing = attach_borrows(pool, quotas, attachment);
                    let held = gate.holds(priority, borrowing);
                    let outcome = attach_cgpus(
                        pool,
                        quotas,
                        tx,
                        &self.config.masking,
                        attachment,
                        queue,
                        held,
                    )
                    .await?;
                    match outcome {
                        Ok(Booked::Attached(..)) => {
                            gate.started(&attachment.vm.project, priority, borrowing)
                        }
                        Ok(Booked::AttachQueued(_)) => queue_waits = true,
                        _ => {}
                    }
                    outcome
                }
                Booking::Detach(ending) => {
                    detach_cgpus(pool, quotas, tx, ending, queue_waits).await?
                }
                _ => continue,
            };
            wrote |= outcome.is_ok();
            outcomes[i] = Some(outcome);
        }

        if wrote {
            gate.write(tx).await?;
            pool_tx.commit().await?;
        }
        Ok(outcomes.into_iter().map(|o| o.expect("every booking has an outcome")).collect())
    }
}

/// Books an attachment's cGPUs (`attaching`) and writes its VM. The outer error fails the batch;
/// the inner one refuses this attachment alone, leaving the pool as it was.
async fn attach_cgpus(
    pool: &mut Pool,
    quotas: &mut QuotaLedger,
    tx: &mut db::PoolChange,
    masking: &MaskingConfig,
    attachment: &Attachment,
    queue: QueueTerms,
    held: bool,
) -> Result<Result<Booked, Error>, Error> {
    let id = attachment.vm.id;
    // Attaches count against the quota; VMs do not change.
    let project = match project_id(&attachment.vm.project) {
        Ok(project) => project,
        Err(e) => return Ok(Err(e)),
    };
    let borrow = quotas.borrows(&project, attachment.borrow);
    if let Err(e) = quotas.check_as(&project, Usage::asked(&attachment.request), 0, borrow) {
        return Ok(Err(e.into()));
    }
    let on_host = attachment.on_host.as_ref();
    let placed = if held && pool.could_ever_attach(&attachment.request, on_host) {
        let shortfall = Shortfall::held_for_queue(&attachment.request);
        Err(Refusal::Pool(gpgpums::Error::InsufficientCapacity(shortfall)))
    } else {
        gpgpums::book_within_model_limits(
            quotas,
            &project,
            &attachment.request,
            pool,
            |pool, request| pool.could_ever_attach(request, on_host),
            |pool, request| pool.attach(id, request, &attachment.policy, on_host),
        )
    };
    let placed = match placed {
        Ok(placed) => placed,
        Err(Refusal::Pool(gpgpums::Error::InsufficientCapacity(s)))
            if attachment.queue && !s.never_fits =>
        {
            if tx.waiting_in_project(&attachment.vm.project).await? >= queue.max_waiting {
                return Ok(Err(too_many_waiting(queue.max_waiting)));
            }
            // It waits, holding nothing; the VM stays as it is.
            let queued = db::Queued::Attach {
                attach: Box::new(db::QueuedAttach {
                    request: attachment.request.clone(),
                    policy: attachment.policy.clone(),
                    borrow: attachment.borrow,
                }),
                give_back: false,
            };
            let now = now_ms();
            let ticket = db::NewTicket {
                vm: &attachment.vm,
                queued,
                now_ms: now,
                deadline_ms: queue.deadline_ms,
            };
            let ticket = tx.enqueue(ticket).await?;
            if let Some(key) = &attachment.idempotency_key {
                let digest = &attachment.request_digest;
                tx.insert_attach_key(&attachment.vm.project, key, id, digest, now).await?;
            }
            return Ok(Ok(Booked::AttachQueued(ticket)));
        }
        Err(e) => return Ok(Err(e.into())),
    };
    let holding = pool.holding(&placed);
    let borrowed = quotas.split_borrowed(&project, &each_cgpu(&placed));
    if let Err(e) = quotas.charge_as(id, &project, &holding, 0, borrow) {
        for cgpu in &placed {
            pool.detach(&id, cgpu.index);
        }
        return Ok(Err(e.into()));
    }
    let undo = |pool: &mut Pool, quotas: &mut QuotaLedger| {
        for cgpu in &placed {
            pool.detach(&id, cgpu.index);
        }
        quotas.refund(&id, &holding);
    };
    let cgpus = match placed.iter().map(|c| cgpu_record(id, c, masking)).collect() {
        Ok(cgpus) => cgpus,
        Err(e) => {
            undo(pool, quotas);
            return Ok(Err(e));
        }
    };
    let mut cgpus: Vec<CgpuRecord> = cgpus;
    for (cgpu, borrowed) in cgpus.iter_mut().zip(borrowed) {
        cgpu.seq = attachment.seq;
        cgpu.state = CgpuState::Attaching;
        cgpu.borrowed_ms = borrowed.then(now_ms);
    }
    let mut write = [VmWrite { vm: attachment.vm.clone(), claim: Some(attachment.claim.clone()) }];
    let written = tx.update_vms(&mut write).await?;
    let [VmWrite { vm, .. }] = write;
    let claimed = match written.first() {
        Some(Written::Done { claimed }) => *claimed,
        _ => {
            undo(pool, quotas);
            return Ok(Err(Error::Conflict(VM_CHANGED_CGPUS.into())));
        }
    };
    tx.insert_cgpus(&cgpus).await?;
    if let Some(key) = &attachment.idempotency_key {
        tx.insert_attach_key(&vm.project, key, id, &attachment.request_digest, now_ms()).await?;
    }
    Ok(Ok(Booked::Attached(Box::new(vm), cgpus, claimed)))
}

/// The queue's head as this batch meets it: the rule is [`gpgpums::queue::Rules::head_holds`];
/// this counts the batch's passes and records them.
#[derive(Debug)]
struct HeadGate {
    head: Option<db::QueueHead>,
    rules: gpgpums::queue::Rules,
    now_ms: i64,
    /// Starts ahead of the head in this batch, of other projects than its own.
    passes: u32,
}

impl HeadGate {
    /// Whether a request of `priority` (`borrowing`: it would run on loan) must leave the free
    /// GPUs to the head.
    fn holds(&self, priority: i32, borrowing: bool) -> bool {
        self.head.as_ref().is_some_and(|head| {
            let state = gpgpums::queue::HeadState {
                priority: head.priority,
                holding_since_ms: head.holding_since_ms,
                awaiting_reclaim: head.awaiting_reclaim,
                borrowing: head.borrowing,
            };
            let passed = head.passed.saturating_add(self.passes);
            self.rules.head_holds(&state, passed, priority, borrowing, self.now_ms)
        })
    }

    /// A request of `project` and `priority` (`borrowing`: on loan) started: it passed the head
    /// if it comes after it in the queue's order.
    fn started(&mut self, project: &str, priority: i32, borrowing: bool) {
        let after = |h: &db::QueueHead| (!h.borrowing, h.priority) >= (!borrowing, priority);
        if self.head.as_ref().is_some_and(|h| after(h) && h.project != project) {
            self.passes += 1;
        }
    }

    /// Records the passes.
    async fn write(&self, tx: &mut db::PoolChange) -> Result<(), Error> {
        match &self.head {
            Some(head) if self.passes > 0 => {
                let (max, now) = (self.rules.max_passes, self.now_ms);
                Ok(tx.pass_head(head.ticket, self.passes, max, now).await?)
            }
            _ => Ok(()),
        }
    }
}

/// How a request that does not fit may wait.
#[derive(Debug, Clone, Copy)]
struct QueueTerms {
    deadline_ms: Option<i64>,
    /// Requests one project may have waiting.
    max_waiting: u64,
}

fn too_many_waiting(max: u64) -> Error {
    Error::TooManyRequests(format!(
        "the project already has {max} requests waiting in the queue \
         (queue.max_waiting_per_project): cancel some or retry later"
    ))
}

/// Releases (or fences) the VM's `detaching` cGPUs and writes the VM (see [`Booking::Detach`]).
async fn detach_cgpus(
    pool: &mut Pool,
    quotas: &mut QuotaLedger,
    tx: &mut db::PoolChange,
    ending: &Ending,
    queue_waits: bool,
) -> Result<Result<Booked, Error>, Error> {
    let mut write = [VmWrite { vm: ending.ended.clone(), claim: None }];
    if tx.update_vms(&mut write).await?.first() != Some(&Written::Done { claimed: false }) {
        return Ok(Err(Error::Conflict(VM_CHANGED.into())));
    }
    let [VmWrite { vm, .. }] = write;
    let fenced = match &ending.fence_on {
        Some(host) => {
            let which = db::Fenced::InState(CgpuState::Detaching);
            fences::fence_cgpus(pool, tx, &vm, host, which).await?
        }
        None => Vec::new(),
    };
    for index in tx.delete_cgpus_in_state(vm.id, CgpuState::Detaching).await? {
        let cgpu = match fenced.iter().find(|c| c.index == index) {
            Some(cgpu) => Some(cgpu.clone()),
            None => pool.detach(&vm.id, index),
        };
        if let Some(cgpu) = cgpu {
            quotas.refund(&vm.id, &pool.holding([&cgpu]));
        }
    }
    Ok(Ok(Booked::Released(Box::new(vm), queue_waits)))
}

/// The reason of the conflict that refuses an attach or detach whose VM changed meanwhile.
pub(crate) const VM_CHANGED_CGPUS: &str =
    "the VM changed meanwhile (another attach, detach or a termination): read it and retry";

/// A cGPU as booked for `vm`, with its masked endpoint.
pub(super) fn cgpu_record(
    vm: gpgpums::VmId,
    c: &gpgpums::CgpuAssignment,
    masking: &MaskingConfig,
) -> Result<CgpuRecord, Error> {
    let std::net::IpAddr::V4(rcuda_address) = c.rcuda.address else {
        return Err(Error::internal(format!("GPU {} has a non-IPv4 rCUDA address", c.gpu)));
    };
    Ok(CgpuRecord {
        vm,
        index: c.index,
        seq: 0,
        state: CgpuState::Live,
        gpu: c.gpu.clone(),
        host: c.host.clone(),
        memory_mib: c.memory_mib,
        mode: c.mode,
        masked_address: masking.address,
        // Config validation leaves room for every index a VM may use.
        masked_port: masking.base_port + c.index as u16,
        rcuda_address,
        rcuda_port: c.rcuda.port,
        rcuda_gpu_number: c.rcuda.gpu_number,
        compute_percent: c.compute_percent,
        // Set where the booking is charged (what its project's quota leaves decides).
        borrowed_ms: None,
    })
}

/// What each of `cgpus` holds, in order: what [`QuotaLedger::split_borrowed`] walks.
pub(super) fn each_cgpu(cgpus: &[gpgpums::CgpuAssignment]) -> Vec<Usage> {
    cgpus.iter().map(|c| Usage::of_cgpus([c])).collect()
}

/// What reservations in one batch book on: the pool, the quota ledger, and the VMs each project
/// counts (read in the batch's transaction, and counting the batch's own new VMs).
struct Ledgers<'a> {
    pool: &'a mut Pool,
    quotas: &'a mut QuotaLedger,
    vms: &'a mut HashMap<ProjectId, u64>,
}

impl Ledgers<'_> {
    /// Whether `record`'s launch would run on loan ([`gpgpums::queue::would_borrow`]).
    fn launch_borrows(&mut self, record: &VmRecord) -> bool {
        let Ok(project) = project_id(&record.project) else { return false };
        let vms = self.vms.get(&project).copied().unwrap_or(0);
        let borrow = self.quotas.borrows(&project, record.spec.borrow);
        let request = &record.spec.gpus;
        gpgpums::queue::would_borrow(self.quotas, self.pool, &project, request, true, vms, borrow)
    }
}

/// Whether `attachment`'s cGPUs would run on loan ([`gpgpums::queue::would_borrow`]).
fn attach_borrows(pool: &mut Pool, quotas: &QuotaLedger, attachment: &Attachment) -> bool {
    let Ok(project) = project_id(&attachment.vm.project) else { return false };
    let borrow = quotas.borrows(&project, attachment.borrow);
    gpgpums::queue::would_borrow(quotas, pool, &project, &attachment.request, false, 0, borrow)
}

/// A VM's project, as the ledger names it.
fn project_id(project: &str) -> Result<ProjectId, Error> {
    ProjectId::new(project).map_err(|e| Error::invalid("project", e.to_string()))
}

/// Places the VM's cGPUs on the pool, within its project's quota, and gives each its masked
/// endpoint, and builds its cloud-init (which must fit the cloud's limit); `held_for_queue`: the
/// quota is checked, but the free GPUs are not its to take (see [`HeadGate`]). A refusal leaves
/// the pool and the ledger as they were.
fn place_cgpus(
    booked: &mut Ledgers<'_>,
    app: &App,
    record: &VmRecord,
    held_for_queue: bool,
) -> Result<SagaStart, Error> {
    let masking = &app.config.masking;
    let mut record = record.clone();
    let id = record.id;
    let project = project_id(&record.project)?;
    let vms = booked.vms.get(&project).copied().unwrap_or(0);
    // The quota first (what the request asks is known before it is placed), as Nova does.
    let priority = record.spec.priority;
    if let Some(ceiling) = booked.quotas.max_priority(&project) {
        if i64::from(priority) > i64::from(ceiling) {
            let project = project.to_string();
            return Err(Error::PriorityAboveCeiling { project, priority, ceiling });
        }
    }
    let borrow = booked.quotas.borrows(&project, record.spec.borrow);
    let asked = Usage::vm_with(Usage::asked(&record.spec.gpus));
    booked.quotas.check_as(&project, asked, vms, borrow)?;
    let pool = &mut *booked.pool;
    if held_for_queue && pool.could_ever_fit(&record.spec.gpus, None) {
        return Err(Error::InsufficientCapacity(Shortfall::held_for_queue(&record.spec.gpus)));
    }
    let started = Instant::now();
    let placement = gpgpums::book_within_model_limits(
        booked.quotas,
        &project,
        &record.spec.gpus,
        pool,
        |pool, request| pool.could_ever_fit(request, None),
        |pool, request| pool.place(id, request, &record.policy),
    )?;
    record.timings.gpu_selection = Some(started.elapsed().as_secs_f64());
    record.policy = placement.policy.clone();
    let cgpus = placement
        .cgpus
        .iter()
        .map(|c| cgpu_record(id, c, masking))
        .collect::<Result<Vec<_>, Error>>()
        .and_then(|cgpus| build_user_data(app, &record, &cgpus).map(|data| (cgpus, data)));
    let holding = booked.pool.holding(&placement.cgpus).vm_with();
    let borrowed = booked.quotas.split_borrowed(&project, &each_cgpu(&placement.cgpus));
    let charged = cgpus.and_then(|(mut cgpus, user_data)| {
        booked.quotas.charge_as(id, &project, &holding, vms, borrow)?;
        for (cgpu, borrowed) in cgpus.iter_mut().zip(borrowed) {
            cgpu.borrowed_ms = borrowed.then(now_ms);
        }
        Ok((cgpus, user_data))
    });
    match charged {
        Ok((cgpus, user_data)) => {
            *booked.vms.entry(project).or_default() += 1;
            let details = VmDetails { vm: record, cgpus, extras: Extras::Unknown };
            Ok(SagaStart { details, user_data: Some(user_data) })
        }
        Err(e) => {
            booked.pool.release(&id);
            Err(e)
        }
    }
}

/// The VM's cloud-init, with the remote-GPU environment of `cgpus`, if it fits the cloud's limit
/// ([`crate::cloud::Cloud::check_user_data_len`]): built where its cGPUs are placed, and handed to
/// its saga (see [`SagaStart`]).
pub(super) fn build_user_data(
    app: &App,
    record: &VmRecord,
    cgpus: &[CgpuRecord],
) -> Result<Vec<u8>, Error> {
    let user_data = vm_user_data(&app.config, record, cgpus)
        .map_err(|e| Error::invalid("user_data", e.to_string()))?;
    app.cloud.check_user_data_len(user_data.len()).map_err(|limit| {
        let why =
            format!("with the GPU environment of {} cGPUs it is too long: {limit}", cgpus.len());
        Error::invalid("user_data", why)
    })?;
    Ok(user_data)
}
