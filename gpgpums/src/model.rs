//! The vocabulary of scheduling: hosts, GPUs, requests and placements.
//!
//! These are plain data with serde derives because every other crate (the REST API, the database rows,
//! the CLI) speaks them; the behaviour lives in [`crate::Pool`]. Field names follow the REST API so the
//! API layer can map them one to one.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::ids::{GpuId, HostId, VmId};
use crate::topology::NetworkConstraint;
use crate::traits::{GpuAttributes, GpuConstraints};

/// The role a host plays in the cloud (dissertation section 5.2.1, Figure 5.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostKind {
    /// Hosts physical GPUs (served by rCUDA daemons) and may run VMs that use them locally.
    ComputeGpu,
    /// Has no GPU but sits on the GPU network: its VMs reach remote cGPUs.
    ComputeRgpu,
    /// A plain compute host, off the GPU network: it can run no cGPU VM.
    Compute,
}

impl HostKind {
    /// Whether a RODVR agent runs here, so a cGPU VM can be placed here.
    pub fn has_agent(self) -> bool {
        !matches!(self, HostKind::Compute)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HostKind::ComputeGpu => "compute-gpu",
            HostKind::ComputeRgpu => "compute-rgpu",
            HostKind::Compute => "compute",
        }
    }
}

impl fmt::Display for HostKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a host takes new cGPUs. Existing cGPUs stay where they are in every state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostState {
    #[default]
    Schedulable,
    /// Taken out of scheduling by an operator.
    Drained,
    /// Its agent stopped reporting.
    Unavailable,
}

/// The rCUDA daemon endpoint that serves one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RcudaEndpoint {
    pub address: IpAddr,
    pub port: u16,
    /// The GPU's number at that daemon (0 when a daemon serves a single GPU).
    pub gpu_number: u32,
}

/// The most characters of a partition's profile name.
pub const MAX_PROFILE_LEN: usize = 32;

/// Where a partition of a GPU (a MIG instance) comes from: the GPU it is carved from, on the
/// same host, and its profile as NVIDIA names it (`1g.10gb`, `3g.40gb`, `1g.10gb+me`).
///
/// A partition is a GPU of its own in the pool, with its own memory, model and traits. A GPU
/// with partitions serves through them only: it takes no cGPU whole, and its partitions take
/// none while it still holds cGPUs booked whole (from before it was partitioned), so a GPU and
/// its partitions are never booked together. The GPU's taint and health, and its host's state,
/// cover its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Partition {
    pub parent: GpuId,
    pub profile: String,
}

/// Why `profile` cannot be a partition's profile name, if it cannot: 1 to [`MAX_PROFILE_LEN`]
/// lowercase letters, digits, `.` and `+`, starting with a digit.
pub fn profile_name_problem(profile: &str) -> Option<String> {
    let fine = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '+';
    let good = !profile.is_empty()
        && profile.len() <= MAX_PROFILE_LEN
        && profile.starts_with(|c: char| c.is_ascii_digit())
        && profile.chars().all(fine);
    (!good).then(|| {
        let shown: String = profile.chars().take(MAX_PROFILE_LEN + 1).collect();
        format!(
            "{shown:?} is no partition profile: 1 to {MAX_PROFILE_LEN} lowercase letters, digits, \
             '.' and '+', starting with a digit (NVIDIA's names: 1g.10gb, 3g.40gb)"
        )
    })
}

/// A GPU as registered in the pool: a physical GPU, or a partition of one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub id: GpuId,
    pub host: HostId,
    /// The GPU's index on its host; with the host's registration order it fixes the pool order.
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub rcuda: RcudaEndpoint,
    /// Compute capability, CUDA version, UUID and traits, as far as known.
    #[serde(default)]
    pub attributes: GpuAttributes,
    /// Set when it is a partition of another GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
}

/// How a cGPU holds its GPU (dissertation section 5.2.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The cGPU takes a whole idle GPU; nobody else uses it.
    #[default]
    Exclusive,
    /// The cGPU reserves its memory on a GPU that other cGPUs may share.
    Shared,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        })
    }
}

/// Where the VM runs relative to its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Locality {
    /// GPUs anywhere; the cloud picks any host with a RODVR agent for the VM.
    #[default]
    Any,
    /// All cGPUs on one compute-GPU host, and the VM runs on that host.
    Local,
    /// The VM runs on a compute-rGPU host; GPUs anywhere.
    Remote,
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Locality::Any => "any",
            Locality::Local => "local",
            Locality::Remote => "remote",
        })
    }
}

/// The GPU part of a launch request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub ncgpus: u32,
    /// Memory per cGPU in MiB (the paper's `-poolmem`). Required in shared mode; in exclusive mode it is
    /// the least memory the whole GPU must have.
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub locality: Locality,
    /// Never put two cGPUs of this VM on the same physical GPU.
    #[serde(default)]
    pub distinct_gpus: bool,
    /// Which GPUs it may take and which it prefers (models, traits, versions).
    #[serde(default, skip_serializing_if = "GpuConstraints::is_empty")]
    pub constraints: GpuConstraints,
    /// What it asks of the network between the VM and its GPUs (groups, round trips).
    #[serde(default, skip_serializing_if = "NetworkConstraint::is_empty")]
    pub network: NetworkConstraint,
    /// Percent of its GPU's SMs each shared cGPU may use (MPS's active-thread percentage);
    /// none: time-sliced with the GPU's other cGPUs. Only GPUs whose host runs MPS take it, and
    /// the shares on one GPU never add up past 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u32>,
    /// The CPU and memory the VM itself takes on its host, for a `local` VM (its flavor's): a
    /// host whose [`Resources`] offered to GSaaS's VMs are known takes it only with room left.
    /// Set by the service from the flavor, never by a tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_resources: Option<Resources>,
}

/// CPU and memory: what a GPU host offers the `local` VMs GSaaS pins to it, or what one such VM
/// takes there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Resources {
    /// Thousandths of a core (a vCPU is 1000).
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// The most CPU one host or VM may have: 100,000 cores.
pub const MAX_CPU_MILLI: u64 = 100_000_000;
/// The most memory one host or VM may have: 1 PiB.
pub const MAX_MEMORY_MIB: u64 = 1 << 30;

impl Resources {
    pub fn new(cpu_milli: u64, memory_mib: u64) -> Self {
        Resources { cpu_milli, memory_mib }
    }

    /// What is out of range, as (field, reason).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if self.cpu_milli > MAX_CPU_MILLI {
            let cores = self.cpu_milli / 1000;
            return Some(("cpu_milli", format!("{cores} cores are more than 100,000")));
        }
        if self.memory_mib > MAX_MEMORY_MIB {
            let mib = self.memory_mib;
            return Some((
                "memory_mib",
                format!("{mib} MiB is more than 1 PiB ({MAX_MEMORY_MIB} MiB)"),
            ));
        }
        None
    }

    /// Whether `need` fits in what is left of `self` once `used` is taken.
    pub fn has_room(&self, used: &Resources, need: &Resources) -> bool {
        used.cpu_milli.saturating_add(need.cpu_milli) <= self.cpu_milli
            && used.memory_mib.saturating_add(need.memory_mib) <= self.memory_mib
    }
}

impl Request {
    /// `n` cGPUs with the paper's defaults: exclusive, any locality.
    pub fn exclusive(n: u32) -> Self {
        Request {
            ncgpus: n,
            gpu_memory_mib: None,
            mode: Mode::Exclusive,
            locality: Locality::Any,
            distinct_gpus: false,
            constraints: GpuConstraints::default(),
            network: NetworkConstraint::NONE,
            compute_percent: None,
            vm_resources: None,
        }
    }

    /// `n` shared cGPUs of `memory_mib` each, any locality.
    pub fn shared(n: u32, memory_mib: u64) -> Self {
        Request { gpu_memory_mib: Some(memory_mib), mode: Mode::Shared, ..Request::exclusive(n) }
    }

    pub fn with_locality(self, locality: Locality) -> Self {
        Request { locality, ..self }
    }

    pub fn with_distinct_gpus(self) -> Self {
        Request { distinct_gpus: true, ..self }
    }

    pub fn with_constraints(self, constraints: GpuConstraints) -> Self {
        Request { constraints, ..self }
    }

    pub fn with_network(self, network: NetworkConstraint) -> Self {
        Request { network, ..self }
    }

    /// A `local` VM that takes `resources` of its host's CPU and memory.
    pub fn with_vm_resources(self, resources: Resources) -> Self {
        Request { vm_resources: Some(resources), ..self }
    }

    /// Each cGPU with `percent` of its GPU's SMs (see [`Request::compute_percent`]).
    pub fn with_compute_percent(self, percent: u32) -> Self {
        Request { compute_percent: Some(percent), ..self }
    }

    /// The constraints its GPUs must meet: its own, and a host that runs MPS when it asks for a
    /// compute share.
    pub fn gpu_constraints(&self) -> std::borrow::Cow<'_, GpuConstraints> {
        if self.compute_percent.is_some() && !self.constraints.compute_share {
            let constraints = GpuConstraints { compute_share: true, ..self.constraints.clone() };
            std::borrow::Cow::Owned(constraints)
        } else {
            std::borrow::Cow::Borrowed(&self.constraints)
        }
    }
}

/// Where the cloud must run the VM so that its routes can be installed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "host", rename_all = "kebab-case")]
pub enum VmHost {
    /// On exactly this compute-GPU host (locality `local`).
    Pinned(HostId),
    /// On any schedulable compute-rGPU host (locality `remote`).
    AnyRgpuHost,
    /// On any schedulable host with a RODVR agent (locality `any`).
    AnyAgentHost,
}

/// One cGPU of a VM and the GPU that backs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgpuAssignment {
    /// The cGPU's number inside the VM (`RCUDA_DEVICE_<index>`).
    pub index: u32,
    pub gpu: GpuId,
    pub host: HostId,
    /// Memory reserved on the GPU: the request's memory when shared, the GPU's whole memory when exclusive.
    pub memory_mib: u64,
    pub mode: Mode,
    /// Percent of the GPU's SMs it may use (a shared cGPU on a host that runs MPS); none:
    /// time-sliced, or the whole GPU when exclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u8>,
    pub rcuda: RcudaEndpoint,
}

/// The outcome of a successful placement: every cGPU of the VM, and where the VM must run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub vm: VmId,
    /// The canonical name of the policy that decided.
    pub policy: String,
    pub vm_host: VmHost,
    pub cgpus: Vec<CgpuAssignment>,
    /// The CPU and memory booked for the VM on its pinned host (a `local` VM whose request
    /// gave them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_resources: Option<Resources>,
}

/// What the pool holds on one GPU, for reports and checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub id: GpuId,
    pub host: HostId,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub exclusive: bool,
    pub cgpus: u32,
    /// Distinct VMs with a cGPU on this GPU.
    pub jobs: u32,
    pub rcuda: RcudaEndpoint,
    #[serde(default)]
    pub attributes: GpuAttributes,
    /// Why the GPU takes no new cGPUs, when it is tainted.
    pub taint: Option<String>,
    /// Why its host reports it unhealthy (it takes no new cGPUs either).
    #[serde(default)]
    pub health: Option<String>,
    /// Set when it is a partition of another GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
    /// How many partitions it has (then it takes no cGPU whole).
    #[serde(default)]
    pub partitions: u32,
}

/// The whole pool's sums ([`crate::Pool::totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageTotals {
    pub gpus: u64,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub cgpus: u64,
    /// GPUs without cGPUs on schedulable hosts.
    pub idle_gpus: u64,
}

/// What the pool holds on one host, for reports and checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostUsage {
    pub id: HostId,
    pub kind: HostKind,
    pub state: HostState,
    pub gpus: u32,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    /// Distinct VMs with a cGPU on this host's GPUs.
    pub vms: u32,
}
