//! The service's internal records: what the database stores and the application layer works on.
//!
//! These are not the HTTP API's types (see `http::views`): the API can change its shape without a
//! migration, and the database never leaks into responses.

use std::net::Ipv4Addr;

use gpgpums::{GpuId, HostId, HostKind, HostState, Mode, Request, VmId};
pub use gsaas_api_types::{CgpuState, Timings};
use serde::{Deserialize, Serialize};

/// A VM's life, as tenants see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Waiting in the queue for capacity (launched with `queue: true`); holds no cGPUs.
    Queued,
    Creating,
    Ready,
    Error,
    Deleting,
    Deleted,
}

impl VmState {
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Queued => "queued",
            VmState::Creating => "creating",
            VmState::Ready => "ready",
            VmState::Error => "error",
            VmState::Deleting => "deleting",
            VmState::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => VmState::Queued,
            "creating" => VmState::Creating,
            "ready" => VmState::Ready,
            "error" => VmState::Error,
            "deleting" => VmState::Deleting,
            "deleted" => VmState::Deleted,
            _ => return None,
        })
    }
}

/// Where a VM's saga stands: which saga runs and its next step, or `Done` when none does. Each
/// saga's steps are a type of its own, run by its own file in `app/sagas/`; a saga is started
/// at its first step ([`SagaStep::LAUNCH`], [`SagaStep::TERMINATE`], `Attach`, `Detach`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaStep {
    Launch(LaunchStep),
    /// A ready VM's new cGPUs (`attaching`) get their routes, then go live.
    Attach,
    /// A ready VM's `detaching` cGPUs lose their routes, then their bookings.
    Detach,
    /// A termination, or the unwinding of a launch that failed.
    Terminate(TerminateStep),
    /// Nothing left to do (ready, error or deleted).
    Done,
}

/// The launch saga's steps (`app/sagas/launch.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchStep {
    CreateVm,
    WaitActive,
    ConfigureRoutes,
}

/// The termination saga's steps (`app/sagas/terminate.rs`), which also unwind a failed launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminateStep {
    WithdrawRoutes,
    DeleteServer,
    ReleaseGpus,
}

impl SagaStep {
    /// A launch's first step.
    pub const LAUNCH: SagaStep = SagaStep::Launch(LaunchStep::CreateVm);
    /// A termination's (or an unwinding's) first step.
    pub const TERMINATE: SagaStep = SagaStep::Terminate(TerminateStep::WithdrawRoutes);

    /// As stored in `vms.step`.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaStep::Launch(LaunchStep::CreateVm) => "create_vm",
            SagaStep::Launch(LaunchStep::WaitActive) => "wait_active",
            SagaStep::Launch(LaunchStep::ConfigureRoutes) => "configure_routes",
            SagaStep::Attach => "attach_cgpus",
            SagaStep::Detach => "detach_cgpus",
            SagaStep::Done => "done",
            SagaStep::Terminate(TerminateStep::WithdrawRoutes) => "withdraw_routes",
            SagaStep::Terminate(TerminateStep::DeleteServer) => "delete_server",
            SagaStep::Terminate(TerminateStep::ReleaseGpus) => "release_gpus",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            // An earlier gsaasd's first launch step: the creation checks what it needs itself.
            "check_cloud" | "create_vm" => SagaStep::LAUNCH,
            "wait_active" => SagaStep::Launch(LaunchStep::WaitActive),
            "configure_routes" => SagaStep::Launch(LaunchStep::ConfigureRoutes),
            "attach_cgpus" => SagaStep::Attach,
            "detach_cgpus" => SagaStep::Detach,
            "done" => SagaStep::Done,
            "withdraw_routes" => SagaStep::TERMINATE,
            "delete_server" => SagaStep::Terminate(TerminateStep::DeleteServer),
            "release_gpus" => SagaStep::Terminate(TerminateStep::ReleaseGpus),
            _ => return None,
        })
    }

    /// An attach or detach on a ready VM.
    pub fn changes_cgpus(self) -> bool {
        matches!(self, SagaStep::Attach | SagaStep::Detach)
    }

    pub fn is_unwinding(self) -> bool {
        matches!(self, SagaStep::Terminate(_))
    }
}

/// A validated launch request, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub vm: VmRequest,
    /// The user's own cloud-init user_data.
    #[serde(default)]
    pub user_data: Option<String>,
    pub gpus: Request,
    /// Higher goes first in the queue.
    #[serde(default)]
    pub priority: i32,
    /// Best effort: the VM's cGPUs may be taken back for requests of higher priority.
    #[serde(default)]
    pub preemptible: bool,
    /// Whether cGPUs taken back from this (preemptible) VM wait in the queue to be given back.
    #[serde(default = "give_back_by_default")]
    pub give_back: bool,
    /// Whether it may run past its project's quota on what the project's cohort lends; absent:
    /// as its project's terms in its cohort say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow: Option<bool>,
    /// What the cloud's check of the launch resolved its flavor, image and networks to: the
    /// launch saga's parameter for every creation of its server, so none looks the names up
    /// again. `None` in a request not checked yet, and in launches stored before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Checked>,
}

fn give_back_by_default() -> bool {
    true
}

impl LaunchSpec {
    /// The layer its cGPUs speak: the one its launch asked for or was given (see
    /// [`Self::with_stored_defaults`]).
    pub fn remoting(&self) -> gpgpums::Remoting {
        self.gpus.constraints.remoting.unwrap_or_default()
    }

    /// A spec as stored: one stored before layers were told apart is an rCUDA VM's, and says
    /// so, so that attach and re-homing, which place with its constraints, keep to rCUDA.
    pub fn with_stored_defaults(mut self) -> Self {
        self.gpus.constraints.remoting.get_or_insert(gpgpums::Remoting::Rcuda);
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct VmRecord {
    pub id: VmId,
    pub project: String,
    pub owner: String,
    pub name: String,
    pub spec: LaunchSpec,
    pub policy: String,
    pub state: VmState,
    pub error: Option<String>,
    pub step: SagaStep,
    pub server_id: Option<ServerId>,
    pub host: Option<HostId>,
    pub fixed_ip: Option<Ipv4Addr>,
    pub tap: Option<String>,
    pub routes_on: bool,
    pub timings: Timings,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Bumped by every write; writes are conditional on it.
    pub version: i64,
    /// Bumped with every queue entry or event added for the VM, as of the read or write that
    /// gave this record (`migrations/0020_vm_extras_version.sql`).
    pub extras_version: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgpuRecord {
    pub vm: VmId,
    /// The cGPU's number for its whole life: its masked port is the masking base port plus it.
    pub index: u32,
    /// Attach order among the VM's cGPUs (the order of `RCUDA_DEVICE_<n>`); a launch's are 0.
    pub seq: i64,
    pub state: CgpuState,
    pub gpu: GpuId,
    pub host: HostId,
    pub memory_mib: u64,
    pub mode: Mode,
    pub masked_address: Ipv4Addr,
    pub masked_port: u16,
    pub rcuda_address: Ipv4Addr,
    pub rcuda_port: u16,
    pub rcuda_gpu_number: u32,
    /// Its share of its GPU's SMs, percent (a shared cGPU on a host that runs MPS).
    pub compute_percent: Option<u8>,
    /// When it was admitted past its project's quota, on what the project's cohort lends; `None`:
    /// not on loan.
    pub borrowed_ms: Option<i64>,
}

/// A fence (see `migrations/0012_fencing.sql`): cGPU bookings kept, under their own holder in
/// the pool, while a host may still route to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceId(VmId);

impl FenceId {
    pub fn new_random() -> Self {
        FenceId(VmId::new_random())
    }

    /// The fence's holder in the pool (a pool entry that is not a VM).
    pub fn holder(self) -> VmId {
        self.0
    }
}

impl std::fmt::Display for FenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for FenceId {
    type Err = <VmId as std::str::FromStr>::Err;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(FenceId)
    }
}

/// A notification waiting in the outbox (see `migrations/0028_notifications.*.sql`): the `seq`-th
/// event of VM `vm`, its payload as the database wrote it (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationRecord {
    pub vm: String,
    pub seq: i64,
    pub event_type: String,
    pub payload: String,
    pub created_ms: i64,
}

/// A fence with the bookings it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRecord {
    pub id: FenceId,
    /// The VM whose routes they were.
    pub vm: VmId,
    /// The host whose agent must confirm them gone.
    pub host: HostId,
    /// Released once that agent applied a table of at least this generation.
    pub generation: u64,
    pub reason: String,
    pub created_ms: i64,
    pub cgpus: Vec<gpgpums::CgpuAssignment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRecord {
    pub name: HostId,
    pub seq: i64,
    pub kind: HostKind,
    pub state: HostState,
    pub drained: bool,
    pub agent_url: Option<String>,
    pub last_seen_ms: i64,
    pub routes_generation: u64,
    pub applied_generation: u64,
    /// An admin declared the host dead (`POST /v1/hosts/{name}/forget`); cleared when its agent
    /// registers again.
    pub forgotten: bool,
    /// Its agent runs one server per cGPU of its GPUs (`[gpu_servers] managed`): its table lists
    /// them.
    pub managed_servers: bool,
    /// Its address on the GPU network, as its agent reported it (admins only).
    pub gpu_address: Option<Ipv4Addr>,
    /// Where it sits in the network (admins only).
    pub topology: gpgpums::Topology,
    /// Round trips (microseconds) its agent measured to GPU hosts, as last recorded.
    pub rtt_us: std::collections::BTreeMap<HostId, u32>,
    /// When they were recorded (ms since the epoch; 0: never).
    pub rtt_recorded_ms: i64,
    /// What it offers the local VMs pinned to it, as its agent reported it (`None`: unknown).
    pub local_vms: Option<gpgpums::Resources>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRecord {
    pub id: GpuId,
    pub host: HostId,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub rcuda_address: Ipv4Addr,
    pub rcuda_port: u16,
    pub rcuda_gpu_number: u32,
    /// Why the host's agent reports the GPU unhealthy; `None`: healthy.
    pub health: Option<String>,
    /// Compute capability, CUDA version, UUID and traits, as far as known.
    pub attributes: gpgpums::GpuAttributes,
    /// Set for a partition (a MIG instance) of another GPU of the host.
    pub partition: Option<gpgpums::Partition>,
}

impl GpuRecord {
    /// The same device at the same place, whatever its health and attributes (a driver upgrade
    /// changes its CUDA version, an operator its traits: it keeps its cGPUs). A partition of
    /// another parent or profile is another device.
    pub fn same_device(&self, other: &GpuRecord) -> bool {
        // Its server's layer is part of the device: a GPU whose server now speaks another
        // layer leaves and joins anew, so no VM's cGPU changes layer under it.
        let bare = |gpu: &GpuRecord| GpuRecord {
            health: None,
            attributes: gpgpums::GpuAttributes {
                remoting: gpu.attributes.remoting,
                ..gpgpums::GpuAttributes::default()
            },
            ..gpu.clone()
        };
        bare(self) == bare(other)
    }

    /// The GPU as the scheduler sees it.
    pub fn spec(&self) -> gpgpums::GpuSpec {
        gpgpums::GpuSpec {
            id: self.id.clone(),
            host: self.host.clone(),
            index: self.index,
            model: self.model.clone(),
            memory_mib: self.memory_mib,
            rcuda: gpgpums::RcudaEndpoint {
                address: self.rcuda_address.into(),
                port: self.rcuda_port,
                gpu_number: self.rcuda_gpu_number,
            },
            attributes: self.attributes.clone(),
            partition: self.partition.clone(),
        }
    }
}

pub fn parse_host_kind(s: &str) -> Option<HostKind> {
    Some(match s {
        "compute-gpu" => HostKind::ComputeGpu,
        "compute-rgpu" => HostKind::ComputeRgpu,
        "compute" => HostKind::Compute,
        _ => return None,
    })
}

pub fn host_state_str(state: HostState) -> &'static str {
    match state {
        HostState::Schedulable => "schedulable",
        HostState::Drained => "drained",
        HostState::Unavailable => "unavailable",
    }
}

pub fn parse_host_state(s: &str) -> Option<HostState> {
    Some(match s {
        "schedulable" => HostState::Schedulable,
        "drained" => HostState::Drained,
        "unavailable" => HostState::Unavailable,
        _ => return None,
    })
}

pub fn mode_str(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
    }
}

pub fn parse_mode(s: &str) -> Option<Mode> {
    Some(match s {
        "exclusive" => Mode::Exclusive,
        "shared" => Mode::Shared,
        _ => return None,
    })
}

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertKind {
    /// A report claimed an rCUDA endpoint another host's GPU holds (recorded on both hosts).
    EndpointConflict,
    /// An agent refused routes naming a GPU of another host as at fault.
    ForeignRefusal,
    /// Fences a host's agent never confirmed were released after `hosts.fence_timeout_secs`.
    FenceExpired,
    /// The host's agent ended a cGPU's server for holding more GPU memory than its share.
    ServerOverShare,
}

impl AlertKind {
    pub const ALL: [AlertKind; 4] = [
        AlertKind::EndpointConflict,
        AlertKind::ForeignRefusal,
        AlertKind::FenceExpired,
        AlertKind::ServerOverShare,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::EndpointConflict => "endpoint_conflict",
            AlertKind::ForeignRefusal => "foreign_refusal",
            AlertKind::FenceExpired => "fence_expired",
            AlertKind::ServerOverShare => "server_over_share",
        }
    }
}

pub use gsaas_clouds::cloud::{Checked, ServerId, VmRequest};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step is stored and read back as itself; a row an earlier gsaasd left at its
    /// `check_cloud` step resumes at the creation, and an unknown step is refused.
    #[test]
    fn saga_steps_round_trip_and_old_rows_resume() {
        let launch = [LaunchStep::CreateVm, LaunchStep::WaitActive, LaunchStep::ConfigureRoutes];
        let terminate = [
            TerminateStep::WithdrawRoutes,
            TerminateStep::DeleteServer,
            TerminateStep::ReleaseGpus,
        ];
        let steps: Vec<SagaStep> = launch
            .map(SagaStep::Launch)
            .into_iter()
            .chain(terminate.map(SagaStep::Terminate))
            .chain([SagaStep::Attach, SagaStep::Detach, SagaStep::Done])
            .collect();
        for step in &steps {
            assert_eq!(SagaStep::parse(step.as_str()), Some(*step), "{step:?}");
        }
        let mut names: Vec<&str> = steps.iter().map(|s| s.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), steps.len(), "each step its own name");
        assert_eq!(SagaStep::parse("check_cloud"), Some(SagaStep::LAUNCH));
        assert_eq!(SagaStep::parse("Create_VM"), None);
        assert!(steps.iter().filter(|s| s.is_unwinding()).count() == 3);
    }

    /// A launch stored before its check's findings were kept reads with none (its creation
    /// resolves the names again); one stored with them reads them back as they were.
    #[test]
    fn launches_stored_with_and_without_their_checks_findings_read_back() {
        let old = r#"{"vm":{"name":"vm","image":"cirros","flavor":"m1.small","networks":[]},
            "gpus":{"ncgpus":1,"gpu_memory_mib":1024,"mode":"shared"}}"#;
        let spec: LaunchSpec = serde_json::from_str(old).unwrap();
        assert_eq!(spec.resolved, None);
        assert!(!serde_json::to_string(&spec).unwrap().contains("resolved"));

        let resolved = Checked {
            flavor: "flavor-id".into(),
            image: "image-id".into(),
            networks: serde_json::json!([{ "uuid": "net-id" }]),
            flavor_resources: Some(gpgpums::Resources { cpu_milli: 2000, memory_mib: 4096 }),
        };
        let stored = LaunchSpec { resolved: Some(resolved), ..spec };
        let text = serde_json::to_string(&stored).unwrap();
        assert_eq!(serde_json::from_str::<LaunchSpec>(&text).unwrap(), stored);
    }
}
