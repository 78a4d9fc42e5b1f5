//! The pool: totals for everyone, hosts and GPUs for admins, GPU taints and evacuations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Pool totals, for everyone.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolTotals {
    pub gpus: u64,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub cgpus: u64,
    /// GPUs with nothing on them, on schedulable hosts.
    pub idle_gpus: u64,
}

/// One GPU (admins only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GpuView {
    pub id: String,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub allocated_mib: u64,
    pub exclusive: bool,
    pub cgpus: u32,
    pub jobs: u32,
    /// Its GPU server (one per GPU), `address:port`; `remoting` is the layer it speaks. (Empty
    /// from an older gsaasd, which names it `rcuda_endpoint` only.)
    #[serde(default)]
    pub gpu_server: String,
    /// Deprecated: `gpu_server`, the same value under a name that fits every layer.
    /// Kept in v1 for the clients that read it.
    #[schema(deprecated)]
    pub rcuda_endpoint: String,
    #[serde(default)]
    pub remoting: crate::RemotingParam,
    /// VMs with cGPUs here, and how many each.
    pub vms: BTreeMap<String, u32>,
    /// Why the GPU takes no new cGPUs, when it is tainted.
    pub taint: Option<String>,
    /// Why its host reports it unhealthy (it takes no new cGPUs); `null`: healthy.
    pub health: Option<String>,
    /// cGPU bookings fences hold here (routes that may still be live on a host that could not
    /// be reached, or a re-homed cGPU's old GPU): not placeable until released.
    pub fenced: u32,
    /// CUDA compute capability (`"8.0"`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub compute_capability: Option<gpgpums::MajorMinor>,
    /// The CUDA version its driver supports, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub cuda_version: Option<gpgpums::MajorMinor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its traits, those its compute capability and CUDA version give it included: what
    /// requests' `traits` match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traits: Vec<String>,
    /// Set when it is a partition (a MIG instance) of another GPU of the host, whose taint,
    /// health and evacuation cover it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionView>,
    /// How many partitions it has: a partitioned GPU takes cGPUs through them only, never
    /// whole. Left out when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub partitions: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where a partition comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PartitionView {
    /// The id of the GPU it is carved from.
    pub parent: String,
    /// Its profile, as NVIDIA names it (`1g.10gb`).
    pub profile: String,
}

/// `POST /v1/gpus/{id}/taint`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintRequest {
    /// Why the GPU must take no new cGPUs (kept with the admin's name).
    pub reason: String,
}

/// A GPU's taint after a taint or untaint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GpuTaintView {
    pub id: String,
    /// The reason given, or `null` when the GPU takes cGPUs again.
    pub taint: Option<String>,
}

/// One host's share of the pool (admins only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolHostView {
    pub name: String,
    pub kind: String,
    pub state: String,
    pub vms: u32,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolView {
    pub totals: PoolTotals,
    /// Per host and GPU (admins only), a page of hosts in registration order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<PoolHostView>>,
    /// The next page of hosts (admins), absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// How much of the free capacity is in fragments (admins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmentation: Option<FragmentationView>,
}

/// The free GPU capacity that no cGPU of the mix the pool holds could use (FGD's fragmentation:
/// a GPU's free memory counts for each kind of cGPU it is too small for, weighted by how common
/// the kind is), beside all that is free, in GPUs, over the GPUs that take new cGPUs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FragmentationView {
    pub fragmented_gpus: f64,
    pub free_gpus: f64,
    /// The cGPUs whose kinds it weighs (0: none, and nothing is a fragment).
    pub mix_cgpus: u64,
}

/// What an evacuation moved.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EvacuationView {
    /// cGPUs moved to other GPUs; their VMs keep their masked endpoints.
    pub moved: u32,
    /// The VMs whose cGPUs moved.
    pub vms: Vec<String>,
}
