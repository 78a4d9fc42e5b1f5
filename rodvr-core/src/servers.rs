//! The cGPU servers an agent runs on a GPU host that manages them (`[gpu_servers] managed`): one
//! process per cGPU, started when a table lists the cGPU and stopped when a table no longer does.
//!
//! The [`Supervisor`] trait is the side effect; the agent binary runs processes (its `servers`
//! module), and [`SimulatedServers`] gives each cGPU a port and calls it ready at once, for
//! gsaasd's in-process hosts and for tests of everything around the processes. Both answer the
//! same way: a status per listed cGPU, in the table's order, after waiting a bounded time for new
//! servers to accept, so gsaasd routes a cGPU only to a server that is there.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::ops::RangeInclusive;
use std::sync::Mutex;

use gpgpums::ids::VmId;
use rodvr_contract::protocol::{ServerSpec, ServerState, ServerStatus};

/// Runs one server per cGPU.
pub trait Supervisor: Send + Sync + Debug {
    /// Makes the running servers exactly those of `specs` (starting the new ones, stopping those
    /// no longer listed, changing the limits of the others), waits a bounded time for the new
    /// ones to accept, and answers each one's status in the order of `specs`. Blocking.
    fn converge(&self, specs: &[ServerSpec]) -> Vec<ServerStatus>;

    /// Every server's status now, for the host's report.
    fn statuses(&self) -> Vec<ServerStatus>;

    /// Whether the host runs NVIDIA MPS (a server can be given a share of its GPU's SMs).
    fn mps(&self) -> bool {
        false
    }

    /// Starts again what the last convergences used up and keep in reserve (warm spares), off
    /// the tables' path: called after a table's answer. Blocking.
    fn replenish(&self) {}
}

/// Servers that exist only as ports: each new cGPU takes the lowest free port of the range and is
/// ready at once. What gsaasd's in-process hosts run.
#[derive(Debug)]
pub struct SimulatedServers {
    ports: RangeInclusive<u16>,
    mps: bool,
    running: Mutex<BTreeMap<(VmId, u32), ServerStatus>>,
}

impl SimulatedServers {
    pub fn new(ports: RangeInclusive<u16>) -> Self {
        Self { ports, mps: false, running: Mutex::default() }
    }

    /// On a host that runs MPS: servers with a compute share start too.
    pub fn with_mps(self) -> Self {
        Self { mps: true, ..self }
    }
}

/// Why a host cannot run `spec`'s server, whatever runs it: a compute share on a host without
/// MPS (gsaasd places none there; a table that asks is refused per server, not obeyed without).
pub fn unservable(spec: &ServerSpec, mps: bool) -> Option<String> {
    (spec.compute_percent.is_some() && !mps)
        .then(|| "a compute share needs MPS, which this host does not run".to_owned())
}

impl Supervisor for SimulatedServers {
    fn converge(&self, specs: &[ServerSpec]) -> Vec<ServerStatus> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: HashSet<(VmId, u32)> = specs.iter().map(ServerSpec::key).collect();
        // A server that could not start is tried again at each table.
        running.retain(|key, s| wanted.contains(key) && s.state != ServerState::Failed);
        let mut used: HashSet<u16> = running.values().filter_map(|s| s.port).collect();
        specs
            .iter()
            .map(|spec| {
                let status = running.entry(spec.key()).or_insert_with(|| {
                    let unservable = unservable(spec, self.mps);
                    let port = self.ports.clone().find(|p| !used.contains(p));
                    let port = port.filter(|_| unservable.is_none());
                    let (state, reason) = match (port, unservable) {
                        (_, Some(why)) => (ServerState::Failed, Some(why)),
                        (Some(_), None) => (ServerState::Ready, None),
                        (None, None) => {
                            (ServerState::Failed, Some("no free port in the range".into()))
                        }
                    };
                    ServerStatus {
                        vm: spec.vm,
                        index: spec.index,
                        gpu: spec.gpu.clone(),
                        state,
                        port,
                        pid: None,
                        restarts: 0,
                        gpu_memory_mib: None,
                        reason,
                        over_share_ends: 0,
                        routed_here: false,
                    }
                });
                used.extend(status.port);
                status.clone()
            })
            .collect()
    }

    fn statuses(&self) -> Vec<ServerStatus> {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    fn mps(&self) -> bool {
        self.mps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpgpums::ids::GpuId;

    fn spec(vm: u128, index: u32) -> ServerSpec {
        ServerSpec {
            vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
            index,
            gpu: GpuId::new("g0:gpu0").unwrap(),
            memory_mib: Some(1024),
            clients: vec![],
            compute_percent: None,
        }
    }

    #[test]
    fn simulated_servers_keep_their_ports_and_free_them_when_unlisted() {
        let servers = SimulatedServers::new(20000..=20001);
        let first = servers.converge(&[spec(1, 0), spec(2, 0)]);
        assert_eq!(first.iter().map(|s| s.port).collect::<Vec<_>>(), [Some(20000), Some(20001)]);
        let full = servers.converge(&[spec(1, 0), spec(2, 0), spec(3, 0)]);
        assert_eq!(full[2].state, ServerState::Failed);
        assert_eq!(full[2].live_port(), None);
        // cGPU 1/0 leaves: its port goes to the next one; the others keep theirs.
        let after = servers.converge(&[spec(2, 0), spec(3, 0)]);
        assert_eq!(after.iter().map(|s| s.port).collect::<Vec<_>>(), [Some(20001), Some(20000)]);
        assert_eq!(after[1].state, ServerState::Ready, "a failed server is tried again");
        assert_eq!(servers.statuses().len(), 2);
    }

    #[test]
    fn a_compute_share_runs_only_where_mps_does() {
        let shared = ServerSpec { compute_percent: Some(30), ..spec(1, 0) };
        let plain = SimulatedServers::new(20000..=20001);
        let refused = &plain.converge(std::slice::from_ref(&shared))[0];
        assert_eq!(refused.state, ServerState::Failed);
        assert_eq!(refused.live_port(), None, "never served without its share");
        assert!(refused.reason.as_deref().unwrap().contains("MPS"), "{refused:?}");
        let mps = SimulatedServers::new(20000..=20001).with_mps();
        assert!(mps.mps());
        assert_eq!(mps.converge(&[shared])[0].state, ServerState::Ready);
    }

    mod agent {
        use std::sync::Arc;

        use super::spec;
        use crate::agent::{Agent, AgentError, HostFacts};
        use crate::firewall::{Dataplane, MemoryFirewall};
        use crate::servers::SimulatedServers;
        use crate::state::Ledger;
        use gpgpums::ids::{GpuId, HostId};
        use rodvr_contract::protocol::{
            GpuReport, HostKind, RcudaEndpoint, RouteTable, ServerSpec, ServerState,
        };

        fn agent(managed: bool) -> Agent<MemoryFirewall> {
            let gpu = GpuReport {
                id: GpuId::new("g0:gpu0").unwrap(),
                index: 0,
                model: "H200".into(),
                memory_mib: 143_771,
                rcuda: RcudaEndpoint {
                    address: "10.78.0.2".parse().unwrap(),
                    port: 14833,
                    gpu_number: 0,
                },
                unhealthy: None,
                attributes: Default::default(),
                partition: None,
            };
            let facts = HostFacts {
                host: HostId::new("g0").unwrap(),
                kind: HostKind::ComputeGpu,
                agent_url: "in-process".into(),
                gpus: vec![gpu],
                topology: Default::default(),
                gpu_address: None,
                local_vms: None,
            };
            let dataplane = Dataplane::new(MemoryFirewall::new(), crate::fixtures::params());
            let agent = Agent::new(Ledger::in_memory(), dataplane, facts);
            if managed {
                agent.with_servers(Arc::new(SimulatedServers::new(20000..=20999)))
            } else {
                agent
            }
        }

        fn table(generation: u64, servers: Vec<ServerSpec>) -> RouteTable {
            RouteTable {
                generation,
                routes: vec![],
                metadata: None,
                vms_without_cgpus: vec![],
                lost: vec![],
                servers,
            }
        }

        fn refused_at(agent: &Agent<MemoryFirewall>, table: RouteTable) -> String {
            match agent.put_table(table) {
                Err(AgentError::Invalid(invalid)) => invalid.entry,
                other => panic!("not refused: {other:?}"),
            }
        }

        #[test]
        fn an_agent_runs_the_servers_its_table_lists_and_reports_them() {
            let agent = agent(true);
            let applied = agent.put_table(table(1, vec![spec(1, 0), spec(1, 1)])).unwrap();
            assert_eq!(applied.servers.len(), 2);
            assert!(applied.servers.iter().all(|s| s.state == ServerState::Ready));
            let report = agent.host_report();
            assert_eq!(report.managed.as_ref().unwrap().servers.len(), 2);
            assert_eq!(report.validate("100.127.0.0/16".parse().unwrap()), Ok(()));
            // The same table again answers the same servers; a table without one ends it.
            let again = agent.put_table(table(1, vec![spec(1, 0), spec(1, 1)])).unwrap();
            assert_eq!(again.servers, applied.servers);
            let fewer = agent.put_table(table(2, vec![spec(1, 1)])).unwrap();
            assert_eq!(fewer.servers, applied.servers[1..]);
            assert_eq!(agent.host_report().managed.unwrap().servers, applied.servers[1..]);
        }

        #[test]
        fn servers_are_refused_on_a_host_that_runs_none_or_on_another_hosts_gpu() {
            let unmanaged = agent(false);
            assert_eq!(refused_at(&unmanaged, table(1, vec![spec(1, 0)])), "servers");
            assert!(unmanaged.host_report().managed.is_none());
            let managed = agent(true);
            let foreign = ServerSpec { gpu: GpuId::new("g1:gpu0").unwrap(), ..spec(1, 0) };
            assert_eq!(refused_at(&managed, table(1, vec![spec(1, 1), foreign])), "servers[1].gpu");
            assert!(managed.host_report().managed.unwrap().servers.is_empty(), "nothing started");
        }
    }
}
