//! The agent's core: admit, persist, then apply a route table; no HTTP in here.
//!
//! A table goes through validation, the ledger's generation rules, the state file and only then the
//! firewall, so a table that fails any check changes nothing, and a table that was accepted is
//! re-applied after a restart even if applying it failed the first time. The firewall is a type
//! parameter: the binary uses `nft`, `gsaasd` and tests use the in-memory firewall.
//!
//! [`AgentError`] is the one error type of the agent's API; `server.rs` maps it to HTTP.

use std::sync::{Mutex, MutexGuard};

use crate::firewall::{Dataplane, Firewall, FirewallError};
use crate::metrics::AgentMetrics;
use crate::own_routes;
use crate::render::route_map;
use crate::servers::Supervisor;
use crate::state::{Admission, GenerationConflict, Ledger, StateFileError};
use crate::vm_env::EnvError;
use gpgpums::ids::HostId;
use gsaas_infra::metrics::inc;
use rodvr_contract::protocol::{
    AppliedState, ApplyOutcome, ApplyStatus, GpuEnv, GpuReport, Health, HostKind, HostReport,
    InvalidEntry, ManagedServers, RouteTable, ServerStatus,
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("missing or invalid controller token")]
    Unauthorized,
    #[error("request body is not a route table: {0}")]
    Malformed(String),
    #[error("invalid route table")]
    Invalid(#[source] InvalidEntry),
    #[error("generation conflict")]
    Conflict(#[source] GenerationConflict),
    #[error("could not persist the route table")]
    Persist(#[source] StateFileError),
    #[error("could not apply the route table")]
    Apply(#[source] FirewallError),
}

/// Static facts about the host reported to the controller.
#[derive(Debug, Clone)]
pub struct HostFacts {
    pub host: HostId,
    pub kind: HostKind,
    pub agent_url: String,
    pub gpus: Vec<GpuReport>,
    /// Where the host sits in the network (see [`gpgpums::topology`]).
    pub topology: gpgpums::Topology,
    /// Its address on the GPU network (see [`HostReport::gpu_address`]).
    pub gpu_address: Option<std::net::Ipv4Addr>,
    /// What it offers local VMs (see [`HostReport::local_vms`]).
    pub local_vms: Option<gpgpums::Resources>,
}

#[derive(Debug)]
struct Inner<F> {
    ledger: Ledger,
    dataplane: Dataplane<F>,
    applied_generation: Option<u64>,
    apply_error: Option<String>,
    /// The ledger's table with the routes to this host's own servers resolved (see
    /// [`crate::own_routes`]), when it has any; what the firewall and the VMs' environments hold.
    in_force: Option<RouteTable>,
}

#[derive(Debug)]
pub struct Agent<F> {
    inner: Mutex<Inner<F>>,
    metrics: AgentMetrics,
    facts: HostFacts,
    /// Each GPU's health as last asked (by index), over what discovery found at start.
    gpu_health: Mutex<std::collections::HashMap<u32, Option<String>>>,
    /// Round trips to GPU hosts as last measured (microseconds), for the next report; `None`
    /// until measured.
    rtt_us: Mutex<Option<std::collections::BTreeMap<HostId, u32>>>,
    /// The cGPU servers this host runs, when it runs them (`[gpu_servers] managed`).
    servers: Option<std::sync::Arc<dyn Supervisor>>,
    /// Held while the servers converge to the ledger's table: converging takes a while (new
    /// servers must accept), outside the main lock, and two must not interleave.
    converging: Mutex<()>,
}

impl<F: Firewall> Agent<F> {
    pub fn new(ledger: Ledger, dataplane: Dataplane<F>, facts: HostFacts) -> Self {
        let inner = Inner {
            ledger,
            dataplane,
            applied_generation: None,
            apply_error: None,
            in_force: None,
        };
        Self {
            inner: Mutex::new(inner),
            metrics: AgentMetrics::default(),
            facts,
            gpu_health: Mutex::default(),
            rtt_us: Mutex::default(),
            servers: None,
            converging: Mutex::new(()),
        }
    }

    /// An agent that runs a server per cGPU of its GPUs with `servers`.
    pub fn with_servers(mut self, servers: std::sync::Arc<dyn Supervisor>) -> Self {
        self.servers = Some(servers);
        self
    }

    /// The table's servers are this host's to run: it runs servers, and each is on one of its
    /// GPUs.
    fn check_servers(&self, table: &RouteTable) -> Result<(), InvalidEntry> {
        if table.servers.is_empty() {
            return Ok(());
        }
        if self.servers.is_none() {
            return Err(InvalidEntry {
                entry: "servers".into(),
                reason: "this host does not run its GPUs' servers ([gpu_servers] managed is off)"
                    .into(),
            });
        }
        for (i, server) in table.servers.iter().enumerate() {
            if !self.facts.gpus.iter().any(|gpu| gpu.id == server.gpu) {
                return Err(InvalidEntry {
                    entry: format!("servers[{i}].gpu"),
                    reason: format!("{} is not one of this host's GPUs", server.gpu),
                });
            }
        }
        Ok(())
    }

    /// Brings the servers to the ledger's table (none when this host runs none), lets each
    /// one's clients reach its port (and nothing else off the host reach the servers), and
    /// answers their statuses in the table's order.
    fn converge_servers(&self) -> Result<Vec<ServerStatus>, AgentError> {
        let Some(servers) = &self.servers else { return Ok(Vec::new()) };
        let _one_at_a_time = self.converging.lock().unwrap_or_else(|p| p.into_inner());
        let (generation, specs) = {
            let inner = self.lock();
            let table = inner.ledger.current();
            (table.map(|t| t.generation), table.map(|t| t.servers.clone()).unwrap_or_default())
        };
        let mut statuses = servers.converge(&specs);
        self.filter_servers(&specs, &statuses)?;
        self.route_own_servers(generation, &mut statuses)?;
        Ok(statuses)
    }

    /// Routes the table's cGPUs served here whose servers accept now (see
    /// [`crate::own_routes`]), unless a newer table came meanwhile (its own convergence does),
    /// and marks those servers `routed_here`.
    fn route_own_servers(
        &self,
        generation: Option<u64>,
        statuses: &mut [ServerStatus],
    ) -> Result<(), AgentError> {
        let mut inner = self.lock();
        let Some(table) = inner.ledger.current().filter(|t| Some(t.generation) == generation)
        else {
            return Ok(());
        };
        if table.lost.iter().all(|l| l.here.is_none()) {
            return Ok(());
        }
        let address = inner.dataplane.params().local_servers.map(|s| s.address);
        let (resolved, routed) =
            own_routes::resolve(table, address, &own_routes::live_ports(&*statuses));
        let resolved = match resolved {
            std::borrow::Cow::Owned(resolved) => Some(resolved),
            std::borrow::Cow::Borrowed(_) => None,
        };
        if inner.in_force != resolved {
            let routes = inner.route_map(Some(resolved.as_ref().unwrap_or(table)));
            inner.apply(routes, false, &self.metrics)?;
            inner.in_force = resolved;
        }
        for status in statuses.iter_mut() {
            status.routed_here = routed.contains(&status.key());
        }
        Ok(())
    }

    /// The filter that lets each server's clients reach its port, for `statuses` (in the order
    /// of `specs`, or any order: matched by cGPU).
    fn filter_servers(
        &self,
        specs: &[rodvr_contract::protocol::ServerSpec],
        statuses: &[ServerStatus],
    ) -> Result<(), AgentError> {
        let ports: std::collections::HashMap<_, u16> =
            statuses.iter().filter_map(|s| Some((s.key(), s.live_port()?))).collect();
        let allowed = specs
            .iter()
            .filter_map(|spec| Some((spec, *ports.get(&spec.key())?)))
            .flat_map(|(spec, port)| spec.clients.iter().map(move |client| (*client, port)))
            .collect();
        self.lock().dataplane.filter_servers(allowed).map_err(AgentError::Apply)
    }

    /// After a server moved or stopped accepting on its own (a restart): the filter follows its
    /// port. Blocking.
    pub fn refresh_server_filter(&self) -> Result<(), AgentError> {
        let Some(servers) = &self.servers else { return Ok(()) };
        let _one_at_a_time = self.converging.lock().unwrap_or_else(|p| p.into_inner());
        let specs = self.lock().ledger.current().map(|t| t.servers.clone()).unwrap_or_default();
        self.filter_servers(&specs, &servers.statuses())
    }

    /// Records the round trips measured to GPU hosts, for the next report.
    pub fn set_rtts(&self, rtt_us: std::collections::BTreeMap<HostId, u32>) {
        *self.rtt_us.lock().unwrap_or_else(|p| p.into_inner()) = Some(rtt_us);
    }

    /// Records each GPU's health now (by index; see the agent's `discovery::GpuDiscovery::health`),
    /// for the next report.
    pub fn set_gpu_health(&self, health: Vec<(u32, Option<String>)>) {
        *self.gpu_health.lock().unwrap_or_else(|p| p.into_inner()) = health.into_iter().collect();
    }

    fn lock(&self) -> MutexGuard<'_, Inner<F>> {
        // A panic while holding the lock leaves nothing half-done that the next apply does not
        // redo from the ledger, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits, persists and applies `table`. Blocking: runs `nft` for the real firewall.
    pub fn put_table(&self, table: RouteTable) -> Result<ApplyStatus, AgentError> {
        let mut inner = self.lock();
        let masked_range = inner.dataplane.params().masked_range;
        let refused = |e| {
            inc(&self.metrics.tables_refused);
            e
        };
        table.validate(Some(masked_range)).map_err(|e| refused(AgentError::Invalid(e)))?;
        self.check_servers(&table).map_err(|e| refused(AgentError::Invalid(e)))?;
        let admission = inner.ledger.admit(&table).map_err(|e| refused(AgentError::Conflict(e)))?;
        let mut status = ApplyStatus {
            generation: table.generation,
            routes: table.routes.len(),
            outcome: match admission {
                Admission::New => ApplyOutcome::Applied,
                Admission::Unchanged => ApplyOutcome::Unchanged,
            },
            servers: Vec::new(),
        };
        if admission != Admission::Unchanged || inner.applied_generation != Some(table.generation) {
            // The table as it came: a cGPU it lists as served here is routed below, once the
            // servers have converged, to its own server as it runs then (never to a port where
            // a server of the table before may have ended).
            let routes = inner.route_map(Some(&table));
            if admission == Admission::New {
                inner.ledger.persist(table).map_err(AgentError::Persist)?;
            }
            inner.in_force = None;
            inner.apply(routes, false, &self.metrics)?;
        }
        drop(inner);
        status.servers = self.converge_servers()?;
        Ok(status)
    }

    /// Rebuilds the whole table from the ledger (agent start, retries after a failed apply),
    /// and brings the servers to it.
    pub fn reapply(&self) -> Result<(), AgentError> {
        let applied = {
            let mut inner = self.lock();
            let routes = inner.route_map(inner.ledger.current());
            inner.in_force = None;
            inner.apply(routes, true, &self.metrics)
        };
        let served = self.converge_servers();
        applied.and(served.map(drop))
    }

    /// Cuts the conntrack entries of connections that the tables applied since the last call
    /// re-targeted (see [`Dataplane::tidy_connections`]): after a table's answer, off its path,
    /// and again on the retry timer while one fails. Blocking.
    pub fn tidy_connections(&self) -> Result<(), FirewallError> {
        let mut inner = self.lock();
        if !inner.dataplane.connections_to_tidy() {
            return Ok(());
        }
        inner.dataplane.tidy_connections()
    }

    /// Lets the servers start again what the last tables used up (see
    /// [`Supervisor::replenish`]): after a table's answer. Blocking.
    pub fn replenish_servers(&self) {
        if let Some(servers) = &self.servers {
            servers.replenish();
        }
    }

    /// Whether [`Self::tidy_connections`] has anything to do.
    pub fn connections_to_tidy(&self) -> bool {
        self.lock().dataplane.connections_to_tidy()
    }

    /// Whether the ledger holds a table the firewall does not.
    pub fn needs_apply(&self) -> bool {
        let inner = self.lock();
        inner.ledger.current().map(|t| t.generation) != inner.applied_generation
    }

    pub fn state(&self) -> AppliedState {
        let inner = self.lock();
        AppliedState {
            desired: inner.ledger.current().cloned(),
            applied_generation: inner.applied_generation,
            apply_error: inner.apply_error.clone(),
        }
    }

    pub fn health(&self) -> Health {
        Health { status: "ok".into(), applied_generation: self.lock().applied_generation }
    }

    pub fn host_report(&self) -> HostReport {
        HostReport {
            host: self.facts.host.clone(),
            kind: self.facts.kind,
            agent_url: self.facts.agent_url.clone(),
            gpus: {
                let health = self.gpu_health.lock().unwrap_or_else(|p| p.into_inner());
                let mut gpus = self.facts.gpus.clone();
                for gpu in &mut gpus {
                    if let Some(now) = health.get(&gpu.index) {
                        gpu.unhealthy = now.as_deref().map(rodvr_contract::protocol::health_reason);
                    }
                }
                gpus
            },
            applied_generation: self.lock().applied_generation,
            topology: self.facts.topology.clone(),
            local_vms: self.facts.local_vms,
            rtt_us: self.rtt_us.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            managed: self
                .servers
                .as_ref()
                .map(|servers| ManagedServers { mps: servers.mps(), servers: servers.statuses() }),
            gpu_address: self.facts.gpu_address,
        }
    }

    /// The agent's metrics in the Prometheus text format.
    pub fn metrics(&self) -> String {
        let inner = self.lock();
        let routes = inner
            .ledger
            .current()
            .filter(|_| inner.applied_generation.is_some())
            .map_or(0, |t| t.routes.len());
        let generation = inner.applied_generation;
        drop(inner);
        self.metrics.render(routes, generation)
    }

    /// The rCUDA environment of the VM at `ip`, per the table in force (see [`crate::vm_env`]).
    pub fn environment(&self, ip: std::net::Ipv4Addr) -> Result<GpuEnv, EnvError> {
        let inner = self.lock();
        match inner.ledger.current() {
            Some(table) if inner.applied_generation == Some(table.generation) => {
                crate::vm_env::environment_of(inner.in_force.as_ref().unwrap_or(table), ip)
            }
            _ => Err(EnvError::NotApplied),
        }
    }

    /// Runs `f` on the firewall (e.g. to inspect the in-memory one).
    pub fn with_firewall<R>(&self, f: impl FnOnce(&mut F) -> R) -> R {
        f(self.lock().dataplane.firewall_mut())
    }
}

impl<F: Firewall> Inner<F> {
    /// The map elements of `table`, with its VMs' metadata routes when both it and this agent
    /// name a metadata endpoint.
    fn route_map(&self, table: Option<&RouteTable>) -> crate::render::RouteMap {
        let Some(table) = table else { return Default::default() };
        route_map(table, self.dataplane.params().metadata_listener)
    }

    fn apply(
        &mut self,
        routes: crate::render::RouteMap,
        full: bool,
        metrics: &AgentMetrics,
    ) -> Result<(), AgentError> {
        let generation = self.ledger.current().map(|t| t.generation);
        let started = std::time::Instant::now();
        let result =
            if full { self.dataplane.replace(routes) } else { self.dataplane.converge(routes) };
        let histogram =
            if full { &metrics.apply_seconds_full } else { &metrics.apply_seconds_update };
        histogram.observe(started.elapsed().as_secs_f64());
        inc(if result.is_ok() { &metrics.applies_ok } else { &metrics.applies_failed });
        match result {
            Ok(()) => {
                self.applied_generation = generation;
                self.apply_error = None;
                Ok(())
            }
            Err(e) => {
                self.applied_generation = None;
                self.apply_error = Some("the host firewall refused or failed the table".into());
                Err(AgentError::Apply(e))
            }
        }
    }
}
