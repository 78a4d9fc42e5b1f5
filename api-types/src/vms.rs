//! VMs: a launch and an attach as requested, a VM as viewed, and the launch's stage timings.

use std::collections::BTreeMap;

use gpgpums::{Locality, MajorMinor, Mode, NetworkConstraint, Strength};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ModeParam {
    /// Each cGPU takes a whole idle GPU (the default, as in the dissertation).
    #[default]
    Exclusive,
    /// Each cGPU reserves `gpu_memory_mib` on a GPU others may share.
    Shared,
}

/// The remote-GPU layer a GPU's server speaks, and so the client a VM uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RemotingParam {
    /// rCUDA: `RCUDA_DEVICE_COUNT`, `RCUDA_DEVICE_<j>`.
    #[default]
    Rcuda,
    /// LUPINE (formerly SCUDA): `LUPINE_SERVER`; at most 16 cGPUs per VM.
    Lupine,
}

impl From<RemotingParam> for gpgpums::Remoting {
    fn from(r: RemotingParam) -> Self {
        match r {
            RemotingParam::Rcuda => gpgpums::Remoting::Rcuda,
            RemotingParam::Lupine => gpgpums::Remoting::Lupine,
        }
    }
}

impl From<gpgpums::Remoting> for RemotingParam {
    fn from(r: gpgpums::Remoting) -> Self {
        match r {
            gpgpums::Remoting::Rcuda => RemotingParam::Rcuda,
            gpgpums::Remoting::Lupine => RemotingParam::Lupine,
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

/// GPU models by exact name (as `GET /v1/pool` lists them): one, or a list of which any will do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum GpuModels {
    One(String),
    AnyOf(Vec<String>),
}

impl GpuModels {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            GpuModels::One(model) => vec![model],
            GpuModels::AnyOf(models) => models,
        }
    }
}

/// Traits (os-traits names such as `HW_GPU_CUDA_COMPUTE_CAPABILITY_V8_0`, or the cloud's own
/// `CUSTOM_...`) a VM's GPUs must have, must not have, should have, or should rather not have.
/// Required and forbidden filter; preferred and avoided rank the GPUs left, one step per trait,
/// before the placement policy decides among equals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TraitsParam {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbidden: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
}

impl TraitsParam {
    pub fn is_empty(&self) -> bool {
        *self == TraitsParam::default()
    }
}

/// How firmly a launch wants its VM and GPUs in one group (`network.same`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StrengthParam {
    /// No group has room: the launch fails (507), or waits with `queue`.
    #[default]
    Required,
    /// No group has room: the cGPUs go anywhere.
    Preferred,
}

impl From<StrengthParam> for Strength {
    fn from(strength: StrengthParam) -> Strength {
        match strength {
            StrengthParam::Required => Strength::Required,
            StrengthParam::Preferred => Strength::Preferred,
        }
    }
}

impl From<Strength> for StrengthParam {
    fn from(strength: Strength) -> StrengthParam {
        match strength {
            Strength::Required => StrengthParam::Required,
            Strength::Preferred => StrengthParam::Preferred,
        }
    }
}

/// What a launch asks of the network between its VM and its GPUs. The cloud's operator names
/// the levels (`zone`, `rack`, `switch`); where each host sits is never shown to tenants.
/// Locality `local` meets all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkParam {
    /// The VM and every cGPU in one group at this level. A level no host has: 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "rack")]
    pub same: Option<String>,
    /// Whether `same` must hold (the default) or is preferred.
    #[serde(default, skip_serializing_if = "is_required")]
    pub strength: StrengthParam,
    /// The longest round trip (microseconds) from the VM's host to each of its GPUs' hosts, as
    /// the hosts' agents measure it: GPUs never measured from a host are too far from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rtt_us: Option<u32>,
    /// Prefer GPUs in the VM's innermost group (same switch), then the next level out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nearest: bool,
}

fn is_required(strength: &StrengthParam) -> bool {
    *strength == StrengthParam::Required
}

impl NetworkParam {
    pub fn is_empty(&self) -> bool {
        *self == NetworkParam::default()
    }
}

impl From<NetworkParam> for NetworkConstraint {
    fn from(network: NetworkParam) -> NetworkConstraint {
        NetworkConstraint {
            same: network.same,
            strength: network.strength.into(),
            max_rtt_us: network.max_rtt_us,
            nearest: network.nearest,
        }
    }
}

impl From<&NetworkConstraint> for NetworkParam {
    fn from(network: &NetworkConstraint) -> NetworkParam {
        NetworkParam {
            same: network.same.clone(),
            strength: network.strength.into(),
            max_rtt_us: network.max_rtt_us,
            nearest: network.nearest,
        }
    }
}

/// `POST /v1/vms`: the VM part and the GPU part of a launch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// The VM's name; default `gsaas-<first 8 characters of its id>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Image name or id; the service's `launch.default_image` when absent (none configured:
    /// 422 naming `image`).
    #[serde(default)]
    pub image: Option<String>,
    /// Flavor name or id; the service's `launch.default_flavor` when absent.
    #[serde(default)]
    pub flavor: Option<String>,
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
    /// Shared mode: each cGPU's share of its GPU's SMs, in percent (1-100), held by NVIDIA MPS
    /// on hosts that run it; the shares on one GPU never add up past 100. Absent: no share, the
    /// GPU time-sliced among its cGPUs. Where no GPU the request may take runs MPS: 422 naming
    /// `compute_percent`.
    #[serde(default)]
    pub compute_percent: Option<u32>,
    /// The remote-GPU layer the VM's client speaks: every cGPU's server speaks it, now and after
    /// attach or re-homing. The service's default when absent. A layer no GPU speaks: 422.
    #[serde(default)]
    pub remoting: Option<RemotingParam>,
    /// Only GPUs of this model, or of one of these. A model no GPU of the cloud is: 422.
    #[serde(default)]
    pub gpu_model: Option<GpuModels>,
    /// Traits the GPUs must have, must not have, or are ranked by. A trait no GPU has, or
    /// constraints no GPU meets together: 422 naming the first that rules every GPU out.
    #[serde(default)]
    pub traits: TraitsParam,
    /// Only GPUs of at least this CUDA compute capability (`"8.0"`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "8.0")]
    pub min_compute_capability: Option<MajorMinor>,
    /// Only GPUs whose driver supports at least this CUDA version (`"12.2"`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "12.2")]
    pub min_cuda_version: Option<MajorMinor>,
    /// Where the GPUs may be in the network relative to the VM: one group at a level, a
    /// longest round trip, the nearest. New cGPUs attached later follow it.
    #[serde(default)]
    pub network: NetworkParam,
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
    /// Past the project's quota, run on what its cohort's other projects leave unused: the cGPUs
    /// past the quota are `borrowed` and may be taken back when their owners need them. Absent:
    /// the project's default in its cohort; outside a cohort there is nothing to borrow.
    #[serde(default)]
    pub borrow: Option<bool>,
}

/// `POST /v1/vms/{id}/cgpus`: cGPUs to attach to a ready VM. They follow the VM's locality.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    /// Shared mode: each new cGPU's share of its GPU's SMs, in percent (as at launch). A `local`
    /// VM whose host does not run MPS: 422 naming `compute_percent`.
    #[serde(default)]
    pub compute_percent: Option<u32>,
    /// Placement policy; the VM's when absent.
    #[serde(default)]
    pub policy: Option<String>,
    /// When the GPUs are not there now, wait in the queue (answered 202, the VM unchanged, the
    /// attach in its `queued_attaches`) instead of failing with 507.
    #[serde(default)]
    pub queue: bool,
    /// Past the project's quota, borrow from its cohort (as at launch); absent: the project's
    /// default.
    #[serde(default)]
    pub borrow: Option<bool>,
}

/// One cGPU of a VM.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CgpuView {
    /// The cGPU's number for its whole life (it fixes its masked endpoint); detach it by this.
    pub index: u32,
    /// `live`; `attaching` while its route is installed; `detaching` while it is withdrawn.
    pub state: CgpuState,
    /// Where the VM reaches this cGPU (`ip:port`).
    pub masked_endpoint: String,
    pub memory_mib: u64,
    pub mode: String,
    /// Its share of its GPU's SMs, percent; absent: none (time-sliced, or the whole GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u8>,
    /// On loan: admitted past the project's quota, on what its cohort lends, and the project
    /// still holds more than its quota. It may be taken back when a lender needs its own (the
    /// youngest loans first; the VM keeps its other cGPUs).
    #[serde(default)]
    pub borrowed: bool,
    /// The physical GPU (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The GPU's host (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The real GPU server, in the VM's layer, `address:port` (admins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_server: Option<String>,
    /// Deprecated: `gpu_server`, the same value under a name that fits every layer (admins
    /// only). Kept in v1 for the clients that read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(deprecated)]
    pub rcuda_endpoint: Option<String>,
}

/// The GPU part of the request, as accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GpuRequestView {
    pub ncgpus: u32,
    pub gpu_memory_mib: Option<u64>,
    pub mode: ModeParam,
    pub locality: LocalityParam,
    pub distinct_gpus: bool,
    /// Each cGPU's share of its GPU's SMs, percent, as asked at launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u32>,
    /// The layer every cGPU of the VM speaks.
    #[serde(default)]
    pub remoting: RemotingParam,
    /// The models asked for (any of them); absent: any model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_model: Vec<String>,
    #[serde(default, skip_serializing_if = "TraitsParam::is_empty")]
    pub traits: TraitsParam,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub min_compute_capability: Option<MajorMinor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub min_cuda_version: Option<MajorMinor>,
    #[serde(default, skip_serializing_if = "NetworkParam::is_empty")]
    pub network: NetworkParam,
    /// The policy that placed the cGPUs.
    pub policy: String,
}

/// A cGPU-enabled VM.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued_attaches: Vec<WaitingView>,
    pub priority: i32,
    pub preemptible: bool,
    /// Whether cGPUs taken back from this VM are given back when capacity returns.
    pub give_back: bool,
    /// What happened to the VM that its owner should know of, oldest first (the last 100 on
    /// `GET /v1/vms/{id}`, the last 20 in lists): `preempted` (cGPUs of a preemptible VM taken
    /// back), `given_back`, `attached` (a queued attach started), `queue_timeout` (a queued
    /// attach waited too long), `attach_refused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
    /// The VM's remote-GPU environment, as its cloud-init sets it and its host's agent answers
    /// it: its layer's variables (rCUDA's `RCUDA_DEVICE_*`, LUPINE's `LUPINE_SERVER`) for its
    /// live cGPUs in order, `GSAAS_CGPUS` (the cGPU index of each device) and
    /// `GSAAS_CGPUS_MISSING` (cGPUs with no route now, whose devices are left out).
    #[serde(default)]
    pub gpu_env: BTreeMap<String, String>,
    /// rCUDA's variables alone, for an rCUDA VM (empty for others): kept for clients that read
    /// it before `gpu_env`.
    pub rcuda_env: BTreeMap<String, String>,
    /// Seconds per stage of the dissertation's Equation 5.1.
    pub timings: Timings,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// One event of a VM.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VmEventView {
    pub at_ms: i64,
    pub kind: String,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VmList {
    pub vms: Vec<VmView>,
    /// The next page, absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// What a request in the queue waits for, and since when.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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

impl ModeParam {
    pub fn as_str(self) -> &'static str {
        match self {
            ModeParam::Exclusive => "exclusive",
            ModeParam::Shared => "shared",
        }
    }
}

impl LocalityParam {
    pub fn as_str(self) -> &'static str {
        match self {
            LocalityParam::Any => "any",
            LocalityParam::Local => "local",
            LocalityParam::Remote => "remote",
        }
    }
}

fn yes() -> bool {
    true
}

impl From<Locality> for LocalityParam {
    fn from(locality: Locality) -> LocalityParam {
        match locality {
            Locality::Any => LocalityParam::Any,
            Locality::Local => LocalityParam::Local,
            Locality::Remote => LocalityParam::Remote,
        }
    }
}

impl From<LocalityParam> for Locality {
    fn from(locality: LocalityParam) -> Locality {
        match locality {
            LocalityParam::Any => Locality::Any,
            LocalityParam::Local => Locality::Local,
            LocalityParam::Remote => Locality::Remote,
        }
    }
}

/// The launch stages of Equation 5.1, in the order a launch completes them (`total` is their
/// sum with the time before the first).
pub const LAUNCH_STAGES: [&str; 6] = [
    "check",
    "gpu_selection",
    "vm_creation",
    "vm_activation",
    "vm_deployment",
    "rodvr_configuration",
];

/// Per-stage times in seconds, named after the dissertation's Equation 5.1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_selection: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_creation: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_activation: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_deployment: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rodvr_configuration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
}

/// Where a cGPU is in its life on a running VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CgpuState {
    /// Booked and routed (or, on a VM still launching, about to be).
    Live,
    /// Booked; its route is being installed.
    Attaching,
    /// Its route is withdrawn; its booking is released next.
    Detaching,
    /// Its GPU failed and no other GPU could take it: no route, booked where it was until it can
    /// be re-homed or its owner detaches it.
    Lost,
}

impl CgpuState {
    pub fn as_str(self) -> &'static str {
        match self {
            CgpuState::Live => "live",
            CgpuState::Attaching => "attaching",
            CgpuState::Detaching => "detaching",
            CgpuState::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "live" => CgpuState::Live,
            "attaching" => CgpuState::Attaching,
            "detaching" => CgpuState::Detaching,
            "lost" => CgpuState::Lost,
            _ => return None,
        })
    }
}

impl Timings {
    /// Its fields' names: [`LAUNCH_STAGES`], then `total`.
    pub fn names() -> impl Iterator<Item = &'static str> {
        LAUNCH_STAGES.into_iter().chain(["total"])
    }

    /// The seconds of `stage` (one of [`LAUNCH_STAGES`], or `total`), once it completed.
    pub fn of(&self, stage: &str) -> Option<f64> {
        match stage {
            "check" => self.check,
            "gpu_selection" => self.gpu_selection,
            "vm_creation" => self.vm_creation,
            "vm_activation" => self.vm_activation,
            "vm_deployment" => self.vm_deployment,
            "rodvr_configuration" => self.rodvr_configuration,
            "total" => self.total,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_launch_stage_is_a_timings_field() {
        for stage in LAUNCH_STAGES.iter().chain(&["total"]) {
            let timings: Timings =
                serde_json::from_value(serde_json::json!({ *stage: 1.5 })).unwrap();
            assert_eq!(timings.of(stage), Some(1.5), "{stage}");
            let back = serde_json::to_value(&timings).unwrap();
            assert_eq!(back, serde_json::json!({ *stage: 1.5 }), "{stage}");
        }
        assert_eq!(Timings::default().of("check"), None);
        assert_eq!(Timings::default().of("no_such_stage"), None);
    }

    #[test]
    fn requests_refuse_unknown_fields_and_views_accept_them() {
        let launch = serde_json::json!({"image": "i", "flavor": "f", "ncgpus": 1, "ncpgus": 2});
        let err = serde_json::from_value::<LaunchRequest>(launch).unwrap_err().to_string();
        assert!(err.contains("ncpgus"), "{err}");
        let event = serde_json::json!({"at_ms": 1, "kind": "k", "detail": "d", "new_field": 1});
        assert!(serde_json::from_value::<VmEventView>(event).is_ok());
    }
}
