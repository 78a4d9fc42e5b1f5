//! The REST API's request and response types, apart from the stored records so either can change.
//!
//! Tenants never see where their GPUs are: the GPU, host and rCUDA fields are filled for admins only.

use std::collections::{BTreeMap, HashSet};

use gpgpums::{Locality, Mode, Request};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::app::elastic::AttachInput;
use crate::app::queue::QueueEntry;
use crate::app::vms::{rcuda_env, VmDetails};
use crate::cloud::VmRequest;
use crate::db::{HostAlert, QueueRow, Queued, VmEvent};
use crate::model::{host_state_str, mode_str, CgpuState, HostRecord, LaunchSpec, Timings};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ModeParam {
    /// Each cGPU takes a whole idle GPU (the default, as in the dissertation).
    #[default]
    Exclusive,
    /// Each cGPU reserves `gpu_memory_mib` on a GPU others may share.
    Shared,
}

impl From<Mode> for ModeParam {
    fn from(mode: Mode) -> ModeParam {
        match mode {
            Mode::Exclusive => ModeParam::Exclusive,
            Mode::Shared => ModeParam::Shared,
        }
    }
}

impl From<ModeParam> for Mode {
    fn from(mode: ModeParam) -> Mode {
        match mode {
            ModeParam::Exclusive => Mode::Exclusive,
            ModeParam::Shared => Mode::Shared,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LocalityParam {
    /// GPUs anywhere; the cloud picks the VM's host.
    #[default]
    Any,
    /// Every cGPU on one compute-GPU host, and the VM there too.
    Local,
    /// The VM on a compute-rGPU host; GPUs anywhere.
    Remote,
}

/// `POST /v1/vms`: the VM part and the GPU part of a launch.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// The VM's name; default `gsaas-<first 8 characters of its id>`.
    #[serde(default)]
    pub name: Option<String>,
    pub image: String,
    pub flavor: String,
    /// Network names or ids; the cloud's default when empty.
    #[serde(default)]
    pub networks: Vec<String>,
    /// Your own cloud-init user_data (text); it runs beside GSaaS's.
    #[serde(default)]
    pub user_data: Option<String>,
    /// Number of cGPUs (the dissertation's `-ncgpus`).
    pub ncgpus: u32,
    /// Memory per cGPU in MiB (`-poolmem`); required in shared mode.
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    #[serde(default)]
    pub mode: ModeParam,
    #[serde(default)]
    pub locality: LocalityParam,
    /// Placement policy; the service default when absent.
    #[serde(default)]
    pub policy: Option<String>,
    /// Never put two of this VM's cGPUs on one physical GPU.
    #[serde(default)]
    pub distinct_gpus: bool,
    /// When the GPUs are not there now, wait in the queue (state `queued`, answered 202) instead
    /// of failing with 507.
    #[serde(default)]
    pub queue: bool,
    /// Higher goes first in the queue: 0 (the default) to the service's `queue.max_priority`.
    #[serde(default)]
    pub priority: i32,
    /// Best effort: the VM's cGPUs may be taken back for requests of higher priority.
    #[serde(default)]
    pub preemptible: bool,
    /// For a preemptible VM: whether cGPUs taken back wait in the queue to be given back
    /// (default true).
    #[serde(default = "yes")]
    pub give_back: bool,
}

fn yes() -> bool {
    true
}

impl LaunchRequest {
    /// The launch as stored, the policy asked for, and whether it may wait in the queue.
    pub fn into_spec(self) -> (LaunchSpec, Option<String>, bool) {
        let gpus = Request {
            ncgpus: self.ncgpus,
            gpu_memory_mib: self.gpu_memory_mib,
            mode: self.mode.into(),
            locality: match self.locality {
                LocalityParam::Any => Locality::Any,
                LocalityParam::Local => Locality::Local,
                LocalityParam::Remote => Locality::Remote,
            },
            distinct_gpus: self.distinct_gpus,
        };
        let vm = VmRequest {
            name: self.name.unwrap_or_default(),
            image: self.image,
            flavor: self.flavor,
            networks: self.networks,
        };
        let spec = LaunchSpec {
            vm,
            user_data: self.user_data,
            gpus,
            priority: self.priority,
            preemptible: self.preemptible,
            give_back: self.give_back,
        };
        (spec, self.policy, self.queue)
    }
}

/// `POST /v1/vms/{id}/cgpus`: cGPUs to attach to a ready VM. They follow the VM's locality.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    /// Number of cGPUs to add.
    pub ncgpus: u32,
    /// Memory per cGPU in MiB; required in shared mode.
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    #[serde(default)]
    pub mode: ModeParam,
    /// Never put two of this VM's cGPUs (old or new) on one physical GPU.
    #[serde(default)]
    pub distinct_gpus: bool,
    /// Placement policy; the VM's when absent.
    #[serde(default)]
    pub policy: Option<String>,
    /// When the GPUs are not there now, wait in the queue (answered 202, the VM unchanged, the
    /// attach in its `queued_attaches`) instead of failing with 507.
    #[serde(default)]
    pub queue: bool,
}

impl AttachRequest {
    pub fn into_input(self) -> AttachInput {
        AttachInput {
            ncgpus: self.ncgpus,
            gpu_memory_mib: self.gpu_memory_mib,
            mode: self.mode.into(),
            distinct_gpus: self.distinct_gpus,
            policy: self.policy,
            queue: self.queue,
        }
    }
}

/// One cGPU of a VM.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CgpuView {
    /// The cGPU's number for its whole life (it fixes its masked endpoint); detach it by this.
    pub index: u32,
    /// `live`; `attaching` while its route is installed; `detaching` while it is withdrawn.
    pub state: CgpuState,
    /// Where the VM reaches this cGPU (`ip:port`).
    pub masked_endpoint: String,
    pub memory_mib: u64,
    pub mode: String,
    /// The physical GPU (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The GPU's host (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The real rCUDA server (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rcuda_endpoint: Option<String>,
}

/// The GPU part of the request, as accepted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuRequestView {
    pub ncgpus: u32,
    pub gpu_memory_mib: Option<u64>,
    pub mode: ModeParam,
    pub locality: LocalityParam,
    pub distinct_gpus: bool,
    /// The policy that placed the cGPUs.
    pub policy: String,
}

/// A cGPU-enabled VM.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VmView {
    pub id: String,
    pub name: String,
    pub project: String,
    /// `queued`, `creating`, `ready`, `error`, `deleting` or `deleted`.
    pub state: String,
    /// Why the VM is in `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A machine-readable cause of `error`, when it has one (`queue_timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// While it waits in the queue (`queued`, or an attach in `queued_attaches`): its place
    /// (1: next), by priority and arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u64>,
    /// Attaches the VM waits for, in ticket order: asked with `queue: true`, or cGPUs a
    /// preemption took, to be given back.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queued_attaches: Vec<WaitingView>,
    pub priority: i32,
    pub preemptible: bool,
    /// Whether cGPUs taken back from this VM are given back when capacity returns.
    pub give_back: bool,
    /// What happened to the VM that its owner should know of, oldest first (the last 100 on
    /// `GET /v1/vms/{id}`, the last 20 in lists): `preempted` (cGPUs of a preemptible VM taken
    /// back), `given_back`, `attached` (a queued attach started), `queue_timeout` (a queued
    /// attach waited too long), `attach_refused`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<VmEventView>,
    pub image: String,
    pub flavor: String,
    /// The cloud's server id, once the server is active.
    pub server_id: Option<String>,
    /// The VM's host (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The VM's fixed IP, once known.
    pub fixed_ip: Option<String>,
    pub gpus: GpuRequestView,
    pub cgpus: Vec<CgpuView>,
    /// The rCUDA environment the VM's cloud-init sets.
    pub rcuda_env: BTreeMap<String, String>,
    /// Seconds per stage of the dissertation's Equation 5.1.
    pub timings: Timings,
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl VmView {
    pub fn new(details: &VmDetails, admin: bool) -> VmView {
        let vm = &details.vm;
        let gpus = &vm.spec.gpus;
        VmView {
            id: vm.id.to_string(),
            name: vm.name.clone(),
            project: vm.project.clone(),
            state: vm.state.as_str().into(),
            error: vm.error.clone(),
            error_code: vm.error.as_deref().and_then(error_code),
            queue_position: None,
            queued_attaches: Vec::new(),
            priority: vm.spec.priority,
            preemptible: vm.spec.preemptible,
            give_back: vm.spec.give_back,
            events: Vec::new(),
            image: vm.spec.vm.image.clone(),
            flavor: vm.spec.vm.flavor.clone(),
            server_id: vm.server_id.as_ref().map(|s| s.0.clone()),
            host: vm.host.as_ref().filter(|_| admin).map(|h| h.to_string()),
            fixed_ip: vm.fixed_ip.map(|ip| ip.to_string()),
            gpus: GpuRequestView {
                ncgpus: gpus.ncgpus,
                gpu_memory_mib: gpus.gpu_memory_mib,
                mode: gpus.mode.into(),
                locality: match gpus.locality {
                    Locality::Any => LocalityParam::Any,
                    Locality::Local => LocalityParam::Local,
                    Locality::Remote => LocalityParam::Remote,
                },
                distinct_gpus: gpus.distinct_gpus,
                policy: vm.policy.clone(),
            },
            cgpus: details
                .cgpus
                .iter()
                .map(|c| CgpuView {
                    index: c.index,
                    state: c.state,
                    masked_endpoint: format!("{}:{}", c.masked_address, c.masked_port),
                    memory_mib: c.memory_mib,
                    mode: mode_str(c.mode).into(),
                    gpu: admin.then(|| c.gpu.to_string()),
                    host: admin.then(|| c.host.to_string()),
                    rcuda_endpoint: admin.then(|| format!("{}:{}", c.rcuda_address, c.rcuda_port)),
                })
                .collect(),
            rcuda_env: rcuda_env(&details.cgpus).variables().into_iter().collect(),
            timings: vm.timings.clone(),
            created_ms: vm.created_ms,
            updated_ms: vm.updated_ms,
        }
    }
}

impl VmView {
    /// With what the VM waits for in the queue and its events.
    pub fn with_queue_and_events(mut self, entries: &[QueueEntry], events: Vec<VmEvent>) -> VmView {
        self.queue_position = entries.iter().map(|e| e.position).min();
        self.queued_attaches = entries.iter().filter_map(WaitingView::of_attach).collect();
        self.events = events
            .into_iter()
            .map(|e| VmEventView { at_ms: e.at_ms, kind: e.kind, detail: e.detail })
            .collect();
        self
    }
}

/// `GET /v1/queue`: what waits for GPU capacity.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueueView {
    /// How many requests wait at each priority, in the whole queue (highest first).
    pub lengths: Vec<QueueLengthView>,
    /// The caller's project's requests (an admin's: every project's), in queue order.
    pub requests: Vec<QueuedRequestView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueueLengthView {
    pub priority: i32,
    pub waiting: u64,
}

/// A request waiting in the queue, for one of the caller's VMs (admins: any).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueuedRequestView {
    /// The VM it is for.
    pub vm: String,
    pub vm_name: String,
    pub project: String,
    pub priority: i32,
    #[serde(flatten)]
    pub waiting: WaitingView,
}

impl QueueView {
    pub fn new(rows: &[QueueRow], lengths: &[(i64, i64)]) -> QueueView {
        QueueView {
            lengths: lengths
                .iter()
                .rev()
                .map(|&(priority, waiting)| QueueLengthView {
                    priority: priority as i32,
                    waiting: waiting.max(0) as u64,
                })
                .collect(),
            requests: rows
                .iter()
                .map(|row| QueuedRequestView {
                    vm: row.vm.to_string(),
                    vm_name: row.vm_name.clone(),
                    project: row.project.clone(),
                    priority: row.priority,
                    waiting: WaitingView::new(
                        row.position,
                        &row.queued,
                        &row.request,
                        row.enqueued_ms,
                        row.deadline_ms,
                    ),
                })
                .collect(),
        }
    }
}

/// What a request in the queue waits for, and since when.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaitingView {
    /// Its place in the whole queue (1: next), by priority and arrival.
    pub position: u64,
    /// `launch`, `attach` (asked with `queue: true`) or `give_back` (cGPUs a preemption took).
    pub kind: String,
    pub ncgpus: u32,
    pub gpu_memory_mib: Option<u64>,
    pub mode: ModeParam,
    pub enqueued_ms: i64,
    /// When it ends with `queue_timeout`; absent: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
}

impl WaitingView {
    fn new(
        position: u64,
        queued: &Queued,
        request: &Request,
        enqueued_ms: i64,
        deadline_ms: Option<i64>,
    ) -> WaitingView {
        WaitingView {
            position,
            kind: queued.kind().into(),
            ncgpus: request.ncgpus,
            gpu_memory_mib: request.gpu_memory_mib,
            mode: request.mode.into(),
            enqueued_ms,
            deadline_ms,
        }
    }

    /// A VM's queued attach (`None` for its launch).
    fn of_attach(entry: &QueueEntry) -> Option<WaitingView> {
        let Queued::Attach { attach, .. } = &entry.queued else { return None };
        Some(WaitingView::new(
            entry.position,
            &entry.queued,
            &attach.request,
            entry.enqueued_ms,
            entry.deadline_ms,
        ))
    }
}

/// One event of a VM.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VmEventView {
    pub at_ms: i64,
    pub kind: String,
    pub detail: String,
}

/// The code a VM's error starts with, when it is one clients can act on.
fn error_code(error: &str) -> Option<String> {
    let code = crate::app::background::queue_rounds::QUEUE_TIMEOUT;
    error.strip_prefix(code).filter(|rest| rest.starts_with(':')).map(|_| code.to_owned())
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VmList {
    pub vms: Vec<VmView>,
    /// The next page, absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Pool totals, for everyone.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolTotals {
    pub gpus: u64,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub cgpus: u64,
    /// GPUs with nothing on them, on schedulable hosts.
    pub idle_gpus: u64,
}

/// One GPU (admins only).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuView {
    pub id: String,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub exclusive: bool,
    pub cgpus: u32,
    pub jobs: u32,
    pub rcuda_endpoint: String,
    /// VMs with cGPUs here, and how many each.
    pub vms: BTreeMap<String, u32>,
    /// Why the GPU takes no new cGPUs, when it is tainted.
    pub taint: Option<String>,
    /// Why its host reports it unhealthy (it takes no new cGPUs); `null`: healthy.
    pub health: Option<String>,
    /// cGPU bookings fences hold here (routes that may still be live on a host that could not
    /// be reached, or a re-homed cGPU's old GPU): not placeable until released.
    pub fenced: u32,
}

/// A renewed agent token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentToken {
    pub token: String,
}

/// `POST /v1/gpus/{id}/taint`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintRequest {
    /// Why the GPU must take no new cGPUs (kept with the admin's name).
    pub reason: String,
}

/// A GPU's taint after a taint or untaint.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuTaintView {
    pub id: String,
    /// The reason given, or `null` when the GPU takes cGPUs again.
    pub taint: Option<String>,
}

/// One host's share of the pool (admins only).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolHostView {
    pub name: String,
    pub kind: String,
    pub state: String,
    pub vms: u32,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolView {
    pub totals: PoolTotals,
    /// Per host and GPU (admins only), a page of hosts in registration order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<PoolHostView>>,
    /// The next page of hosts (admins), absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl PoolView {
    /// The pool's totals, which everyone may see.
    pub fn totals(pool: &gpgpums::Pool) -> PoolView {
        let t = pool.totals();
        let totals = PoolTotals {
            gpus: t.gpus,
            memory_mib: t.memory_mib,
            allocated_mib: t.allocated_mib,
            cgpus: t.cgpus,
            idle_gpus: t.idle_gpus,
        };
        PoolView { totals, hosts: None, next: None }
    }

    /// The totals and a page of hosts, for admins: up to `limit` hosts after `after`; `fences`
    /// are the pool's holders that are fences, not VMs. Also says whether more hosts follow.
    /// `None`: `after` is not a host of the pool.
    pub fn page(
        pool: &gpgpums::Pool,
        after: Option<&gpgpums::HostId>,
        limit: usize,
        fences: &HashSet<gpgpums::VmId>,
    ) -> Option<(PoolView, bool)> {
        let mut page = pool.host_page(after, limit.saturating_add(1))?;
        let more = page.len() > limit;
        page.truncate(limit);
        let hosts = page
            .into_iter()
            .map(|(h, gpus)| PoolHostView {
                name: h.id.to_string(),
                kind: h.kind.as_str().into(),
                state: host_state_str(h.state).into(),
                vms: h.vms,
                gpus: gpus
                    .into_iter()
                    .map(|g| {
                        let mut vms = BTreeMap::new();
                        let mut fenced = 0;
                        for (holder, n) in pool.holders(&g.id) {
                            if fences.contains(&holder) {
                                fenced += n;
                            } else {
                                vms.insert(holder.to_string(), n);
                            }
                        }
                        GpuView {
                            id: g.id.to_string(),
                            index: g.index,
                            rcuda_endpoint: format!("{}:{}", g.rcuda.address, g.rcuda.port),
                            model: g.model,
                            memory_mib: g.memory_mib,
                            allocated_mib: g.allocated_mib,
                            exclusive: g.exclusive,
                            cgpus: g.cgpus,
                            jobs: g.jobs,
                            vms,
                            taint: g.taint,
                            health: g.health,
                            fenced,
                        }
                    })
                    .collect(),
            })
            .collect();
        Some((PoolView { hosts: Some(hosts), ..PoolView::totals(pool) }, more))
    }
}

/// A host as gsaasd knows it (admins only).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HostView {
    pub name: String,
    pub kind: String,
    /// `schedulable`, `drained` or `unavailable`.
    pub state: String,
    pub agent_url: Option<String>,
    pub last_seen_ms: i64,
    /// Generation of the last route table computed for the host.
    pub routes_generation: u64,
    /// Generation its agent confirmed.
    pub applied_generation: u64,
    /// An admin declared it dead; it takes part again once its agent registers.
    pub forgotten: bool,
    /// What its agent tried that was refused or outlived its bound, newest first (the last 20);
    /// in admins' host lists only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alerts: Option<Vec<HostAlertView>>,
}

/// A host alert (see `GET /v1/hosts`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HostAlertView {
    pub at_ms: i64,
    /// `endpoint_conflict` (a report claimed an rCUDA endpoint another host's GPU holds),
    /// `foreign_refusal` (its agent refused routes blaming another host's GPU) or
    /// `fence_expired` (fences its agent never confirmed were released).
    pub kind: String,
    pub detail: String,
}

impl HostView {
    /// The host as admins list it, with its alerts.
    pub fn with_alerts(h: &HostRecord, alerts: Vec<HostAlert>) -> Self {
        let alerts = alerts
            .into_iter()
            .map(|a| HostAlertView { at_ms: a.at_ms, kind: a.kind, detail: a.detail })
            .collect();
        HostView { alerts: Some(alerts), ..HostView::from(h) }
    }
}

impl From<&HostRecord> for HostView {
    fn from(h: &HostRecord) -> Self {
        HostView {
            name: h.name.to_string(),
            kind: h.kind.as_str().into(),
            state: host_state_str(h.state).into(),
            agent_url: h.agent_url.clone(),
            last_seen_ms: h.last_seen_ms,
            routes_generation: h.routes_generation,
            applied_generation: h.applied_generation,
            forgotten: h.forgotten,
            alerts: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HostList {
    pub hosts: Vec<HostView>,
}

/// `PUT /v1/hosts/{name}`: an agent's registration and heartbeat (rodvr-agent's `HostReport`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct HostReportBody {
    pub host: String,
    pub kind: String,
    pub agent_url: String,
    pub gpus: Vec<GpuReportBody>,
    #[serde(default)]
    pub applied_generation: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct GpuReportBody {
    pub id: String,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub rcuda: RcudaBody,
    /// Why the GPU is unhealthy; absent: healthy.
    #[serde(default)]
    pub unhealthy: Option<String>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct RcudaBody {
    pub address: String,
    pub port: u16,
    pub gpu_number: u32,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Readiness {
    pub status: String,
    pub database: String,
    pub reconciler: crate::app::ReconcilerStatus,
}
