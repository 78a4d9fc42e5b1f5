//! Hosts as admins see them, their agents' registrations and tokens, and fences.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A renewed agent token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentToken {
    pub token: String,
}

/// A host as gsaasd knows it (admins only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    /// Where it sits in the network: its group at each of the operator's levels (`{"zone":
    /// "z1", "rack": "r12"}`), from its agent's config or the inventory. Left out when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub topology: std::collections::BTreeMap<String, String>,
    /// Round trips (microseconds) its agent measured to GPU hosts, by host: the medians last
    /// recorded. Left out when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rtt_us: std::collections::BTreeMap<String, u32>,
    /// What its agent tried that was refused or outlived its bound, newest first (the last 20);
    /// in admins' host lists only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alerts: Option<Vec<HostAlertView>>,
    /// What the host offers the `local` VMs pinned to it (its agent's `[local_vms]`) and what
    /// they take there now (their flavors'), in `GET /v1/hosts`. Left out when it offers nothing
    /// known and holds none, and in other answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_vms: Option<LocalVmsView>,
}

/// See [`HostView::local_vms`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LocalVmsView {
    /// Absent: unknown, and only the host's GPUs bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offers: Option<ResourcesBody>,
    pub taken: ResourcesBody,
}

/// CPU (thousandths of a core: a vCPU is 1000) and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesBody {
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// A host alert (see `GET /v1/hosts`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostAlertView {
    pub at_ms: i64,
    /// `endpoint_conflict` (a report claimed an rCUDA endpoint another host's GPU holds),
    /// `foreign_refusal` (its agent refused routes blaming another host's GPU),
    /// `fence_expired` (fences its agent never confirmed were released) or `server_over_share`
    /// (its agent ended a cGPU's server for holding more GPU memory than its share).
    pub kind: String,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostList {
    pub hosts: Vec<HostView>,
}

/// `PUT /v1/hosts/{name}`: an agent's registration and heartbeat (rodvr-agent's `HostReport`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostReportBody {
    pub host: String,
    pub kind: String,
    pub agent_url: String,
    pub gpus: Vec<GpuReportBody>,
    #[serde(default)]
    pub applied_generation: Option<u64>,
    /// Where the host sits in the network: its group at each of the operator's levels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub topology: std::collections::BTreeMap<String, String>,
    /// Round trips (microseconds) to the GPU hosts `GET /v1/hosts/{name}/rtt-targets` named:
    /// at most 64, each 1 to 10,000,000, never to the host itself.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rtt_us: std::collections::BTreeMap<String, u32>,
    /// What a compute-gpu host offers the `local` VMs gsaasd pins to it (at most 100,000 cores
    /// and 1 PiB): none is put there past it. Absent: unknown, only its GPUs bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_vms: Option<ResourcesBody>,
}

/// `GET /v1/hosts/{name}/rtt-targets`: the GPU hosts whose round trips the host's agent
/// measures (a TCP connect to each one's rCUDA endpoint), nearest first, at most 64.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RttTargetsBody {
    pub targets: Vec<RttTargetBody>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RttTargetBody {
    pub host: String,
    pub address: String,
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GpuReportBody {
    pub id: String,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    /// Its GPU server (one per GPU, on the host's GPU network address), in the layer
    /// `remoting` says. Also accepted as the deprecated `rcuda` (what agents send, so that every
    /// gsaasd of the skew window reads their reports); exactly one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_server: Option<RcudaBody>,
    /// Deprecated: `gpu_server` (a name that fits every layer). Kept in v1 for the agents that
    /// send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(deprecated)]
    pub rcuda: Option<RcudaBody>,
    /// The layer its server speaks; rCUDA when absent. All of a host's GPUs speak one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remoting: Option<crate::RemotingParam>,
    /// Why the GPU is unhealthy; absent: healthy.
    #[serde(default)]
    pub unhealthy: Option<String>,
    /// CUDA compute capability (`"8.0"`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// The CUDA version its driver supports (`"12.4"`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// os-traits names or the operator's own (`CUSTOM_...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traits: Vec<String>,
    /// Set for a partition (a MIG instance): `parent` is the id of another GPU of the report,
    /// with a lower index and room for it (no partition bigger than its parent, and a parent's
    /// partitions together no bigger either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<crate::PartitionView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RcudaBody {
    pub address: String,
    pub port: u16,
    pub gpu_number: u32,
}

/// A fence: cGPU bookings kept while a host may still route to them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FenceView {
    pub id: String,
    /// The VM whose routes they were.
    pub vm: String,
    /// The host whose agent must confirm them gone (or be forgotten).
    pub host: String,
    /// Released once that agent applied a table of at least this generation.
    pub generation: u64,
    pub reason: String,
    pub created_ms: i64,
    /// The GPUs they hold, one entry per cGPU.
    pub gpus: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FenceList {
    pub fences: Vec<FenceView>,
}
