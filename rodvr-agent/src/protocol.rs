//! Wire types shared by the agent and the controller (`gsaasd`).
//!
//! The controller always sends a host's *complete* route table with a generation number instead of
//! "add this route" / "remove that route" calls: a lost or repeated request then cannot leave the
//! host half-configured, and the agent can persist and re-apply the table on its own after a
//! restart. Validation lives here, next to the types, so both sides reject the same tables and name
//! the offending entry the same way (`routes[3].masked: ...`).

use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::str::FromStr;

use gpgpums::ids::{GpuId, HostId, VmId};
use serde::{Deserialize, Serialize};

/// Audience every controller-signed token for an agent must carry.
pub const AGENT_AUDIENCE: &str = "rodvr-agent";

/// The complete set of masked routes a host must serve, at one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteTable {
    pub generation: u64,
    pub routes: Vec<Route>,
}

/// One cGPU of one VM: the VM's traffic to `masked` is rerouted to the rCUDA server at `target`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    pub vm: VmId,
    /// The VM's fixed IP; traffic is matched on it when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_ip: Option<Ipv4Addr>,
    /// The VM's tap interface on this host; matched on when no `vm_ip` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_tap: Option<String>,
    /// The endpoint the VM connects to (inside the agent's masked range).
    pub masked: SocketAddrV4,
    /// The real rCUDA endpoint on the GPU network.
    pub target: SocketAddrV4,
}

/// How the host recognises a route's VM: its fixed IP if known, otherwise the interface its
/// packets arrive on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmSource {
    Ip(Ipv4Addr),
    Tap(String),
}

impl Route {
    /// The source the data plane matches on, or `None` when the route names neither.
    pub fn source(&self) -> Option<VmSource> {
        match (&self.vm_ip, &self.vm_tap) {
            (Some(ip), _) => Some(VmSource::Ip(*ip)),
            (None, Some(tap)) => Some(VmSource::Tap(tap.clone())),
            (None, None) => None,
        }
    }
}

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

/// A table entry the agent refuses, named by its position and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry}: {reason}")]
pub struct InvalidEntry {
    /// Where the problem is, e.g. `routes[3].masked`.
    pub entry: String,
    pub reason: String,
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
        let mut seen: HashMap<(VmSource, SocketAddrV4), usize> = HashMap::new();
        for (i, route) in self.routes.iter().enumerate() {
            let bad = |field: &str, reason: String| InvalidEntry {
                entry: format!("routes[{i}].{field}"),
                reason,
            };
            if let Some(tap) = &route.vm_tap {
                check_ifname(tap).map_err(|r| bad("vm_tap", r))?;
            }
            if let Some(ip) = route.vm_ip {
                if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                    return Err(bad("vm_ip", format!("{ip} is not a unicast address")));
                }
            }
            let Some(source) = route.source() else {
                return Err(bad("vm_ip", "a route needs vm_ip or vm_tap".into()));
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
            if let Some(first) = seen.insert((source, route.masked), i) {
                return Err(bad(
                    "masked",
                    format!("{} is already used by routes[{first}] for the same VM", route.masked),
                ));
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

/// The error body every non-2xx agent response carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub id: GpuId,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub rcuda: RcudaEndpoint,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn route(ip: &str, masked: &str, target: &str) -> Route {
        Route {
            vm: VmId::new_random(),
            vm_ip: Some(ip.parse().unwrap()),
            vm_tap: None,
            masked: masked.parse().unwrap(),
            target: target.parse().unwrap(),
        }
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
        let ok = route("10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308");
        let mut t = RouteTable { generation: 1, routes: vec![ok.clone()] };
        assert_eq!(t.validate(range), Ok(()));

        t.routes.push(Route { target: "10.1.0.2:0".parse().unwrap(), ..ok.clone() });
        let err = t.validate(range).unwrap_err();
        assert_eq!(err.entry, "routes[1].target");

        t.routes[1] = ok.clone();
        let err = t.validate(range).unwrap_err();
        assert_eq!(err.entry, "routes[1].masked");
        assert!(err.reason.contains("routes[0]"), "{err}");

        t.routes[1] = route("10.0.0.2", "100.200.0.1:9000", "10.1.0.2:8308");
        assert!(t.validate(range).unwrap_err().reason.contains("outside the masked range"));

        t.routes[1] = Route { vm_ip: None, ..ok.clone() };
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_ip");

        t.routes[1] = Route { vm_ip: None, vm_tap: Some("tap/../x".into()), ..ok };
        assert_eq!(t.validate(range).unwrap_err().entry, "routes[1].vm_tap");
    }

    #[test]
    fn same_masked_endpoint_for_different_vms_is_fine() {
        let t = RouteTable {
            generation: 1,
            routes: vec![
                route("10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308"),
                route("10.0.0.3", "100.127.0.1:9000", "10.1.0.2:8309"),
            ],
        };
        assert_eq!(t.validate(None), Ok(()));
    }

    #[test]
    fn wire_format_is_stable() {
        let r = route("10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["masked"], "100.127.0.1:9000");
        assert_eq!(v["vm_ip"], "10.0.0.2");
        assert!(v.get("vm_tap").is_none());
        assert_eq!(serde_json::to_value(HostKind::ComputeRgpu).unwrap(), "compute-rgpu");
    }
}
