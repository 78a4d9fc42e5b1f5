//! Wire types shared by the agent and the controller (`gsaasd`).
//!
//! The controller always sends a host's *complete* route table with a generation number instead of
//! "add this route" / "remove that route" calls: a lost or repeated request then cannot leave the
//! host half-configured, and the agent can persist and re-apply the table on its own after a
//! restart. Validation lives here, next to the types, so both sides reject the same tables and name
//! the offending entry the same way (`routes[3].masked: ...`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::str::FromStr;

use gpgpums::ids::{GpuId, HostId, VmId};
use serde::{Deserialize, Serialize};

/// Audience every controller-signed token for an agent must carry.
pub const AGENT_AUDIENCE: &str = "rodvr-agent";

/// The highest route-table generation either side accepts. The controller stores generations as
/// signed 64-bit integers and adds one per push, so a generation must stay far below `i64::MAX`;
/// 2^53 is also exact in every JSON parser. At a million pushes a second it lasts 285 years.
pub const MAX_GENERATION: u64 = 1 << 53;

/// Why a generation is out of range, naming the limit.
pub fn check_generation(generation: u64) -> Result<(), String> {
    if generation > MAX_GENERATION {
        Err(format!("generation {generation} is above the maximum {MAX_GENERATION}"))
    } else {
        Ok(())
    }
}

/// The complete set of masked routes a host must serve, at one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteTable {
    pub generation: u64,
    /// Each VM's routes in the order of its rCUDA devices (`RCUDA_DEVICE_0`, ...).
    pub routes: Vec<Route>,
    /// The masked endpoint where each VM of the table reads its own rCUDA environment from the
    /// agent (see the agent's `metadata` module); none: the agent serves no environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<SocketAddrV4>,
    /// The host's VMs that have no cGPU left (all detached): no route carries their traffic, but
    /// they still read their environment, now empty, at the metadata endpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vms_without_cgpus: Vec<VmPort>,
    /// cGPUs of the table's VMs that have no route (lost: their GPU failed and no other could
    /// take them), so that a VM's environment says they are missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostCgpu>,
    /// On a host that runs its GPUs' servers ([`ManagedServers`]): the cGPUs of its GPUs, each
    /// of which gets a server of its own. Empty on every other host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerSpec>,
}

/// A cGPU with no route, of a VM of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LostCgpu {
    pub vm: VmId,
    pub index: u32,
    /// Set where this cGPU's server is one of this table's (`servers`) and gsaasd does not know
    /// it to accept yet: the agent routes the cGPU itself, to its own server's port once that
    /// accepts, and says so in its answer ([`ServerStatus::routed_here`]). An agent that
    /// predates the field leaves the cGPU lost until gsaasd pushes its route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub here: Option<ServedHere>,
}

/// Where a VM reaches a cGPU whose server runs on the VM's own host (see [`LostCgpu::here`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServedHere {
    /// The endpoint the VM connects to (inside the agent's masked range).
    pub masked: SocketAddrV4,
    /// As [`Route::gpu_number`].
    #[serde(default)]
    pub gpu_number: u32,
}

impl LostCgpu {
    /// A lost cGPU with no server of the table.
    pub fn new(vm: VmId, index: u32) -> Self {
        Self { vm, index, here: None }
    }
}

/// Where one VM's packets come from on this host: its tap and fixed IP (see [`Route`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VmPort {
    pub vm: VmId,
    pub vm_ip: Ipv4Addr,
    pub vm_tap: String,
    /// The layer its cGPUs speak, so that its environment is its layer's even with no route.
    #[serde(default, skip_serializing_if = "gpgpums::Remoting::is_rcuda")]
    pub remoting: gpgpums::Remoting,
}

/// One cGPU of one VM: the VM's traffic to `masked` is rerouted to the rCUDA server at `target`.
///
/// A route matches only packets that arrive on the VM's tap *and* carry its fixed IP: a VM cannot
/// change the tap its packets arrive on, so another VM that takes this VM's address (spoofing it,
/// or because tenant networks overlap) matches nothing of this VM's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    pub vm: VmId,
    /// The VM's fixed IP.
    pub vm_ip: Ipv4Addr,
    /// The VM's tap interface on this host.
    pub vm_tap: String,
    /// The endpoint the VM connects to (inside the agent's masked range).
    pub masked: SocketAddrV4,
    /// The real rCUDA endpoint on the GPU network.
    pub target: SocketAddrV4,
    /// The GPU's number at that rCUDA server (`RCUDA_DEVICE_<n>=<masked>:<gpu_number>`).
    #[serde(default)]
    pub gpu_number: u32,
    /// The cGPU's index in its VM; absent from a controller that predates it (then its place
    /// among the VM's routes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The layer the server at `target` speaks (every route of a VM speaks one).
    #[serde(default, skip_serializing_if = "gpgpums::Remoting::is_rcuda")]
    pub remoting: gpgpums::Remoting,
}

pub use crate::env::{GpuDevice, GpuEnv};
pub use crate::limits::{InvalidEntry, MAX_GPU_MEMORY_MIB, MAX_HEALTH_LEN};
pub use crate::servers::{
    ManagedServers, ServerSpec, ServerState, ServerStatus, MAX_SERVERS_PER_HOST, MAX_SERVER_CLIENTS,
};

/// An IPv4 prefix such as `100.127.0.0/16` (the masked range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    len: u8,
}

/// Why a string is not an IPv4 prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IPv4 prefix like 100.127.0.0/16 with no host bits set")]
pub struct CidrError(String);

impl Ipv4Cidr {
    pub fn new(network: Ipv4Addr, len: u8) -> Option<Self> {
        let cidr = Self { network, len };
        (len <= 32 && u32::from(network) & !cidr.mask() == 0).then_some(cidr)
    }

    fn mask(self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        }
    }

    pub fn network(self) -> Ipv4Addr {
        self.network
    }

    pub fn prefix_len(self) -> u8 {
        self.len
    }

    /// The last address of the prefix.
    pub fn last(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) | !self.mask())
    }

    pub fn contains(self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.network)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, CidrError> {
        let bad = || CidrError(s.to_owned());
        let (addr, len) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        Self::new(addr, len).ok_or_else(bad)
    }
}

impl Serialize for Ipv4Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Linux limits interface names to 15 bytes; nft compares them as strings.
const MAX_IFNAME_LEN: usize = 15;

fn check_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_IFNAME_LEN {
        return Err(format!("interface name must be 1 to {MAX_IFNAME_LEN} bytes long"));
    }
    if name.chars().any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err("interface name may only hold letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

impl RouteTable {
    /// Checks every route; `masked_range` is the agent's configured range (`None`: no range check).
    pub fn validate(&self, masked_range: Option<Ipv4Cidr>) -> Result<(), InvalidEntry> {
        check_generation(self.generation)
            .map_err(|reason| InvalidEntry { entry: "generation".into(), reason })?;
        let mut seen: HashMap<(&str, SocketAddrV4), usize> = HashMap::new();
        // Each tap is one VM's, with one address and one remote-GPU layer (its client is one
        // library).
        let mut taps: HashMap<&str, (VmId, Ipv4Addr, String, gpgpums::Remoting)> = HashMap::new();
        let routed = self.routes.iter().enumerate().map(|(i, r)| {
            (format!("routes[{i}]"), r.vm, r.vm_ip, r.vm_tap.as_str(), true, r.remoting)
        });
        let idle = self.vms_without_cgpus.iter().enumerate().map(|(i, p)| {
            (format!("vms_without_cgpus[{i}]"), p.vm, p.vm_ip, p.vm_tap.as_str(), false, p.remoting)
        });
        for (entry, vm, ip, tap, has_route, layer) in routed.chain(idle) {
            let bad = |field: &str, reason: String| InvalidEntry {
                entry: format!("{entry}.{field}"),
                reason,
            };
            check_ifname(tap).map_err(|r| bad("vm_tap", r))?;
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
                return Err(bad("vm_ip", format!("{ip} is not a unicast address")));
            }
            match taps.get(tap) {
                Some((owner, owner_ip, first, _)) if (*owner, *owner_ip) != (vm, ip) => {
                    return Err(bad(
                        "vm_tap",
                        format!("{tap} is {first}'s, of another VM or address"),
                    ));
                }
                // A VM without cGPUs is listed once, and has no route.
                Some((_, _, first, _)) if !has_route => {
                    return Err(bad("vm", format!("{vm} is listed already, at {first}")));
                }
                Some((_, _, first, first_layer)) if *first_layer != layer => {
                    return Err(bad(
                        "remoting",
                        format!("{layer} while {first} of the same VM is {first_layer}"),
                    ));
                }
                Some(_) => {}
                None => {
                    taps.insert(tap, (vm, ip, entry, layer));
                }
            }
        }
        // A lost cGPU is one of a listed VM's, listed once, and has no route. (Checked only
        // when there are some: this runs on every push.)
        if !self.lost.is_empty() {
            let listed: HashSet<VmId> = taps.values().map(|(vm, ..)| *vm).collect();
            let mut indexes: HashSet<(VmId, u32)> =
                self.routes.iter().filter_map(|r| Some((r.vm, r.index?))).collect();
            for (i, lost) in self.lost.iter().enumerate() {
                let bad = |field: &str, reason: String| InvalidEntry {
                    entry: format!("lost[{i}].{field}"),
                    reason,
                };
                if !listed.contains(&lost.vm) {
                    return Err(bad("vm", format!("{} is no VM of the table", lost.vm)));
                }
                if !indexes.insert((lost.vm, lost.index)) {
                    return Err(bad(
                        "index",
                        format!("cGPU {} of {} is listed twice, or routed", lost.index, lost.vm),
                    ));
                }
            }
        }
        for (i, route) in self.routes.iter().enumerate() {
            let bad = |field: &str, reason: String| InvalidEntry {
                entry: format!("routes[{i}].{field}"),
                reason,
            };
            for (field, endpoint) in [("masked", route.masked), ("target", route.target)] {
                if endpoint.port() == 0 {
                    return Err(bad(field, "port must be between 1 and 65535".into()));
                }
                let ip = *endpoint.ip();
                if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                    return Err(bad(field, format!("{ip} is not a unicast address")));
                }
            }
            if let Some(range) = masked_range {
                if !range.contains(*route.masked.ip()) {
                    return Err(bad(
                        "masked",
                        format!("{} is outside the masked range {range}", route.masked.ip()),
                    ));
                }
                if range.contains(*route.target.ip()) {
                    return Err(bad(
                        "target",
                        format!("{} is inside the masked range", route.target),
                    ));
                }
            }
            if let Some(first) = seen.insert((&route.vm_tap, route.masked), i) {
                return Err(bad(
                    "masked",
                    format!("{} is already used by routes[{first}] for the same VM", route.masked),
                ));
            }
            if Some(route.masked) == self.metadata {
                return Err(bad("masked", format!("{} is the metadata endpoint", route.masked)));
            }
        }
        crate::servers::validate_specs(&self.servers)?;
        self.validate_served_here(masked_range, &taps, &seen)?;
        if let Some(metadata) = self.metadata {
            let bad = |reason: String| InvalidEntry { entry: "metadata".into(), reason };
            if metadata.port() == 0 {
                return Err(bad("port must be between 1 and 65535".into()));
            }
            if let Some(range) = masked_range {
                if !range.contains(*metadata.ip()) {
                    return Err(bad(format!(
                        "{} is outside the masked range {range}",
                        metadata.ip()
                    )));
                }
            }
        }
        Ok(())
    }
}

impl RouteTable {
    /// The lost cGPUs routed to this host's own servers ([`LostCgpu::here`]): each names a server
    /// of the table, at a masked endpoint its VM uses for nothing else.
    fn validate_served_here(
        &self,
        masked_range: Option<Ipv4Cidr>,
        taps: &HashMap<&str, (VmId, Ipv4Addr, String, gpgpums::Remoting)>,
        seen: &HashMap<(&str, SocketAddrV4), usize>,
    ) -> Result<(), InvalidEntry> {
        if self.lost.iter().all(|l| l.here.is_none()) {
            return Ok(());
        }
        let tap_of: HashMap<VmId, &str> = taps.iter().map(|(tap, (vm, ..))| (*vm, *tap)).collect();
        let served: HashSet<(VmId, u32)> = self.servers.iter().map(|s| (s.vm, s.index)).collect();
        let mut used: HashSet<(&str, SocketAddrV4)> = HashSet::new();
        for (i, lost) in self.lost.iter().enumerate() {
            let Some(here) = lost.here else { continue };
            let bad = |reason: String| InvalidEntry { entry: format!("lost[{i}].here"), reason };
            if !served.contains(&(lost.vm, lost.index)) {
                return Err(bad(format!(
                    "cGPU {} of {} has no server in this table",
                    lost.index, lost.vm
                )));
            }
            let masked = here.masked;
            let ip = *masked.ip();
            if masked.port() == 0 {
                return Err(bad("port must be between 1 and 65535".into()));
            }
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                return Err(bad(format!("{ip} is not a unicast address")));
            }
            if let Some(range) = masked_range {
                if !range.contains(ip) {
                    return Err(bad(format!("{ip} is outside the masked range {range}")));
                }
            }
            if Some(masked) == self.metadata {
                return Err(bad(format!("{masked} is the metadata endpoint")));
            }
            // The lost check above placed its VM in the table.
            let tap = tap_of.get(&lost.vm).copied().unwrap_or_default();
            if seen.contains_key(&(tap, masked)) || !used.insert((tap, masked)) {
                return Err(bad(format!("{masked} is already used by the same VM")));
            }
        }
        Ok(())
    }
}

/// What a successful `PUT` of a route table did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyStatus {
    pub generation: u64,
    pub routes: usize,
    pub outcome: ApplyOutcome,
    /// Each server of the table, in its order, as it stands once the agent answers (a new one
    /// is `ready` unless it did not accept in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyOutcome {
    /// A new generation was persisted and applied.
    Applied,
    /// The same generation and content was already held; it was (re-)applied.
    Unchanged,
}

/// What the agent holds (desired, persisted) and what is in the host's firewall (applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedState {
    /// The last accepted table, as persisted in the state file.
    pub desired: Option<RouteTable>,
    /// Generation of the table currently in the firewall, if any was applied.
    pub applied_generation: Option<u64>,
    /// Why the desired table is not applied, when it is not.
    pub apply_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub applied_generation: Option<u64>,
}

/// The error body every non-2xx agent response carries. It also reads gsaasd's problem documents
/// (their `detail`), so an agent logs why the controller refused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(alias = "detail")]
    pub error: String,
    /// The table entry at fault when a table is refused (`routes[3].target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
}

/// The two kinds of host that run an agent (dissertation section 5.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostKind {
    /// Has GPUs and rCUDA servers; may host VMs that use them locally.
    ComputeGpu,
    /// Has no GPUs; its VMs reach remote GPUs over the GPU network.
    ComputeRgpu,
}

/// What an agent tells the controller about its host (`PUT {controller}/v1/hosts/{host}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    pub host: HostId,
    pub kind: HostKind,
    /// Where the controller reaches this agent's API.
    pub agent_url: String,
    pub gpus: Vec<GpuReport>,
    /// Generation of the route table in the host's firewall.
    pub applied_generation: Option<u64>,
    /// Where the host sits in the network (its config's `[topology]`): its group at each of the
    /// operator's levels. Left out when none.
    #[serde(default, skip_serializing_if = "gpgpums::Topology::is_empty")]
    pub topology: gpgpums::Topology,
    /// Round trips (microseconds) from this host to the GPU hosts gsaasd named
    /// ([`RttTargets`]): the median of the last few TCP connects to each one's rCUDA endpoint.
    /// Left out until the agent has measured (gsaasd keeps what it had), empty when it reached
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_us: Option<BTreeMap<HostId, u32>>,
    /// Set when the agent runs its GPUs' servers itself, one per cGPU (see [`ServerSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedServers>,
    /// The host's address on the GPU network (its GPU interface's), which its VMs' traffic to
    /// GPU servers comes from: managed servers of other hosts take only their own cGPUs' VM
    /// hosts (see [`ServerSpec::clients`]). Left out when the agent does not know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_address: Option<Ipv4Addr>,
    /// The CPU and memory the host offers the `local` VMs gsaasd pins to it (its config's
    /// `[local_vms]`): gsaasd puts none there past them. Left out: unknown, only GPUs bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_vms: Option<gpgpums::Resources>,
}

/// The most GPU hosts an agent measures round trips to.
pub const MAX_RTT_TARGETS: usize = 64;

/// A GPU host whose round trip an agent measures: a TCP connect to its rCUDA endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RttTarget {
    pub host: HostId,
    pub address: std::net::IpAddr,
    pub port: u16,
}

/// `GET /v1/hosts/{host}/rtt-targets`: the GPU hosts nearest the host (at most
/// [`MAX_RTT_TARGETS`]), whose round trips its agent measures and reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RttTargets {
    pub targets: Vec<RttTarget>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub id: GpuId,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    /// Its GPU server. On the wire `rcuda`, which every gsaasd of the skew window reads; a
    /// report may name it `gpu_server`, the layer-neutral name (one of the two).
    #[serde(alias = "gpu_server")]
    pub rcuda: RcudaEndpoint,
    /// Why the GPU is unhealthy (XID or uncorrectable ECC errors, gone from the bus, or what the
    /// host's config says); absent: healthy. An unhealthy GPU takes no new cGPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
    /// Compute capability, CUDA version, UUID and traits, as far as the agent knows them (NVML,
    /// its config): `compute_capability`, `cuda_version`, `uuid`, `traits` beside the fields
    /// above, each left out when unknown.
    #[serde(flatten)]
    pub attributes: gpgpums::GpuAttributes,
    /// Set when it is a partition (a MIG instance) of another GPU of the report: that GPU's id
    /// and the partition's profile (`1g.10gb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<gpgpums::Partition>,
}

/// `reason` as a report may carry it: control characters replaced, cut to [`MAX_HEALTH_LEN`]
/// bytes (at a character boundary), never empty.
pub fn health_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_HEALTH_LEN));
    for c in reason.chars().map(|c| if c.is_control() { ' ' } else { c }) {
        if out.len() + c.len_utf8() > MAX_HEALTH_LEN {
            break;
        }
        out.push(c);
    }
    let trimmed = out.trim();
    if trimmed.is_empty() {
        "unhealthy".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The rCUDA daemon serving one GPU. With one daemon per GPU, `gpu_number` is 0: the VM always
/// uses its cGPU as device 0 and learns nothing about the host's GPU layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RcudaEndpoint {
    pub address: Ipv4Addr,
    pub port: u16,
    pub gpu_number: u32,
}

impl RcudaEndpoint {
    pub fn socket_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.address, self.port)
    }
}

/// The most GPUs one host may report.
pub const MAX_GPUS_PER_HOST: usize = 256;

/// The most whole GPUs a host may have for [`partition_index`] to number its partitions apart
/// from them.
pub const MAX_WHOLE_GPUS_WITH_PARTITIONS: u32 = 100;

/// The index agents and gsaasd's inventory give partition `nth` of the GPU at index `parent`:
/// 100 per GPU after the first 100 (a host with partitions has at most
/// [`MAX_WHOLE_GPUS_WITH_PARTITIONS`] whole GPUs, and a GPU at most 7 MIG instances today), so a
/// partition's index, and its rCUDA port, stay put when other GPUs come and go.
pub fn partition_index(parent: u32, nth: u32) -> u32 {
    100 * (parent + 1) + nth
}
/// The highest device number an rCUDA daemon may give a GPU.
pub const MAX_GPU_NUMBER: u32 = 1023;
pub const MAX_MODEL_LEN: usize = 128;
pub const MAX_URL_LEN: usize = 2048;

/// Why `endpoint` cannot be a GPU's rCUDA server: the port must not be 0, and the address must be
/// a unicast address of the GPU network, outside the masked range (VMs reach masked addresses
/// only through routes, so a server there would be unreachable, and a route to it refused).
pub fn check_rcuda_endpoint(endpoint: SocketAddrV4, masked_range: Ipv4Cidr) -> Result<(), String> {
    let ip = *endpoint.ip();
    if endpoint.port() == 0 {
        return Err("port must be between 1 and 65535".into());
    }
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(format!("{ip} is not a unicast address of the GPU network"));
    }
    if masked_range.contains(ip) {
        return Err(format!("{ip} is inside the masked range {masked_range}"));
    }
    Ok(())
}

/// The host-local part of a GPU id, which must read `<host>:<local>` with no `:` in `<local>`:
/// every host names only its own GPUs, and no two hosts can name the same one.
pub fn gpu_local_id<'a>(host: &HostId, id: &'a GpuId) -> Result<&'a str, String> {
    id.as_str()
        .strip_prefix(host.as_str())
        .and_then(|rest| rest.strip_prefix(':'))
        .filter(|local| !local.is_empty() && !local.contains(':'))
        .ok_or_else(|| format!("{id} is not one of host {host}'s GPU ids ({host}:<id>)"))
}

impl HostReport {
    /// Checks a host's report before anything of it is believed: GPU ids under the host's name,
    /// routable rCUDA endpoints (see [`check_rcuda_endpoint`]), and every number in range.
    pub fn validate(&self, masked_range: Ipv4Cidr) -> Result<(), InvalidEntry> {
        let bad = |entry: String, reason: String| InvalidEntry { entry, reason };
        if let Some(generation) = self.applied_generation {
            check_generation(generation).map_err(|r| bad("applied_generation".into(), r))?;
        }
        if self.agent_url.len() > MAX_URL_LEN {
            return Err(bad("agent_url".into(), format!("longer than {MAX_URL_LEN} bytes")));
        }
        if let Some((level, reason)) = gpgpums::topology_problem(&self.topology) {
            let entry = level.map_or("topology".to_owned(), |level| format!("topology.{level}"));
            return Err(bad(entry, reason));
        }
        if let Some(offers) = &self.local_vms {
            if self.kind == HostKind::ComputeRgpu {
                let reason = "a compute-rgpu host has no GPUs for a local VM".to_owned();
                return Err(bad("local_vms".into(), reason));
            }
            if let Some((field, reason)) = offers.problem() {
                return Err(bad(format!("local_vms.{field}"), reason));
            }
        }
        let rtt_us = self.rtt_us.as_ref();
        if let Some(rtt_us) = rtt_us.filter(|r| r.len() > MAX_RTT_TARGETS) {
            return Err(bad(
                "rtt_us".into(),
                format!("{} hosts are more than {MAX_RTT_TARGETS}", rtt_us.len()),
            ));
        }
        for (to, &us) in rtt_us.into_iter().flatten() {
            if *to == self.host {
                return Err(bad(format!("rtt_us.{to}"), "is the host itself".into()));
            }
            if !(1..=gpgpums::MAX_RTT_US).contains(&us) {
                return Err(bad(
                    format!("rtt_us.{to}"),
                    format!("must be between 1 and {} (10 s)", gpgpums::MAX_RTT_US),
                ));
            }
        }
        if self.kind == HostKind::ComputeRgpu && !self.gpus.is_empty() {
            return Err(bad("gpus".into(), "a compute-rgpu host has no GPUs".into()));
        }
        if self.gpus.len() > MAX_GPUS_PER_HOST {
            return Err(bad("gpus".into(), format!("more than {MAX_GPUS_PER_HOST} GPUs")));
        }
        let (mut ids, mut indexes) = (HashSet::new(), HashSet::new());
        let mut endpoints: HashMap<(SocketAddrV4, u32), usize> = HashMap::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let field = |name: &str| format!("gpus[{i}].{name}");
            gpu_local_id(&self.host, &gpu.id).map_err(|r| bad(field("id"), r))?;
            if !ids.insert(&gpu.id) {
                return Err(bad(field("id"), format!("{} is listed twice", gpu.id)));
            }
            if !indexes.insert(gpu.index) {
                return Err(bad(field("index"), format!("{} is listed twice", gpu.index)));
            }
            if gpu.model.is_empty()
                || gpu.model.len() > MAX_MODEL_LEN
                || gpu.model.chars().any(char::is_control)
            {
                return Err(bad(
                    field("model"),
                    format!("must be 1 to {MAX_MODEL_LEN} bytes of printable text"),
                ));
            }
            if let Some(reason) = &gpu.unhealthy {
                if reason.is_empty()
                    || reason.len() > MAX_HEALTH_LEN
                    || reason.chars().any(char::is_control)
                {
                    return Err(bad(
                        field("unhealthy"),
                        format!("must be 1 to {MAX_HEALTH_LEN} bytes of printable text"),
                    ));
                }
            }
            if !(1..=MAX_GPU_MEMORY_MIB).contains(&gpu.memory_mib) {
                return Err(bad(
                    field("memory_mib"),
                    format!("must be between 1 and {MAX_GPU_MEMORY_MIB}"),
                ));
            }
            if let Some((name, reason)) = gpu.attributes.problems().into_iter().next() {
                return Err(bad(field(name), reason));
            }
            let endpoint = gpu.rcuda.socket_addr();
            check_rcuda_endpoint(endpoint, masked_range).map_err(|r| bad(field("rcuda"), r))?;
            if gpu.rcuda.gpu_number > MAX_GPU_NUMBER {
                return Err(bad(
                    field("rcuda.gpu_number"),
                    format!("must be at most {MAX_GPU_NUMBER}"),
                ));
            }
            let layer = gpu.attributes.remoting;
            if let Some(first) = self.gpus.first().filter(|g| g.attributes.remoting != layer) {
                return Err(bad(
                    field("remoting"),
                    format!(
                        "{layer}, while gpus[0] is {}: a host's GPU servers speak one layer",
                        first.attributes.remoting
                    ),
                ));
            }
            if layer == gpgpums::Remoting::Lupine && gpu.rcuda.gpu_number != 0 {
                // A LUPINE server serves every GPU its process sees, and its client names none:
                // a cGPU's server must see its GPU alone, or the VM would use another's.
                return Err(bad(
                    field("rcuda.gpu_number"),
                    "must be 0 for LUPINE: one server per GPU, which sees that GPU alone".into(),
                ));
            }
            let served = (endpoint, gpu.rcuda.gpu_number);
            if let Some(first) = endpoints.get(&served) {
                return Err(bad(
                    field("rcuda"),
                    format!("{endpoint} device {} is already gpus[{first}]'s", served.1),
                ));
            }
            endpoints.insert(served, i);
        }
        if let Some(ip) = self.gpu_address {
            if ip.is_unspecified()
                || ip.is_broadcast()
                || ip.is_multicast()
                || ip.is_loopback()
                || masked_range.contains(ip)
            {
                return Err(bad(
                    "gpu_address".into(),
                    format!("{ip} is not a unicast address of the GPU network"),
                ));
            }
        }
        if let Some(managed) = &self.managed {
            if self.kind == HostKind::ComputeRgpu {
                return Err(bad("managed".into(), "a compute-rgpu host has no GPU servers".into()));
            }
            managed.validate(&ids)?;
        }
        self.validate_partitions()
    }

    /// Each partition's parent is a whole GPU of the report with a lower index, and has room
    /// for it: a partition no bigger than its parent, its parent's partitions together no bigger
    /// either.
    fn validate_partitions(&self) -> Result<(), InvalidEntry> {
        let at: HashMap<&GpuId, usize> =
            self.gpus.iter().enumerate().map(|(i, gpu)| (&gpu.id, i)).collect();
        let mut taken: HashMap<usize, u64> = HashMap::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let Some(partition) = &gpu.partition else { continue };
            let bad = |name: &str, reason: String| InvalidEntry {
                entry: format!("gpus[{i}].{name}"),
                reason,
            };
            if let Some(problem) = gpgpums::profile_name_problem(&partition.profile) {
                return Err(bad("partition.profile", problem));
            }
            let parent = match at.get(&partition.parent) {
                Some(&p) if p != i => p,
                _ => {
                    return Err(bad(
                        "partition.parent",
                        format!("{} is not another GPU of this report", partition.parent),
                    ))
                }
            };
            let whole = &self.gpus[parent];
            if whole.partition.is_some() {
                return Err(bad(
                    "partition.parent",
                    format!("{} is a partition itself (gpus[{parent}])", partition.parent),
                ));
            }
            if gpu.index <= whole.index {
                // So a partition comes after its parent in every listing by index.
                return Err(bad(
                    "index",
                    format!("a partition's index must be above its parent's ({})", whole.index),
                ));
            }
            if gpu.memory_mib > whole.memory_mib {
                return Err(bad(
                    "memory_mib",
                    format!(
                        "a partition of {} MiB is bigger than its parent gpus[{parent}] ({} MiB)",
                        gpu.memory_mib, whole.memory_mib
                    ),
                ));
            }
            let sum = taken.entry(parent).or_default();
            *sum += gpu.memory_mib;
            if *sum > whole.memory_mib {
                return Err(bad(
                    "memory_mib",
                    format!(
                        "the partitions of gpus[{parent}] so far have {sum} MiB of its {} MiB",
                        whole.memory_mib
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fixtures::route;

    #[test]
    fn health_reasons_are_printable_short_and_never_empty() {
        assert_eq!(health_reason("XID 79"), "XID 79");
        assert_eq!(health_reason("bad\u{1b}[31m\nthing"), "bad [31m thing");
        assert_eq!(health_reason("\n\t"), "unhealthy");
        let long = health_reason(&"é".repeat(1000));
        assert!(long.len() <= MAX_HEALTH_LEN && long.chars().all(|c| c == 'é'), "{long}");
    }

    #[test]
    fn cidr_parses_and_contains() {
        let r: Ipv4Cidr = "100.127.0.0/16".parse().unwrap();
        assert!(r.contains("100.127.200.1".parse().unwrap()));
        assert!(!r.contains("100.128.0.1".parse().unwrap()));
        assert_eq!(r.last(), "100.127.255.255".parse::<Ipv4Addr>().unwrap());
        assert!("100.127.0.1/16".parse::<Ipv4Cidr>().is_err());
        assert!("100.127.0.0/33".parse::<Ipv4Cidr>().is_err());
        assert_eq!("0.0.0.0/0".parse::<Ipv4Cidr>().unwrap().last(), Ipv4Addr::BROADCAST);
    }

    #[test]
    fn validation_names_the_entry() {
        let range = Some("100.127.0.0/16".parse().unwrap());
        let ok = route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308");
        let mut t = RouteTable {
            generation: 1,
            routes: vec![ok.clone()],
            metadata: None,
            vms_without_cgpus: vec![],
            lost: vec![],
            servers: vec![],
        };
        assert_eq!(t.validate(range), Ok(()));

        t.routes.push(Route { target: "10.1.0.2:0".parse().unwrap(), ..ok.clone() });
        let err = t.validate(range).unwrap_err();
        assert_eq!(err.entry, "routes[1].target");

        t.routes[1] = ok.clone();
        let err = t.validate(range).unwrap_err();
        assert_eq!(err.entry, "routes[1].masked");
        assert!(err.reason.contains("routes[0]"), "{err}");

        t.routes[1] = route(1, "tap1", "10.0.0.2", "100.200.0.1:9000", "10.1.0.2:8308");
        assert!(t.validate(range).unwrap_err().reason.contains("outside the masked range"));

        t.routes[1] = Route { vm_ip: "0.0.0.0".parse().unwrap(), ..ok.clone() };
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_ip");

        t.routes[1] = Route { vm_tap: "tap/../x".into(), ..ok };
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_tap");

        // A tap is one VM's, with one address.
        t.routes[1] = route(2, "tap1", "10.0.0.2", "100.127.0.1:9001", "10.1.0.2:8308");
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_tap");
        t.routes[1] = route(1, "tap1", "10.0.0.9", "100.127.0.1:9001", "10.1.0.2:8308");
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_tap");

        t.routes.truncate(1);
        t.generation = MAX_GENERATION;
        assert_eq!(t.validate(range), Ok(()));
        for generation in [MAX_GENERATION + 1, i64::MAX as u64 + 1, u64::MAX] {
            t.generation = generation;
            assert_eq!(t.validate(range).unwrap_err().entry, "generation");
        }
    }

    #[test]
    fn a_vm_without_cgpus_is_checked_like_a_routed_one_and_listed_once() {
        let range = Some("100.127.0.0/16".parse().unwrap());
        let routed = route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308");
        let idle = |vm: u128, tap: &str, ip: &str| VmPort {
            vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
            vm_ip: ip.parse().unwrap(),
            vm_tap: tap.into(),
            remoting: Default::default(),
        };
        let mut t = RouteTable {
            generation: 1,
            routes: vec![routed],
            metadata: Some("100.127.0.1:80".parse().unwrap()),
            vms_without_cgpus: vec![idle(2, "tap2", "10.0.0.3")],
            lost: vec![],
            servers: vec![],
        };
        assert_eq!(t.validate(range), Ok(()));
        for (bad, entry) in [
            (idle(2, "tap/2", "10.0.0.3"), "vms_without_cgpus[1].vm_tap"),
            (idle(2, "tap2", "255.255.255.255"), "vms_without_cgpus[1].vm_ip"),
            // Another VM's tap, or a routed VM's own.
            (idle(3, "tap1", "10.0.0.2"), "vms_without_cgpus[1].vm_tap"),
            (idle(1, "tap1", "10.0.0.2"), "vms_without_cgpus[1].vm"),
            (idle(2, "tap2", "10.0.0.3"), "vms_without_cgpus[1].vm"),
        ] {
            t.vms_without_cgpus.push(bad);
            assert_eq!(t.validate(range).unwrap_err().entry, entry);
            t.vms_without_cgpus.pop();
        }
    }

    #[test]
    fn vms_with_one_address_on_different_taps_are_fine() {
        let t = RouteTable {
            generation: 1,
            routes: vec![
                route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308"),
                route(2, "tap2", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8309"),
            ],
            metadata: None,
            vms_without_cgpus: vec![],
            lost: vec![],
            servers: vec![],
        };
        assert_eq!(t.validate(None), Ok(()));
    }

    /// A compute-GPU host's report with `gpus` GPUs (`cg0:GPU-<i>`).
    pub(crate) fn report(gpus: usize) -> HostReport {
        HostReport {
            host: HostId::new("cg0").unwrap(),
            kind: HostKind::ComputeGpu,
            agent_url: "http://10.0.0.11:7450".into(),
            gpus: (0..gpus as u32)
                .map(|index| GpuReport {
                    id: GpuId::new(format!("cg0:GPU-{index}")).unwrap(),
                    index,
                    model: "Tesla K20m".into(),
                    memory_mib: 4800,
                    rcuda: RcudaEndpoint {
                        address: "10.78.1.2".parse().unwrap(),
                        port: 8308 + index as u16,
                        gpu_number: 0,
                    },
                    unhealthy: None,
                    attributes: Default::default(),
                    partition: None,
                })
                .collect(),
            applied_generation: Some(3),
            topology: Default::default(),
            rtt_us: None,
            managed: None,
            gpu_address: None,
            local_vms: None,
        }
    }

    #[test]
    fn host_reports_are_checked_entry_by_entry() {
        let range: Ipv4Cidr = "100.127.0.0/16".parse().unwrap();
        assert_eq!(report(2).validate(range), Ok(()));
        let refused = |change: &dyn Fn(&mut HostReport)| {
            let mut r = report(2);
            change(&mut r);
            r.validate(range).expect_err("a bad report passed")
        };
        let entry = |change: &dyn Fn(&mut HostReport)| refused(change).entry;
        // Another host's GPU, a GPU id without the host, or one that could be two hosts'.
        for id in ["gpu2:gpu0", "GPU-1", "cg0:", "cg0:a:b", "cg01:x"] {
            let id = GpuId::new(id).unwrap();
            assert_eq!(entry(&|r| r.gpus[1].id = id.clone()), "gpus[1].id", "{id}");
        }
        assert_eq!(entry(&|r| r.gpus[1].id = r.gpus[0].id.clone()), "gpus[1].id");
        assert_eq!(entry(&|r| r.gpus[1].index = 0), "gpus[1].index");
        // One layer per host; a LUPINE server serves one GPU (its client names no device).
        let lupine = |r: &mut HostReport| {
            r.gpus.iter_mut().for_each(|g| g.attributes.remoting = gpgpums::Remoting::Lupine)
        };
        assert_eq!(
            entry(&|r| r.gpus[1].attributes.remoting = gpgpums::Remoting::Lupine),
            "gpus[1].remoting"
        );
        let mut all_lupine = report(2);
        lupine(&mut all_lupine);
        assert_eq!(all_lupine.validate(range), Ok(()));
        let shared = refused(&|r| {
            lupine(r);
            r.gpus[1].rcuda = RcudaEndpoint { gpu_number: 1, ..r.gpus[0].rcuda };
        });
        assert_eq!(shared.entry, "gpus[1].rcuda.gpu_number");
        // rCUDA endpoints a route could not reach.
        let why = refused(&|r| r.gpus[0].rcuda.port = 0).reason;
        assert!(why.contains("port"), "{why}");
        for address in ["100.127.0.9", "0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1"] {
            let address = address.parse().unwrap();
            assert_eq!(entry(&|r| r.gpus[0].rcuda.address = address), "gpus[0].rcuda");
        }
        let why = refused(&|r| r.gpus[0].rcuda.address = "100.127.3.3".parse().unwrap()).reason;
        assert!(why.contains("masked range"), "{why}");
        assert_eq!(entry(&|r| r.gpus[1].rcuda = r.gpus[0].rcuda), "gpus[1].rcuda");
        // Huge and hostile values.
        assert_eq!(entry(&|r| r.applied_generation = Some(u64::MAX)), "applied_generation");
        assert_eq!(entry(&|r| r.gpus[0].memory_mib = 0), "gpus[0].memory_mib");
        assert_eq!(entry(&|r| r.gpus[0].memory_mib = u64::MAX), "gpus[0].memory_mib");
        assert_eq!(entry(&|r| r.gpus[0].rcuda.gpu_number = u32::MAX), "gpus[0].rcuda.gpu_number");
        assert_eq!(entry(&|r| r.gpus[0].model = "x".repeat(4096)), "gpus[0].model");
        assert_eq!(entry(&|r| r.gpus[0].model = "K20\n\u{1b}[2J".into()), "gpus[0].model");
        assert_eq!(entry(&|r| r.agent_url = "x".repeat(1 << 20)), "agent_url");
        // A GPU's traits and UUID: names only, bounded.
        let traits = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let bad_trait = |r: &mut HostReport| r.gpus[0].attributes.traits = traits(&["nvlink"]);
        assert_eq!(entry(&bad_trait), "gpus[0].traits");
        let many_traits = |r: &mut HostReport| {
            r.gpus[0].attributes.traits = (0..65).map(|i| format!("CUSTOM_T{i}")).collect();
        };
        assert_eq!(entry(&many_traits), "gpus[0].traits");
        let hostile_uuid = |r: &mut HostReport| r.gpus[0].attributes.uuid = Some("a\n;".into());
        assert_eq!(entry(&hostile_uuid), "gpus[0].uuid");
        let fine = |r: &mut HostReport| {
            r.gpus[0].attributes.traits = traits(&["CUSTOM_NVLINK", "HW_GPU_CUDA_SDK_V12_4"]);
        };
        let mut with_traits = report(2);
        fine(&mut with_traits);
        assert_eq!(with_traits.validate(range), Ok(()));
        // On the wire beside the other fields, left out when unknown.
        let wire = serde_json::to_value(&with_traits.gpus[0]).unwrap();
        assert_eq!(wire["traits"][0], "CUSTOM_NVLINK");
        assert!(wire.get("compute_capability").is_none());
        let back: GpuReport = serde_json::from_value(wire).unwrap();
        assert_eq!(back, with_traits.gpus[0]);
        let many = report(MAX_GPUS_PER_HOST + 1);
        assert_eq!(many.validate(range).unwrap_err().entry, "gpus");
        let mut rgpu = report(1);
        rgpu.kind = HostKind::ComputeRgpu;
        assert_eq!(rgpu.validate(range).unwrap_err().entry, "gpus");
        // Its topology: names, few levels.
        let topology = |pairs: &[(&str, &str)]| -> gpgpums::Topology {
            pairs.iter().map(|(l, g)| ((*l).to_owned(), (*g).to_owned())).collect()
        };
        let place = |t: gpgpums::Topology| move |r: &mut HostReport| r.topology = t.clone();
        assert_eq!(entry(&place(topology(&[("rack", "r 1")]))), "topology.rack");
        assert_eq!(entry(&place(topology(&[("Rack", "r1")]))), "topology");
        let many = (0..9).map(|i| (format!("l{i}"), "g".to_owned())).collect();
        assert_eq!(entry(&place(many)), "topology");
        let mut placed = report(1);
        placed.topology = topology(&[("zone", "z1"), ("rack", "r12")]);
        assert_eq!(placed.validate(range), Ok(()));
        let wire = serde_json::to_value(&placed).unwrap();
        assert_eq!(wire["topology"], serde_json::json!({"rack": "r12", "zone": "z1"}));
        assert!(serde_json::to_value(report(1)).unwrap().get("topology").is_none());
    }

    #[test]
    fn round_trips_are_bounded_in_number_and_value_and_never_to_the_host_itself() {
        let range: Ipv4Cidr = "100.127.0.0/16".parse().unwrap();
        let mut fine = report(1);
        fine.rtt_us = Some([(HostId::new("cg1").unwrap(), 180)].into());
        assert_eq!(fine.validate(range), Ok(()));
        let text = serde_json::to_string(&fine).unwrap();
        assert!(text.contains(r#""rtt_us":{"cg1":180}"#), "{text}");
        assert!(!serde_json::to_string(&report(1)).unwrap().contains("rtt_us"));
        let none_reached = HostReport { rtt_us: Some(BTreeMap::new()), ..report(1) };
        assert!(serde_json::to_string(&none_reached).unwrap().contains(r#""rtt_us":{}"#));
        let many = (0..=MAX_RTT_TARGETS).map(|i| (HostId::new(format!("h{i}")).unwrap(), 1));
        let cases = [
            (BTreeMap::from([(HostId::new("cg0").unwrap(), 5)]), "rtt_us.cg0"),
            (BTreeMap::from([(HostId::new("cg1").unwrap(), 0)]), "rtt_us.cg1"),
            (
                BTreeMap::from([(HostId::new("cg1").unwrap(), gpgpums::MAX_RTT_US + 1)]),
                "rtt_us.cg1",
            ),
            (many.collect(), "rtt_us"),
        ];
        for (rtt_us, entry) in cases {
            let hostile = HostReport { rtt_us: Some(rtt_us), ..report(1) };
            assert_eq!(hostile.validate(range).unwrap_err().entry, entry);
        }
    }

    /// A report of an 80 GiB GPU (gpus[0]) with `partitions` of the given sizes after it.
    fn partitioned_report(partitions: &[u64]) -> HostReport {
        let mut r = report(1 + partitions.len());
        r.gpus[0].memory_mib = 81920;
        for (i, &memory_mib) in partitions.iter().enumerate() {
            let gpu = &mut r.gpus[1 + i];
            gpu.memory_mib = memory_mib;
            gpu.partition = Some(gpgpums::Partition {
                parent: GpuId::new("cg0:GPU-0").unwrap(),
                profile: "3g.40gb".into(),
            });
        }
        r
    }

    #[test]
    fn partitions_in_reports_are_checked_against_their_parents() {
        let range: Ipv4Cidr = "100.127.0.0/16".parse().unwrap();
        assert_eq!(partitioned_report(&[40960, 40960]).validate(range), Ok(()));
        let refused = |r: HostReport| r.validate(range).expect_err("a bad report passed");
        // Bigger than its parent; two over its parent's memory.
        let big = refused(partitioned_report(&[81921]));
        assert_eq!(big.entry, "gpus[1].memory_mib");
        assert!(big.reason.contains("bigger than its parent gpus[0]"), "{}", big.reason);
        let over = refused(partitioned_report(&[40960, 40961]));
        assert_eq!(over.entry, "gpus[2].memory_mib");
        assert!(over.reason.contains("81921 MiB of its 81920"), "{}", over.reason);
        // A parent that is not in the report, itself, or a partition.
        let mut r = partitioned_report(&[1024, 1024]);
        r.gpus[1].partition.as_mut().unwrap().parent = GpuId::new("cg1:GPU-0").unwrap();
        assert_eq!(refused(r).entry, "gpus[1].partition.parent");
        let mut r = partitioned_report(&[1024]);
        r.gpus[1].partition.as_mut().unwrap().parent = r.gpus[1].id.clone();
        assert_eq!(refused(r).entry, "gpus[1].partition.parent");
        let mut r = partitioned_report(&[1024, 1024]);
        r.gpus[2].partition.as_mut().unwrap().parent = r.gpus[1].id.clone();
        assert_eq!(refused(r).entry, "gpus[2].partition.parent");
        // Listed by index, a partition comes after its parent.
        let mut r = partitioned_report(&[1024]);
        (r.gpus[0].index, r.gpus[1].index) = (7, 3);
        assert_eq!(refused(r).entry, "gpus[1].index");
        // Profiles are names, not text.
        for profile in ["", "1G.10GB", "g1.10gb", "1g.10gb\n", &"1".repeat(33)] {
            let mut r = partitioned_report(&[1024]);
            r.gpus[1].partition.as_mut().unwrap().profile = profile.into();
            assert_eq!(refused(r).entry, "gpus[1].partition.profile", "{profile:?}");
        }
        // On the wire as an object beside the other fields; left out for whole GPUs.
        let r = partitioned_report(&[1024]);
        let wire = serde_json::to_value(&r.gpus).unwrap();
        assert!(wire[0].get("partition").is_none());
        assert_eq!(wire[1]["partition"]["parent"], "cg0:GPU-0");
        assert_eq!(wire[1]["partition"]["profile"], "3g.40gb");
        let back: Vec<GpuReport> = serde_json::from_value(wire).unwrap();
        assert_eq!(back, r.gpus);
    }

    #[test]
    fn wire_format_is_stable() {
        let r = route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["masked"], "100.127.0.1:9000");
        assert_eq!(v["vm_ip"], "10.0.0.2");
        assert_eq!(v["vm_tap"], "tap1");
        assert_eq!(serde_json::to_value(HostKind::ComputeRgpu).unwrap(), "compute-rgpu");
    }
}
