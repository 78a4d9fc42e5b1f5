//! `SimCloud`: a simulated Nova, the embedded default cloud of gsaasd.
//!
//! The demo, the benchmarks and the end-to-end tests run gsaasd without OpenStack, so this is a real
//! component with Nova's observable behaviour, not a test double: a server is created in BUILD after
//! the API's latency (`creation_delay`), is scheduled on a host that honours the request's
//! [`HostConstraint`], becomes ACTIVE with its host, fixed IP and tap after `activation_delay`, and
//! is "deployed" (its network is up inside the VM, the dissertation's third boot stage) after a
//! further `deployment_delay`. Delays are tokio timers, so tests under paused time cost nothing.
//!
//! Each server's state lives in a `tokio::sync::watch` channel. Waiters subscribe and wake on every
//! change instead of polling, and the channel closing (the server removed) ends every wait. The
//! state map sits behind a std `Mutex` that is never held across an `.await`.
//!
//! The lifecycle (activation, deployment) and the removal after a delete run in spawned tasks, as
//! they do in Nova: a caller that gives up waiting (a cancelled saga step) does not leave a server
//! half-created or half-deleted, and `find_server` recovers a creation whose caller went away.
//!
//! A VM's network is a hook, [`SimVmNetwork`], chosen by `vm_network`: the default is an address
//! pool ([`SimAddressPool`]); the end-to-end test configures [`SimNetns`], whose VMs are network
//! namespaces. A hook
//! that fails to bind puts the server in ERROR, as a failed port binding does in Nova; one that
//! fails to release makes the delete fail and leaves the server in ERROR, retryable.
//!
//! Saga tests need deterministic failures, so faults are injected ([`SimCloud::inject`]): each
//! fires once, in injection order per operation.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::{HostId, VmId};
pub use rodvr_contract::protocol::Ipv4Cidr;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

use super::sim_netns::{NetnsConfig, SimNetns};
pub use super::sim_network::{SimAddressPool, SimVmNetwork, VmPort};
use super::{
    Checked, Cloud, CloudError, HostConstraint, ServerId, ServerInfo, ServerSeen, ServerSpec,
    ServerStatus, TenantToken, VmRequest,
};

/// The simulated cloud's settings (`[cloud.sim]` in gsaasd's config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// How long `create_server` takes to return (Nova's API latency).
    pub creation_delay_ms: u64,
    /// From creation to ACTIVE.
    pub activation_delay_ms: u64,
    /// From ACTIVE to the VM's network being up.
    pub deployment_delay_ms: u64,
    /// From a delete request to the server being gone.
    pub deletion_delay_ms: u64,
    pub images: Vec<String>,
    pub flavors: Vec<String>,
    pub networks: Vec<String>,
    /// The default network's subnet: VMs get .2, .3, ... (.1 is the gateway).
    pub fixed_ip_range: Ipv4Cidr,
    /// If set, each server's user_data is written to `<record_dir>/<vm_id>.user_data`.
    pub record_dir: Option<PathBuf>,
    /// How VMs get their network (`[cloud.sim.vm_network]`); see [`SimVmNetworkConfig`].
    pub vm_network: SimVmNetworkConfig,
    /// Chaos: each check, creation, lookup, listing and deletion fails as an outage with this
    /// chance, in thousandths (0: never), drawn from `fault_seed`.
    pub fault_per_mille: u32,
    pub fault_seed: u64,
}

/// Which [`SimVmNetwork`] a [`SimCloud::new`] gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SimVmNetworkConfig {
    /// [`SimAddressPool`] over `fixed_ip_range`: addresses only, no kernel touched (the default).
    #[default]
    AddressPool,
    /// [`SimNetns`]: each VM is a network namespace wired to its host's namespace, with an
    /// address from `fixed_ip_range` (needs root and iproute2).
    Netns(NetnsConfig),
}

impl Default for SimConfig {
    fn default() -> Self {
        let names = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        Self {
            creation_delay_ms: 0,
            activation_delay_ms: 0,
            deployment_delay_ms: 0,
            deletion_delay_ms: 0,
            images: names(&["cirros-0.6.2", "ubuntu-22.04"]),
            flavors: names(&["m1.tiny", "m1.small", "m1.medium", "m1.large", "g1.gpu"]),
            networks: names(&["private"]),
            fixed_ip_range: Ipv4Cidr::new(Ipv4Addr::new(10, 77, 0, 0), 16).expect("a valid prefix"),
            record_dir: None,
            vm_network: SimVmNetworkConfig::AddressPool,
            fault_per_mille: 0,
            fault_seed: 0,
        }
    }
}

/// A failure to inject; each fires once. See [`SimCloud::inject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimFault {
    /// `check` fails with `Unavailable`.
    CheckUnavailable,
    /// `create_server` fails with `Unavailable` before anything exists.
    CreateUnavailable,
    /// `create_server` refuses a field.
    CreateInvalid { field: &'static str, reason: String },
    /// `create_server` fails with `Quota`.
    CreateQuota,
    /// The next server to activate goes to ERROR with this fault instead of ACTIVE.
    ActivationFails(String),
    /// The next server due to be deployed stays ACTIVE and never reports deployed.
    DeployTimeout,
    /// `delete_server` fails with `Unavailable`.
    DeleteUnavailable,
    /// `server` or `find_server` fails with `Unavailable`.
    ServerLookupUnavailable,
    /// The next listing of changed servers (the reconciler's look for drift) fails.
    ListingUnavailable,
}

/// Injected faults not yet fired, per operation.
#[derive(Debug, Default)]
struct Faults {
    check: u32,
    create: VecDeque<CloudError>,
    activation: VecDeque<String>,
    deploy_timeouts: u32,
    delete: u32,
    lookup: u32,
    listing: u32,
}

impl State {
    /// Whether this operation fails by chance (`fault_per_mille`).
    fn chaos_strikes(&mut self, per_mille: u32) -> bool {
        self.chaos.per_mille(per_mille)
    }
}

fn take(count: &mut u32) -> bool {
    let had = *count > 0;
    *count = count.saturating_sub(1);
    had
}

/// The CPU and memory of the simulated cloud's flavors: OpenStack's default flavors, and
/// `g1.gpu` (8 vCPUs, 32 GiB); `None` for a flavor configured by another name.
fn sim_flavor_resources(flavor: &str) -> Option<gpgpums::Resources> {
    let (vcpus, ram_mib) = match flavor {
        "m1.tiny" => (1, 512),
        "m1.small" => (1, 2048),
        "m1.medium" => (2, 4096),
        "m1.large" => (4, 8192),
        "m1.xlarge" => (8, 16384),
        "g1.gpu" => (8, 32768),
        _ => return None,
    };
    Some(gpgpums::Resources::new(vcpus * 1000, ram_mib))
}

fn injected_outage(operation: &str) -> CloudError {
    CloudError::unavailable(format!("injected fault: the compute API did not answer {operation}"))
}

/// Where a server is in its life, besides Nova's status.
#[derive(Debug, Clone)]
enum Lifecycle {
    Live,
    Deleting,
    /// The last delete failed; another delete retries.
    DeleteFailed(Arc<CloudError>),
    Gone,
}

/// What waiters watch.
#[derive(Debug, Clone)]
struct Observed {
    info: ServerInfo,
    deployed: bool,
    lifecycle: Lifecycle,
}

#[derive(Debug)]
struct ServerRecord {
    vm: VmId,
    /// When its host, status or life last changed (what `changes-since` compares).
    changed: std::time::SystemTime,
    /// The scheduled host; reported once ACTIVE.
    host: HostId,
    user_data: Vec<u8>,
    port: Option<VmPort>,
    observed: watch::Sender<Observed>,
}

#[derive(Debug, Default)]
struct State {
    /// The chaos faults' draws, seeded from `fault_seed`.
    chaos: gpgpums::seeded::SplitMix64,
    hosts: HostLoads,
    servers: HashMap<ServerId, ServerRecord>,
    /// The server of each VM that is not being deleted.
    live_by_vm: HashMap<VmId, ServerId>,
    /// Servers removed, and when, for `changes-since` (the latest [`MAX_TOMBSTONES`]).
    tombstones: VecDeque<(ServerId, std::time::SystemTime)>,
    faults: Faults,
}

/// How many removed servers the simulated cloud remembers.
const MAX_TOMBSTONES: usize = 4096;

impl State {
    fn schedule(&mut self, constraint: &HostConstraint) -> Result<HostId, CloudError> {
        let no_valid_host = |reason: String| CloudError::Invalid {
            field: "host",
            reason: format!("No valid host was found. {reason}"),
        };
        match constraint {
            HostConstraint::Pinned(host) if self.hosts.contains(host) => Ok(host.clone()),
            HostConstraint::Pinned(host) => Err(no_valid_host(format!(
                "Host {host:?} is not a compute host of this cloud (known: {})",
                join(&self.hosts.names)
            ))),
            HostConstraint::AnyOf(candidates) | HostConstraint::OnlyOf(candidates) => {
                self.hosts.least_loaded(candidates).ok_or_else(|| {
                    no_valid_host(format!(
                        "None of the candidate hosts ({}) is a compute host of this cloud",
                        join(candidates.iter())
                    ))
                })
            }
        }
    }

    fn add_live(&mut self, vm: VmId, id: ServerId, host: &HostId) {
        self.hosts.add_server(host);
        self.live_by_vm.insert(vm, id);
    }

    /// Takes `id` off the live servers if it is `vm`'s live server.
    fn remove_live(&mut self, vm: VmId, id: &ServerId) {
        if self.live_by_vm.get(&vm) != Some(id) {
            return;
        }
        self.live_by_vm.remove(&vm);
        let Some(host) = self.servers.get(id).map(|record| record.host.clone()) else { return };
        self.hosts.remove_server(&host);
    }

    fn live_record(&mut self, id: &ServerId) -> Option<&mut ServerRecord> {
        self.servers
            .get_mut(id)
            .filter(|record| matches!(record.observed.borrow().lifecycle, Lifecycle::Live))
    }
}

/// The compute hosts and how many live servers each runs: the scheduler's weigher. Kept ordered by
/// load as servers come and go, so a pick among thousands of hosts looks at the least loaded first
/// instead of weighing every candidate.
#[derive(Debug, Default)]
struct HostLoads {
    names: BTreeSet<HostId>,
    /// Live servers per host, compute host or not (a removed host's servers stay).
    live: HashMap<HostId, usize>,
    /// `(live servers, host)` of every compute host.
    by_load: BTreeSet<(usize, HostId)>,
    /// The last candidate list found in name order.
    sorted_candidates: Option<Arc<[HostId]>>,
}

impl HostLoads {
    fn contains(&self, host: &HostId) -> bool {
        self.names.contains(host)
    }

    fn load(&self, host: &HostId) -> usize {
        self.live.get(host).copied().unwrap_or(0)
    }

    fn insert(&mut self, host: HostId) {
        if self.names.insert(host.clone()) {
            self.by_load.insert((self.load(&host), host));
        }
    }

    fn set(&mut self, hosts: Vec<HostId>) {
        self.names.clear();
        self.by_load.clear();
        hosts.into_iter().for_each(|host| self.insert(host));
    }

    fn add_server(&mut self, host: &HostId) {
        self.reweigh(host, |live| live + 1);
    }

    fn remove_server(&mut self, host: &HostId) {
        self.reweigh(host, |live| live.saturating_sub(1));
    }

    fn reweigh(&mut self, host: &HostId, change: impl FnOnce(usize) -> usize) {
        let before = self.load(host);
        let after = change(before);
        match after {
            0 => self.live.remove(host),
            n => self.live.insert(host.clone(), n),
        };
        if self.names.contains(host) {
            self.by_load.remove(&(before, host.clone()));
            self.by_load.insert((after, host.clone()));
        }
    }

    /// The least loaded compute host among `candidates` (ties: the first by name).
    fn least_loaded(&mut self, candidates: &Arc<[HostId]>) -> Option<HostId> {
        // gsaasd passes the same shared list launch after launch: checked for order once.
        let sorted = match &self.sorted_candidates {
            Some(known) if Arc::ptr_eq(known, candidates) => true,
            _ if candidates.is_sorted() => {
                self.sorted_candidates = Some(candidates.clone());
                true
            }
            _ => false,
        };
        let is_candidate: Box<dyn Fn(&HostId) -> bool + '_> = if sorted {
            Box::new(|host| candidates.binary_search(host).is_ok())
        } else {
            let set: std::collections::HashSet<&HostId> = candidates.iter().collect();
            Box::new(move |host| set.contains(host))
        };
        self.by_load.iter().map(|(_, host)| host).find(|host| is_candidate(host)).cloned()
    }
}

fn join<'a, T: fmt::Display + 'a>(items: impl IntoIterator<Item = &'a T>) -> String {
    items.into_iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// An error and its sources, for a fault message that outlives the error.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

fn not_found(id: &ServerId) -> CloudError {
    CloudError::NotFound(format!("server {id}"))
}

fn require_known(
    field: &'static str,
    kind: &str,
    value: &str,
    known: &[String],
) -> Result<(), CloudError> {
    if known.iter().any(|k| k == value) {
        return Ok(());
    }
    Err(CloudError::Invalid {
        field,
        reason: format!("{value:?} not found; known {kind}: {}", known.join(", ")),
    })
}

#[derive(Debug)]
struct Shared {
    config: SimConfig,
    network: Arc<dyn SimVmNetwork>,
    state: Mutex<State>,
    /// Where the servers' lifecycles run: the runtime the cloud was made in, if any. A real Nova
    /// outlives the gsaasd that calls it (tests restart gsaasd on the same cloud), and the
    /// background lane gsaasd calls it from stops with that gsaasd (gsaasd's `lanes`).
    runtime: Option<tokio::runtime::Handle>,
}

impl Shared {
    fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        match &self.runtime {
            Some(runtime) => drop(runtime.spawn(work)),
            None => drop(tokio::spawn(work)),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn validate(&self, request: &VmRequest) -> Result<(), CloudError> {
        let config = &self.config;
        require_known("image", "images", &request.image, &config.images)?;
        require_known("flavor", "flavors", &request.flavor, &config.flavors)?;
        for network in &request.networks {
            require_known("networks", "networks", network, &config.networks)?;
        }
        Ok(())
    }

    /// Updates a server's observed state, if it still exists.
    fn observe(&self, id: &ServerId, update: impl FnOnce(&mut Observed)) {
        if let Some(record) = self.state().servers.get_mut(id) {
            record.changed = std::time::SystemTime::now();
            record.observed.send_modify(update);
        }
    }

    /// BUILD → ACTIVE → deployed, unless the server is deleted meanwhile.
    async fn run_lifecycle(self: Arc<Self>, id: ServerId) {
        let config = &self.config;
        let until_active = config.creation_delay_ms.saturating_add(config.activation_delay_ms);
        tokio::time::sleep(Duration::from_millis(until_active)).await;
        let (vm, host, injected_fault) = {
            let mut state = self.state();
            let Some(record) = state.live_record(&id) else { return };
            let (vm, host) = (record.vm, record.host.clone());
            (vm, host, state.faults.activation.pop_front())
        };
        if let Some(fault) = injected_fault {
            self.observe(&id, |o| o.info.status = ServerStatus::Error(fault));
            return;
        }
        let port = match self.network.attach(&id, vm, &host).await {
            Ok(port) => port,
            Err(err) => {
                let fault =
                    format!("binding the port on host {host} failed: {}", error_chain(&err));
                self.observe(&id, |o| o.info.status = ServerStatus::Error(fault));
                return;
            }
        };
        let bound = {
            let mut state = self.state();
            match state.live_record(&id) {
                Some(record) => {
                    record.port = Some(port.clone());
                    record.changed = std::time::SystemTime::now();
                    record.observed.send_modify(|o| {
                        o.info.status = ServerStatus::Active;
                        o.info.host = Some(host.clone());
                        o.info.fixed_ip = Some(port.fixed_ip);
                        o.info.tap = Some(port.tap.clone());
                    });
                    true
                }
                None => false,
            }
        };
        if !bound {
            // Deleted while the port was being bound: the removal did not see this port.
            if let Err(err) = self.network.detach(&id, &host, &port).await {
                tracing::warn!(server = %id, error = %error_chain(&err), "releasing the port of a deleted server failed");
            }
            return;
        }

        tokio::time::sleep(Duration::from_millis(config.deployment_delay_ms)).await;
        let mut state = self.state();
        if state.live_record(&id).is_some() && !take(&mut state.faults.deploy_timeouts) {
            if let Some(record) = state.servers.get(&id) {
                record.observed.send_modify(|o| o.deployed = true);
            }
        }
    }

    /// Releases the server's port and forgets the server.
    async fn run_removal(self: Arc<Self>, id: ServerId) {
        tokio::time::sleep(Duration::from_millis(self.config.deletion_delay_ms)).await;
        let Some((host, port)) =
            self.state().servers.get_mut(&id).map(|r| (r.host.clone(), r.port.take()))
        else {
            return;
        };
        if let Some(port) = port {
            if let Err(err) = self.network.detach(&id, &host, &port).await {
                let fault = format!("deleting the server failed: {}", error_chain(&err));
                if let Some(record) = self.state().servers.get_mut(&id) {
                    record.port = Some(port);
                    record.observed.send_modify(|o| {
                        o.info.status = ServerStatus::Error(fault);
                        o.lifecycle = Lifecycle::DeleteFailed(Arc::new(err));
                    });
                }
                return;
            }
        }
        let mut state = self.state();
        if let Some(record) = state.servers.remove(&id) {
            record.observed.send_modify(|o| o.lifecycle = Lifecycle::Gone);
            if state.tombstones.len() == MAX_TOMBSTONES {
                state.tombstones.pop_front();
            }
            state.tombstones.push_back((id, std::time::SystemTime::now()));
        }
    }
}

async fn record_user_data(dir: &Path, vm: VmId, user_data: &[u8]) -> Result<(), CloudError> {
    let path = dir.join(format!("{vm}.user_data"));
    // Written aside and renamed, so a reader in another process never sees half a file.
    let partial = dir.join(format!(".{vm}.user_data.{}", Uuid::new_v4()));
    // Tenants' user_data: 0600 files in a 0700 directory.
    let (dir, bytes, written) = (dir.to_owned(), user_data.to_vec(), partial.clone());
    let result = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::io::Write;
        gsaas_infra::files::create_private_dir(&dir)?;
        gsaas_infra::files::open_private(&written, true)?.write_all(&bytes)
    });
    let result = async {
        result.await.map_err(std::io::Error::other)??;
        tokio::fs::rename(&partial, &path).await
    };
    result.await.map_err(|err| CloudError::Unavailable {
        reason: format!("recording the user_data in {}", path.display()),
        source: Some(Box::new(err)),
    })
}

/// A simulated Nova. See the module docs. Cheap to share: clones are the same cloud.
#[derive(Debug, Clone)]
pub struct SimCloud {
    shared: Arc<Shared>,
}

impl SimCloud {
    /// A cloud whose VMs get the network `config.vm_network` says, with addresses from
    /// `config.fixed_ip_range`.
    pub fn new(config: SimConfig, hosts: Vec<HostId>) -> Self {
        let network: Arc<dyn SimVmNetwork> = match &config.vm_network {
            SimVmNetworkConfig::AddressPool => Arc::new(SimAddressPool::new(config.fixed_ip_range)),
            SimVmNetworkConfig::Netns(netns) => {
                Arc::new(SimNetns::new(netns.clone(), config.fixed_ip_range))
            }
        };
        Self::with_network(config, hosts, network)
    }

    /// A cloud whose VMs get their network from `network`.
    pub fn with_network(
        config: SimConfig,
        hosts: Vec<HostId>,
        network: Arc<dyn SimVmNetwork>,
    ) -> Self {
        let chaos = gpgpums::seeded::SplitMix64::new(config.fault_seed);
        let mut state = State { chaos, ..State::default() };
        state.hosts.set(hosts);
        let runtime = tokio::runtime::Handle::try_current().ok();
        Self { shared: Arc::new(Shared { config, network, state: Mutex::new(state), runtime }) }
    }

    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Makes `host` a compute host (an agent registered later).
    pub fn add_host(&self, host: HostId) {
        self.shared.state().hosts.insert(host);
    }

    /// Replaces the compute hosts; servers already on a removed host stay.
    pub fn set_hosts(&self, hosts: Vec<HostId>) {
        self.shared.state().hosts.set(hosts);
    }

    pub fn hosts(&self) -> Vec<HostId> {
        self.shared.state().hosts.names.iter().cloned().collect()
    }

    /// Queues a fault; faults of one operation fire once each, in the order injected.
    pub fn inject(&self, fault: SimFault) {
        let mut state = self.shared.state();
        let faults = &mut state.faults;
        match fault {
            SimFault::CheckUnavailable => faults.check += 1,
            SimFault::CreateUnavailable => faults.create.push_back(injected_outage("the create")),
            SimFault::CreateInvalid { field, reason } => {
                faults.create.push_back(CloudError::Invalid { field, reason });
            }
            SimFault::CreateQuota => faults.create.push_back(CloudError::Quota(
                "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"
                    .to_owned(),
            )),
            SimFault::ActivationFails(fault) => faults.activation.push_back(fault),
            SimFault::DeployTimeout => faults.deploy_timeouts += 1,
            SimFault::DeleteUnavailable => faults.delete += 1,
            SimFault::ServerLookupUnavailable => faults.lookup += 1,
            SimFault::ListingUnavailable => faults.listing += 1,
        }
    }

    /// The user_data the server was created with, while it exists.
    pub fn user_data(&self, id: &ServerId) -> Option<Vec<u8>> {
        self.shared.state().servers.get(id).map(|record| record.user_data.clone())
    }

    /// Where the user_data of `vm` is recorded, if `record_dir` is set.
    pub fn user_data_path(&self, vm: VmId) -> Option<PathBuf> {
        let dir = self.shared.config.record_dir.as_ref()?;
        Some(dir.join(format!("{vm}.user_data")))
    }

    /// Every server that exists (including those being deleted), ordered by id.
    pub fn servers(&self) -> Vec<ServerInfo> {
        let mut servers: Vec<ServerInfo> = (self.shared.state().servers.values())
            .map(|record| record.observed.borrow().info.clone())
            .collect();
        servers.sort_by(|a, b| a.id.cmp(&b.id));
        servers
    }

    /// Forgets the deleted servers, as `nova-manage db archive_deleted_rows` does: listings no
    /// longer report them, not even as deleted.
    pub fn archive_deleted(&self) {
        self.shared.state().tombstones.clear();
    }

    /// Whether a chaos fault strikes now (see [`SimConfig::fault_per_mille`]).
    fn strikes(&self) -> bool {
        let per_mille = self.shared.config.fault_per_mille;
        self.shared.state().chaos_strikes(per_mille)
    }

    fn start_removal(&self, state: &mut State, id: &ServerId, vm: VmId) {
        if let Some(record) = state.servers.get_mut(id) {
            record.changed = std::time::SystemTime::now();
            record.observed.send_modify(|o| o.lifecycle = Lifecycle::Deleting);
        }
        state.remove_live(vm, id);
        self.shared.spawn(Arc::clone(&self.shared).run_removal(id.clone()));
    }

    /// Deletes the server as a user of the cloud would behind GSaaS's back (`openstack server
    /// delete`); does not wait.
    pub fn delete_outside(&self, id: &ServerId) -> Result<(), CloudError> {
        let mut state = self.shared.state();
        let record = state.servers.get(id).ok_or_else(|| not_found(id))?;
        let vm = record.vm;
        if matches!(record.observed.borrow().lifecycle, Lifecycle::Live) {
            self.start_removal(&mut state, id, vm);
        }
        Ok(())
    }

    /// Moves the server to `host` as a live migration (or an evacuation) would: it keeps its
    /// port, so its fixed IP and tap.
    pub fn migrate(&self, id: &ServerId, host: &HostId) -> Result<(), CloudError> {
        let mut state = self.shared.state();
        if !state.hosts.contains(host) {
            return Err(CloudError::Invalid {
                field: "host",
                reason: format!("{host} is not a compute host of this cloud"),
            });
        }
        let record = state.live_record(id).ok_or_else(|| not_found(id))?;
        let old = std::mem::replace(&mut record.host, host.clone());
        record.changed = std::time::SystemTime::now();
        record.observed.send_modify(|o| o.info.host = Some(host.clone()));
        state.hosts.remove_server(&old);
        state.hosts.add_server(host);
        Ok(())
    }

    fn subscribe(&self, id: &ServerId) -> Result<watch::Receiver<Observed>, CloudError> {
        let state = self.shared.state();
        let record = state.servers.get(id).ok_or_else(|| not_found(id))?;
        Ok(record.observed.subscribe())
    }

    /// Waits until `done` holds; `NotFound` if the server is removed first.
    async fn wait_until(
        &self,
        id: &ServerId,
        timeout: Duration,
        done: impl FnMut(&Observed) -> bool,
    ) -> Result<Observed, CloudError> {
        let mut observed = self.subscribe(id)?;
        let wait = async {
            match observed.wait_for(done).await {
                Ok(state) => Ok(state.clone()),
                Err(_closed) => Err(not_found(id)),
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| CloudError::Timeout(timeout))?
    }
}

#[async_trait]
impl Cloud for SimCloud {
    async fn check(
        &self,
        request: &VmRequest,
        _tenant: Option<&TenantToken>,
    ) -> Result<Checked, CloudError> {
        if self.strikes() || take(&mut self.shared.state().faults.check) {
            return Err(injected_outage("the check"));
        }
        self.shared.validate(request)?;
        // The simulated cloud knows its flavors and images by name.
        let networks = serde_json::json!(request.networks);
        Ok(Checked {
            flavor: request.flavor.clone(),
            image: request.image.clone(),
            networks,
            flavor_resources: sim_flavor_resources(&request.flavor),
        })
    }

    /// A simulated Nova: Nova's limit.
    fn check_user_data_len(&self, bytes: usize) -> Result<(), String> {
        super::nova::check_user_data_len(bytes)
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<ServerId, CloudError> {
        {
            let mut state = self.shared.state();
            if let Some(err) = state.faults.create.pop_front() {
                return Err(err);
            }
            if state.chaos_strikes(self.shared.config.fault_per_mille) {
                return Err(injected_outage("the create (chaos)"));
            }
            self.shared.validate(&spec.request)?;
            if let Some(id) = state.live_by_vm.get(&spec.vm) {
                return Ok(id.clone());
            }
            state.schedule(&spec.host)?;
        }
        if let Some(dir) = &self.shared.config.record_dir {
            record_user_data(dir, spec.vm, &spec.user_data).await?;
        }
        let id = {
            let mut state = self.shared.state();
            if let Some(id) = state.live_by_vm.get(&spec.vm) {
                return Ok(id.clone());
            }
            let host = state.schedule(&spec.host)?;
            let id = ServerId(Uuid::new_v4().to_string());
            let info = ServerInfo {
                id: id.clone(),
                vm: spec.vm,
                status: ServerStatus::Build,
                host: None,
                fixed_ip: None,
                tap: None,
            };
            let observed = Observed { info, deployed: false, lifecycle: Lifecycle::Live };
            let record = ServerRecord {
                vm: spec.vm,
                changed: std::time::SystemTime::now(),
                host: host.clone(),
                user_data: spec.user_data.clone(),
                port: None,
                observed: watch::Sender::new(observed),
            };
            state.servers.insert(id.clone(), record);
            state.add_live(spec.vm, id.clone(), &host);
            id
        };
        self.shared.spawn(Arc::clone(&self.shared).run_lifecycle(id.clone()));
        tokio::time::sleep(Duration::from_millis(self.shared.config.creation_delay_ms)).await;
        Ok(id)
    }

    async fn find_server(&self, vm: VmId) -> Result<Option<ServerId>, CloudError> {
        let mut state = self.shared.state();
        if take(&mut state.faults.lookup) || state.chaos_strikes(self.shared.config.fault_per_mille)
        {
            return Err(injected_outage("the server lookup"));
        }
        Ok(state.live_by_vm.get(&vm).cloned())
    }

    async fn server(&self, id: &ServerId) -> Result<ServerInfo, CloudError> {
        let mut state = self.shared.state();
        if take(&mut state.faults.lookup) || state.chaos_strikes(self.shared.config.fault_per_mille)
        {
            return Err(injected_outage("the server lookup"));
        }
        let record = state.servers.get(id).ok_or_else(|| not_found(id))?;
        let info = record.observed.borrow().info.clone();
        Ok(info)
    }

    async fn wait_active(
        &self,
        id: &ServerId,
        timeout: Duration,
    ) -> Result<ServerInfo, CloudError> {
        let observed = self
            .wait_until(id, timeout, |o| {
                matches!(o.lifecycle, Lifecycle::Gone) || o.info.status != ServerStatus::Build
            })
            .await?;
        match (&observed.lifecycle, &observed.info.status) {
            (Lifecycle::Gone, _) => Err(not_found(id)),
            (_, ServerStatus::Error(fault)) => Err(CloudError::ServerFailed(fault.clone())),
            _ => Ok(observed.info),
        }
    }

    async fn wait_deployed(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError> {
        let observed = self
            .wait_until(id, timeout, |o| {
                matches!(o.lifecycle, Lifecycle::Gone)
                    || matches!(o.info.status, ServerStatus::Error(_))
                    || o.deployed
            })
            .await?;
        match (observed.lifecycle, observed.info.status) {
            (Lifecycle::Gone, _) => Err(not_found(id)),
            (_, ServerStatus::Error(fault)) => Err(CloudError::ServerFailed(fault)),
            _ => Ok(()),
        }
    }

    async fn changed_servers(
        &self,
        since: Option<std::time::SystemTime>,
    ) -> Result<Vec<ServerSeen>, CloudError> {
        let mut state = self.shared.state();
        if take(&mut state.faults.listing)
            || state.chaos_strikes(self.shared.config.fault_per_mille)
        {
            return Err(injected_outage("the server listing"));
        }
        let recent = |changed: &std::time::SystemTime| since.is_none_or(|since| *changed >= since);
        let mut seen: Vec<ServerSeen> = state
            .servers
            .iter()
            .filter(|(_, record)| recent(&record.changed))
            .map(|(id, record)| {
                let observed = record.observed.borrow();
                ServerSeen {
                    id: id.clone(),
                    host: observed.info.host.clone(),
                    gone: !matches!(observed.lifecycle, Lifecycle::Live),
                }
            })
            .collect();
        seen.extend(
            state.tombstones.iter().filter(|(_, at)| recent(at)).map(|(id, _)| ServerSeen {
                id: id.clone(),
                host: None,
                gone: true,
            }),
        );
        Ok(seen)
    }

    async fn delete_server(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError> {
        let mut observed = {
            let mut state = self.shared.state();
            if take(&mut state.faults.delete)
                || state.chaos_strikes(self.shared.config.fault_per_mille)
            {
                return Err(injected_outage("the delete"));
            }
            let Some(record) = state.servers.get(id) else { return Ok(()) };
            let vm = record.vm;
            let start_removal = matches!(
                record.observed.borrow().lifecycle,
                Lifecycle::Live | Lifecycle::DeleteFailed(_)
            );
            let observed = record.observed.subscribe();
            if start_removal {
                self.start_removal(&mut state, id, vm);
            }
            observed
        };
        let wait = async {
            let ended = observed
                .wait_for(|o| matches!(o.lifecycle, Lifecycle::Gone | Lifecycle::DeleteFailed(_)))
                .await;
            match ended.as_deref().map(|o| &o.lifecycle) {
                Ok(Lifecycle::DeleteFailed(err)) => Err(CloudError::Unavailable {
                    reason: format!("deleting server {id} failed"),
                    source: Some(Box::new(Arc::clone(err))),
                }),
                // Gone, or the record dropped with it.
                _ => Ok(()),
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| CloudError::Timeout(timeout))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_too_small_for_vms_hands_out_nothing() {
        let pool = SimAddressPool::new("10.0.0.0/31".parse().unwrap());
        assert!(matches!(pool.allocate(), Err(CloudError::Unavailable { .. })));
        let pool = SimAddressPool::new("10.0.0.0/30".parse().unwrap());
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(pool.allocate().is_err());
    }

    #[test]
    fn config_defaults_and_refuses_unknown_fields() {
        let config: SimConfig = serde_json::from_str(r#"{"activation_delay_ms": 5}"#).unwrap();
        assert_eq!(config, SimConfig { activation_delay_ms: 5, ..SimConfig::default() });
        assert_eq!(config.fixed_ip_range.to_string(), "10.77.0.0/16");
        assert!(serde_json::from_str::<SimConfig>(r#"{"activation_delay": 5}"#).is_err());
        assert!(serde_json::from_str::<SimConfig>(r#"{"fixed_ip_range": "10.0.0.1/24"}"#).is_err());
    }

    #[test]
    fn pool_hands_out_from_dot_two_reuses_lowest_freed_and_runs_out() {
        let pool = SimAddressPool::new("192.168.1.0/29".parse().unwrap());
        let got: Vec<Ipv4Addr> = (0..5).map(|_| pool.allocate().unwrap()).collect();
        let expected: Vec<Ipv4Addr> = (2..7).map(|d| Ipv4Addr::new(192, 168, 1, d)).collect();
        assert_eq!(got, expected);
        assert!(matches!(pool.allocate(), Err(CloudError::Unavailable { .. })));
        pool.release(Ipv4Addr::new(192, 168, 1, 5));
        pool.release(Ipv4Addr::new(192, 168, 1, 3));
        pool.release(Ipv4Addr::new(192, 168, 1, 7)); // never handed out
        pool.release(Ipv4Addr::new(10, 0, 0, 3)); // not in the range
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(192, 168, 1, 3));
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(192, 168, 1, 5));
        assert!(pool.allocate().is_err());
    }

    #[test]
    fn tap_is_named_like_neutron() {
        let port = VmPort::new(Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(port.tap.len(), 14);
        assert!(port.tap.starts_with("tap"));
        assert_eq!(&port.tap[11..12], "-");
    }
}
