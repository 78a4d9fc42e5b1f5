//! The servers a managed GPU host's agent runs, one per cGPU (`[gpu_servers] managed`): what a
//! table asks of them ([`ServerSpec`], in [`crate::protocol::RouteTable::servers`]) and what an agent answers and
//! reports of them ([`ServerStatus`], in [`ManagedServers`]), with their checks. Re-exported by
//! [`crate::protocol`], which the rest of the contract's wire types live in.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use gpgpums::ids::{GpuId, VmId};
use serde::{Deserialize, Serialize};

use crate::limits::{InvalidEntry, MAX_GPU_MEMORY_MIB, MAX_HEALTH_LEN};

/// The most cGPU servers one host's table may list.
pub const MAX_SERVERS_PER_HOST: usize = 4096;

/// The most addresses a server's traffic may come from.
pub const MAX_SERVER_CLIENTS: usize = 16;

/// One cGPU of one of the host's GPUs, which the host's agent serves with a process of its own:
/// the server sees that GPU alone, holds at most `memory_mib` of its memory, and accepts only
/// `clients`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServerSpec {
    pub vm: VmId,
    /// The cGPU's index in its VM.
    pub index: u32,
    /// One of the host's GPUs (or partitions).
    pub gpu: GpuId,
    /// The device memory the server may hold; none: the whole GPU (an exclusive cGPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// The addresses the cGPU's traffic arrives from: its VM host's GPU-network address (the
    /// VM host masquerades), or, for a VM on this host, nothing (its route is local).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<Ipv4Addr>,
    /// Percent of its GPU's SMs the server may use (MPS's active-thread percentage), 1 to 100;
    /// none: no share (time-sliced, or the whole GPU). Only a host that runs MPS takes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u8>,
}

impl ServerSpec {
    /// The cGPU it serves.
    pub fn key(&self) -> (VmId, u32) {
        (self.vm, self.index)
    }
}

/// Where a cGPU's server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// Started, not yet accepting connections: no route may go to it yet.
    Starting,
    /// Accepting on its port.
    Ready,
    /// Ended (it exited, or stopped answering), waiting out its backoff before a restart.
    Backoff,
    /// Cannot be started (no free port, the command cannot run): the reason says why.
    Failed,
}

/// One cGPU server as its agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub vm: VmId,
    pub index: u32,
    pub gpu: GpuId,
    pub state: ServerState,
    /// Where it listens (on the host's GPU-server address), once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The process the agent started (the host's PID), while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How many times it was started again after ending.
    #[serde(default)]
    pub restarts: u32,
    /// The GPU memory its processes hold, as the driver counts it, where the agent can read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_mib: Option<u64>,
    /// Why it last ended or cannot start (printable, at most [`MAX_HEALTH_LEN`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How many times the agent ended it for holding more GPU memory than its share.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub over_share_ends: u32,
    /// In a table's answer: this host routed its own VM's cGPU to this server, at its port,
    /// in that table (see `LostCgpu::here`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub routed_here: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl ServerStatus {
    /// The cGPU it serves.
    pub fn key(&self) -> (VmId, u32) {
        (self.vm, self.index)
    }

    /// The endpoint a route to it targets, at the host's GPU-server `address`: only once it
    /// accepts.
    pub fn live_port(&self) -> Option<u16> {
        self.port.filter(|_| self.state == ServerState::Ready)
    }
}

/// A host whose agent runs one server per cGPU of its GPUs (`[gpu_servers] managed = true`):
/// what it can do, and each server's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedServers {
    /// Whether it runs NVIDIA MPS, so a server can be given a share of its GPU's SMs.
    #[serde(default)]
    pub mps: bool,
    #[serde(default)]
    pub servers: Vec<ServerStatus>,
}

impl ManagedServers {
    /// Checks a report of servers: bounded, one status per cGPU, on GPUs of `gpus`, ports set
    /// while running.
    pub fn validate(&self, gpus: &HashSet<&GpuId>) -> Result<(), InvalidEntry> {
        if self.servers.len() > MAX_SERVERS_PER_HOST {
            return Err(InvalidEntry {
                entry: "managed.servers".into(),
                reason: format!("more than {MAX_SERVERS_PER_HOST} servers"),
            });
        }
        let mut seen = HashSet::new();
        for (i, server) in self.servers.iter().enumerate() {
            let bad = |field: &str, reason: String| InvalidEntry {
                entry: format!("managed.servers[{i}].{field}"),
                reason,
            };
            if !seen.insert(server.key()) {
                return Err(bad(
                    "index",
                    format!("cGPU {} of {} is listed twice", server.index, server.vm),
                ));
            }
            if !gpus.contains(&server.gpu) {
                return Err(bad("gpu", format!("{} is not a GPU of this report", server.gpu)));
            }
            if server.port == Some(0)
                || (server.state == ServerState::Ready && server.port.is_none())
            {
                return Err(bad("port", "a ready server has a port between 1 and 65535".into()));
            }
            if server.gpu_memory_mib.is_some_and(|m| m > MAX_GPU_MEMORY_MIB) {
                return Err(bad("gpu_memory_mib", format!("above {MAX_GPU_MEMORY_MIB}")));
            }
            if let Some(reason) = &server.reason {
                if reason.len() > MAX_HEALTH_LEN || reason.chars().any(char::is_control) {
                    return Err(bad(
                        "reason",
                        format!("must be at most {MAX_HEALTH_LEN} bytes of printable text"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A table's servers: bounded, one per cGPU, with memory in range and a few unicast clients.
pub(crate) fn validate_specs(servers: &[ServerSpec]) -> Result<(), InvalidEntry> {
    if servers.len() > MAX_SERVERS_PER_HOST {
        return Err(InvalidEntry {
            entry: "servers".into(),
            reason: format!("more than {MAX_SERVERS_PER_HOST} servers"),
        });
    }
    let mut seen: HashMap<(VmId, u32), usize> = HashMap::new();
    for (i, server) in servers.iter().enumerate() {
        let bad = |field: &str, reason: String| InvalidEntry {
            entry: format!("servers[{i}].{field}"),
            reason,
        };
        if let Some(first) = seen.insert(server.key(), i) {
            return Err(bad(
                "index",
                format!("cGPU {} of {} is servers[{first}] already", server.index, server.vm),
            ));
        }
        if let Some(memory) = server.memory_mib {
            if !(1..=MAX_GPU_MEMORY_MIB).contains(&memory) {
                return Err(bad(
                    "memory_mib",
                    format!("must be between 1 and {MAX_GPU_MEMORY_MIB}"),
                ));
            }
        }
        if server.compute_percent.is_some_and(|p| !(1..=100).contains(&p)) {
            return Err(bad("compute_percent", "must be between 1 and 100".into()));
        }
        if server.clients.len() > MAX_SERVER_CLIENTS {
            return Err(bad("clients", format!("more than {MAX_SERVER_CLIENTS} addresses")));
        }
        for (j, ip) in server.clients.iter().enumerate() {
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
                return Err(bad(&format!("clients[{j}]"), format!("{ip} is not unicast")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tests::report;
    use crate::protocol::{HostKind, HostReport, Ipv4Cidr, RouteTable};

    fn server(vm: u128, index: u32) -> ServerSpec {
        ServerSpec {
            vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
            index,
            gpu: GpuId::new("cg0:GPU-0").unwrap(),
            memory_mib: Some(2048),
            clients: vec!["10.78.0.9".parse().unwrap()],
            compute_percent: None,
        }
    }

    /// `lost[].here` (a cGPU the agent routes to its own server): only for a server of the
    /// table, at a masked endpoint in range that its VM uses for nothing else.
    #[test]
    fn a_cgpu_served_here_names_a_server_of_its_table_and_a_free_masked_endpoint() {
        use crate::protocol::{LostCgpu, ServedHere};
        let range = Some("100.127.0.0/16".parse().unwrap());
        let here =
            |masked: &str| Some(ServedHere { masked: masked.parse().unwrap(), gpu_number: 0 });
        let vm = VmId::from_uuid(uuid::Uuid::from_u128(1));
        let table = |lost: Vec<LostCgpu>| RouteTable {
            generation: 1,
            routes: vec![crate::fixtures::route(
                1,
                "tap1",
                "10.0.0.2",
                "100.127.0.1:9000",
                "10.1.0.2:8308",
            )],
            metadata: Some("100.127.255.254:80".parse().unwrap()),
            vms_without_cgpus: vec![],
            lost,
            servers: vec![server(1, 1), server(1, 2)],
        };
        let ok = table(vec![LostCgpu { vm, index: 1, here: here("100.127.0.1:9001") }]);
        assert_eq!(ok.validate(range), Ok(()));
        for (lost, why) in [
            (vec![LostCgpu { vm, index: 3, here: here("100.127.0.1:9001") }], "has no server"),
            (vec![LostCgpu { vm, index: 1, here: here("100.127.0.1:9000") }], "already used"),
            (
                vec![
                    LostCgpu { vm, index: 1, here: here("100.127.0.1:9001") },
                    LostCgpu { vm, index: 2, here: here("100.127.0.1:9001") },
                ],
                "already used",
            ),
            (vec![LostCgpu { vm, index: 1, here: here("100.200.0.1:9001") }], "outside"),
            (vec![LostCgpu { vm, index: 1, here: here("100.127.0.1:0") }], "port"),
            (vec![LostCgpu { vm, index: 1, here: here("100.127.255.254:80") }], "metadata"),
        ] {
            let err = table(lost).validate(range).unwrap_err();
            assert!(err.entry.starts_with("lost[") && err.entry.ends_with("].here"), "{err:?}");
            assert!(err.reason.contains(why), "{err:?} should say {why}");
        }
    }

    #[test]
    fn a_tables_servers_are_one_per_cgpu_with_sane_limits_and_clients() {
        let table = |servers: Vec<ServerSpec>| RouteTable {
            generation: 1,
            routes: vec![],
            metadata: None,
            vms_without_cgpus: vec![],
            lost: vec![],
            servers,
        };
        assert_eq!(table(vec![server(1, 0), server(1, 1), server(2, 0)]).validate(None), Ok(()));
        let entry = |servers: Vec<ServerSpec>| table(servers).validate(None).unwrap_err().entry;
        assert_eq!(entry(vec![server(1, 0), server(1, 0)]), "servers[1].index");
        for memory in [0, MAX_GPU_MEMORY_MIB + 1] {
            let huge = ServerSpec { memory_mib: Some(memory), ..server(1, 0) };
            assert_eq!(entry(vec![huge]), "servers[0].memory_mib");
        }
        for client in ["127.0.0.1", "0.0.0.0", "255.255.255.255", "224.0.0.1"] {
            let odd = ServerSpec { clients: vec![client.parse().unwrap()], ..server(1, 0) };
            assert_eq!(entry(vec![odd]), "servers[0].clients[0]", "{client}");
        }
        let crowd = ServerSpec {
            clients: vec!["10.78.0.9".parse().unwrap(); MAX_SERVER_CLIENTS + 1],
            ..server(1, 0)
        };
        assert_eq!(entry(vec![crowd]), "servers[0].clients");
        for percent in [0, 101] {
            let odd = ServerSpec { compute_percent: Some(percent), ..server(1, 0) };
            assert_eq!(entry(vec![odd]), "servers[0].compute_percent", "{percent}");
        }
        let flood = (0..=MAX_SERVERS_PER_HOST as u32).map(|i| server(1, i)).collect();
        assert_eq!(entry(flood), "servers");
        // An exclusive cGPU's server has no memory limit; the field is left out on the wire.
        let exclusive = ServerSpec { memory_mib: None, clients: vec![], ..server(3, 0) };
        let wire = serde_json::to_value(table(vec![exclusive])).unwrap();
        assert_eq!(wire["servers"][0].as_object().unwrap().len(), 3, "{wire}");
        assert!(serde_json::to_value(table(vec![])).unwrap().get("servers").is_none());
    }

    #[test]
    fn a_report_of_servers_names_only_its_own_gpus_and_running_ports() {
        let range: Ipv4Cidr = "100.127.0.0/16".parse().unwrap();
        let status = |index: u32, state, port| ServerStatus {
            vm: VmId::from_uuid(uuid::Uuid::from_u128(1)),
            index,
            gpu: GpuId::new("cg0:GPU-0").unwrap(),
            state,
            port,
            pid: Some(42),
            restarts: 0,
            gpu_memory_mib: None,
            reason: None,
            over_share_ends: 0,
            routed_here: false,
        };
        let with = |servers: Vec<ServerStatus>| HostReport {
            managed: Some(ManagedServers { mps: false, servers }),
            ..report(1)
        };
        let fine = with(vec![
            status(0, ServerState::Ready, Some(20000)),
            status(1, ServerState::Backoff, None),
        ]);
        assert_eq!(fine.validate(range), Ok(()));
        assert_eq!(fine.managed.as_ref().unwrap().servers[0].live_port(), Some(20000));
        assert_eq!(fine.managed.as_ref().unwrap().servers[1].live_port(), None);
        let entry = |r: HostReport| r.validate(range).unwrap_err().entry;
        let twice =
            vec![status(0, ServerState::Ready, Some(1)), status(0, ServerState::Ready, Some(2))];
        assert_eq!(entry(with(twice)), "managed.servers[1].index");
        let foreign = ServerStatus {
            gpu: GpuId::new("cg1:GPU-0").unwrap(),
            ..status(0, ServerState::Ready, Some(1))
        };
        assert_eq!(entry(with(vec![foreign])), "managed.servers[0].gpu");
        assert_eq!(
            entry(with(vec![status(0, ServerState::Ready, None)])),
            "managed.servers[0].port"
        );
        assert_eq!(
            entry(with(vec![status(0, ServerState::Starting, Some(0))])),
            "managed.servers[0].port"
        );
        let hostile = ServerStatus {
            reason: Some("a\u{1b}[2J".into()),
            ..status(0, ServerState::Failed, None)
        };
        assert_eq!(entry(with(vec![hostile])), "managed.servers[0].reason");
        let rgpu = HostReport { kind: HostKind::ComputeRgpu, gpus: vec![], ..with(vec![]) };
        assert_eq!(entry(rgpu), "managed");
        assert!(serde_json::to_value(report(1)).unwrap().get("managed").is_none());
    }
}
