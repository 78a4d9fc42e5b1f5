//! Hosts: registration and heartbeats from agents, the in-process inventory, drain, and the route
//! tables pushed to each host's agent.
//!
//! A host's table is always computed whole from the database (every cGPU of every VM on the host
//! whose routes are on) under a new generation, so pushes need no diffing here and a lost or repeated
//! push cannot leave a host half-configured: the agent diffs and applies.
//!
//! Pushes to one host are serialized and coalesced (see [`App::push_routes`]); pushes to different
//! hosts run side by side, and their database work (new generations and the routes read under
//! them; the generations the agents confirmed) goes through group commit ([`super::batch`]), so
//! pushes to many hosts at once cost a few statements, not a few per host.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Duration;

use gpgpums::{GpuId, HostId, HostKind, HostState};
use rodvr_contract::protocol::{
    HostKind as AgentHostKind, HostReport, LostCgpu, Route, RouteTable, RttTarget, ServedHere,
    ServerSpec, VmPort, MAX_RTT_TARGETS,
};

use super::batch::{fail_all, Queued};
use super::pool::BoxFuture;
use super::App;
use crate::agents::AgentError;
use crate::config::{HostsBackend, InventoryHost};
use crate::db::{self, now_ms, RoutedCgpu};
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{AlertKind, GpuRecord, HostRecord};

/// Why a GPU that still backs cGPUs but that its host no longer reports is unhealthy.
pub const GONE_FROM_REPORT: &str = "gone from its host's report";

/// A host's registration: what an agent reports, or an inventory entry.
#[derive(Debug, Clone)]
pub struct Registration {
    pub name: HostId,
    pub kind: HostKind,
    pub agent_url: Option<String>,
    pub gpus: Vec<GpuRecord>,
    pub topology: gpgpums::Topology,
    /// Round trips its agent measured to GPU hosts; `None`: nothing measured (the inventory's
    /// in-process hosts), what is stored stays.
    pub rtt_us: Option<BTreeMap<HostId, u32>>,
    /// Its agent runs its GPUs' servers, one per cGPU (see [`HostRecord::managed_servers`]).
    pub managed_servers: bool,
    /// Its address on the GPU network, as its agent reported it.
    pub gpu_address: Option<std::net::Ipv4Addr>,
    /// What it offers local VMs, as its agent reported it (see [`HostRecord::local_vms`]).
    pub local_vms: Option<gpgpums::Resources>,
}

/// The round trips to record of `host`'s `reported` ones at `now`: none unless they differ from
/// what is stored enough to matter to placement (another set of hosts, or one moved by more
/// than a fifth and 20 us: smaller moves are a LAN's noise) and the last recording is at least
/// `every_ms` old (the first is recorded at once). Each recording changes the pool, which every
/// replica then reloads: no agent may make that happen at every heartbeat.
pub fn rtts_to_record<'r>(
    host: &HostRecord,
    reported: Option<&'r BTreeMap<HostId, u32>>,
    now: i64,
    every_ms: i64,
) -> Option<&'r BTreeMap<HostId, u32>> {
    let reported = reported?;
    let stored = &host.rtt_us;
    let moved = stored.len() != reported.len()
        || stored
            .iter()
            .zip(reported)
            .any(|((a, &old), (b, &new))| a != b || old.abs_diff(new) > (old / 5).max(20));
    let due = host.rtt_recorded_ms == 0 || now.saturating_sub(host.rtt_recorded_ms) >= every_ms;
    (moved && due).then_some(reported)
}

impl Registration {
    /// A report (already validated) of a host whose agent gsaasd reaches at `agent_url`.
    pub fn from_report(report: &HostReport, agent_url: Option<String>) -> Registration {
        Registration {
            name: report.host.clone(),
            kind: match report.kind {
                AgentHostKind::ComputeGpu => HostKind::ComputeGpu,
                AgentHostKind::ComputeRgpu => HostKind::ComputeRgpu,
            },
            agent_url,
            gpus: report
                .gpus
                .iter()
                .map(|g| GpuRecord {
                    id: g.id.clone(),
                    host: report.host.clone(),
                    index: g.index,
                    model: g.model.clone(),
                    memory_mib: g.memory_mib,
                    rcuda_address: g.rcuda.address,
                    rcuda_port: g.rcuda.port,
                    rcuda_gpu_number: g.rcuda.gpu_number,
                    health: g.unhealthy.clone(),
                    attributes: g.attributes.clone(),
                    partition: g.partition.clone(),
                })
                .collect(),
            topology: report.topology.clone(),
            rtt_us: report.rtt_us.clone(),
            managed_servers: report.managed.is_some(),
            gpu_address: report.gpu_address,
            local_vms: report.local_vms,
        }
    }

    /// An inventory entry; its GPUs are served by one rCUDA daemon each on 8308 + index.
    pub fn from_inventory(host: &InventoryHost) -> Registration {
        let gpus = host
            .gpus()
            .into_iter()
            .map(|gpu| GpuRecord {
                id: GpuId::on_host(&host.name, gpu.index),
                host: host.name.clone(),
                index: gpu.index,
                model: gpu.model,
                memory_mib: gpu.memory_mib,
                rcuda_address: *gpu.rcuda.ip(),
                rcuda_port: gpu.rcuda.port(),
                rcuda_gpu_number: 0,
                health: gpu.unhealthy,
                attributes: gpu.attributes,
                partition: gpu.partition.map(|(parent, profile)| gpgpums::Partition {
                    parent: GpuId::on_host(&host.name, parent),
                    profile,
                }),
            })
            .collect();
        Registration {
            name: host.name.clone(),
            kind: host.kind,
            agent_url: None,
            gpus,
            topology: host.topology.clone(),
            rtt_us: None,
            managed_servers: false,
            gpu_address: None,
            local_vms: None,
        }
    }
}

impl App {
    /// Registers a host from its agent's (or an admin's) report, or records its heartbeat.
    ///
    /// Nothing in the report is believed before it passes [`HostReport::validate`]. The agent's
    /// own URL is not believed at all: with real agents a host must have a URL in gsaasd's config
    /// (`hosts.agent_urls` or `hosts.agent_url_template`), or it is refused.
    pub async fn register_report(
        self: &Arc<Self>,
        report: &HostReport,
    ) -> Result<HostRecord, Error> {
        report
            .validate(self.config.masking.range)
            .map_err(|e| Error::invalid(e.entry, e.reason))?;
        let agent_url = match self.config.hosts.backend {
            HostsBackend::InProcess => None,
            HostsBackend::Agent => {
                Some(self.config.hosts.agent_url(&report.host).ok_or_else(|| {
                    Error::Conflict(format!(
                        "gsaasd's config gives no URL for the agent of host {}: an operator sets \
                     hosts.agent_urls or hosts.agent_url_template",
                        report.host
                    ))
                })?)
            }
        };
        // An agent that holds another table than gsaasd believes, or that comes back with a
        // table to catch up on (pushes failed while it was away, fenced routes wait for it),
        // gets its table now rather than at the reconciler's next pass.
        let drifted = {
            self.db.host(&report.host).await?.is_some_and(|h| {
                report.applied_generation.unwrap_or(0) != h.applied_generation
                    || (h.state == HostState::Unavailable
                        && h.applied_generation < h.routes_generation)
                    || h.forgotten
            })
        };
        let host = self.register_host(Registration::from_report(report, agent_url)).await?;
        if drifted {
            self.trigger_reconcile();
        }
        if let Some(managed) = &report.managed {
            self.servers_reported(&host, managed).await?;
        }
        Ok(host)
    }

    /// Registers a host or records its heartbeat. New GPUs join the pool; GPUs the host no longer
    /// reports leave it when unused (a GPU still backing cGPUs stays until they are released). A host
    /// that was unavailable becomes schedulable again, unless an operator drained it.
    pub async fn register_host(&self, registration: Registration) -> Result<HostRecord, Error> {
        let rtt_every_ms =
            i64::try_from(self.config.hosts.rtt_record_interval_secs.saturating_mul(1000))
                .unwrap_or(i64::MAX);
        if registration.kind != HostKind::ComputeGpu && !registration.gpus.is_empty() {
            return Err(Error::invalid(
                "gpus",
                format!("a {} host has no GPUs", registration.kind),
            ));
        }
        let existing = {
            let host = self.db.host(&registration.name).await?;
            let gpus = self.db.gpus_of_host(&registration.name).await?;
            host.map(|h| (h, gpus))
        };
        if let Some((host, gpus)) = &existing {
            if host.kind != registration.kind {
                return Err(Error::Conflict(format!(
                    "host {} is registered as {}, not {}",
                    host.name, host.kind, registration.kind
                )));
            }
            let same_gpus = gpus.len() == registration.gpus.len()
                && registration.gpus.iter().all(|g| gpus.contains(g));
            if same_gpus
                && host.state != HostState::Unavailable
                && host.topology == registration.topology
                && host.managed_servers == registration.managed_servers
                && host.gpu_address == registration.gpu_address
                && host.local_vms == registration.local_vms
                && rtts_to_record(host, registration.rtt_us.as_ref(), now_ms(), rtt_every_ms)
                    .is_none()
            {
                // A plain heartbeat: no pool change.
                self.db.touch_host(&host.name, registration.agent_url.as_deref(), now_ms()).await?;
                return Ok(HostRecord {
                    agent_url: registration.agent_url.clone(),
                    ..host.clone()
                });
            }
        }
        // Before the pool transaction: a refused claim bumps no generation (a hostile agent's
        // repeated claims would otherwise make every replica reload its pool), and the alert
        // needs the holder, which a rolled-back transaction's error would not carry.
        let stored_gpus = existing.as_ref().map_or(&[][..], |(_, gpus)| &gpus[..]);
        if let Some((claimed, holder)) =
            self.foreign_endpoint_claim(&registration, stored_gpus).await?
        {
            return Err(self.refuse_endpoint_claim(&claimed, &holder).await);
        }
        let name = registration.name.clone();
        let kind = registration.kind;
        let failed = self.with_pool(move |pool, tx| {
            Box::pin(async move {
                let now = now_ms();
                let stored = tx.host(&registration.name).await?;
                match &stored {
                    None => {
                        tx.insert_host(&registration.name, registration.kind, registration.agent_url.as_deref(), &registration.topology, now)
                            .await?;
                        pool.add_host(registration.name.clone(), registration.kind)?;
                        if registration.managed_servers || registration.gpu_address.is_some() {
                            tx.set_host_servers(&registration.name, registration.managed_servers, registration.gpu_address).await?;
                        }
                        pool.set_host_topology(&registration.name, registration.topology.clone())?;
                        if registration.local_vms.is_some() {
                            tx.set_host_local_vms(&registration.name, registration.local_vms).await?;
                            pool.set_host_resources(&registration.name, registration.local_vms)?;
                        }
                        if let Some(rtt_us) = registration.rtt_us.as_ref().filter(|r| !r.is_empty()) {
                            tx.set_host_rtts(&registration.name, rtt_us, now).await?;
                            pool.set_host_rtts(&registration.name, rtt_us.iter().map(|(h, us)| (h.clone(), *us)))?;
                        }
                    }
                    Some(host) => {
                        tx.touch_host(&host.name, registration.agent_url.as_deref(), now).await?;
                        if (host.managed_servers, host.gpu_address) != (registration.managed_servers, registration.gpu_address) {
                            tracing::info!(host = %host.name, managed = registration.managed_servers, gpu_address = ?registration.gpu_address, "the host's servers or GPU-network address changed");
                            tx.set_host_servers(&host.name, registration.managed_servers, registration.gpu_address).await?;
                        }
                        if host.topology != registration.topology {
                            tracing::info!(host = %host.name, "the host's topology changed");
                            tx.set_host_topology(&host.name, &registration.topology).await?;
                            pool.set_host_topology(&host.name, registration.topology.clone())?;
                        }
                        if host.local_vms != registration.local_vms {
                            tracing::info!(host = %host.name, offers = ?registration.local_vms, "what the host offers local VMs changed");
                            tx.set_host_local_vms(&host.name, registration.local_vms).await?;
                            pool.set_host_resources(&host.name, registration.local_vms)?;
                        }
                        if let Some(rtt_us) = rtts_to_record(host, registration.rtt_us.as_ref(), now, rtt_every_ms) {
                            tx.set_host_rtts(&host.name, rtt_us, now).await?;
                            pool.set_host_rtts(&host.name, rtt_us.iter().map(|(h, us)| (h.clone(), *us)))?;
                        }
                        if host.state == HostState::Unavailable {
                            // Back (after a silence, or forgotten): as an operator left it.
                            let state = if host.drained {
                                HostState::Drained
                            } else {
                                HostState::Schedulable
                            };
                            tx.set_host_state(&host.name, state, host.drained).await?;
                            pool.set_host_state(&host.name, state)?;
                        }
                    }
                }
                let mut stored_gpus = tx.gpus_of_host(&registration.name).await?;
                // Partitions leave the pool before their parents, and join after them.
                stored_gpus.sort_by_key(|gpu| gpu.partition.is_none());
                // Each stored GPU's report, if the host still reports the same device.
                let same: Vec<Option<&GpuRecord>> = stored_gpus
                    .iter()
                    .map(|s| registration.gpus.iter().find(|g| g.same_device(s)))
                    .collect();
                // The partitions of a GPU that leaves (gone, or changed) leave with it.
                let leaving: HashSet<&GpuId> =
                    stored_gpus.iter().zip(&same).filter(|(_, r)| r.is_none()).map(|(s, _)| &s.id).collect();
                // The stored GPUs still registered after this report.
                let mut kept: HashSet<GpuId> = HashSet::new();
                let mut failed = false;
                for (gpu, reported) in stored_gpus.iter().zip(&same) {
                    let parent_leaves =
                        gpu.partition.as_ref().is_some_and(|p| leaving.contains(&p.parent));
                    let reported = reported.filter(|_| !parent_leaves);
                    if let Some(reported) = reported.filter(|r| r.attributes != gpu.attributes) {
                        // A driver upgrade or an operator's new traits: the GPU keeps its cGPUs.
                        tracing::info!(gpu = %gpu.id, "GPU attributes changed");
                        pool.set_gpu_attributes(&gpu.id, reported.attributes.clone())?;
                        tx.set_gpu_attributes(&gpu.id, &reported.attributes).await?;
                    }
                    let health = match reported {
                        Some(reported) => reported.health.clone(),
                        None => match pool.remove_gpu(&gpu.id) {
                            Ok(_) => {
                                tx.delete_gpu(&gpu.id).await?;
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!(gpu = %gpu.id, error = %e, "GPU gone from its host's report");
                                Some(GONE_FROM_REPORT.to_owned())
                            }
                        },
                    };
                    kept.insert(gpu.id.clone());
                    if health != gpu.health {
                        tracing::warn!(gpu = %gpu.id, health = health.as_deref().unwrap_or("healthy"), "GPU health changed");
                        failed |= health.is_some();
                        tx.set_gpu_health(&gpu.id, health.as_deref()).await?;
                        pool.set_gpu_health(&gpu.id, health)?;
                    }
                }
                let mut joining: Vec<&GpuRecord> = registration.gpus.iter().collect();
                joining.sort_by_key(|gpu| gpu.partition.is_some());
                for gpu in joining {
                    if !stored_gpus.iter().any(|s| kept.contains(&s.id) && s.same_device(gpu)) {
                        // Checked before, and again here: another replica may have taken it since.
                        if let Some(holder) = tx.rcuda_endpoint_holder(gpu).await? {
                            if holder.host != gpu.host {
                                return Err(endpoint_claimed(gpu));
                            }
                            // A GPU of its own host that left its report but still backs
                            // cGPUs: the new one joins once that one is released.
                            tracing::warn!(gpu = %gpu.id, holder = %holder.id, "rCUDA endpoint still held by a GPU gone from the report; the GPU joins later");
                            continue;
                        }
                        if let Err(e) = pool.add_gpu(gpu.spec()) {
                            // It conflicts with what stays (a GPU gone from the report but still
                            // backing cGPUs under its id, or a partition's parent that could not
                            // join or has no room left): it joins at a later report. The rest of
                            // the report, the heartbeat included, counts.
                            tracing::warn!(gpu = %gpu.id, error = %e, "the GPU joins later");
                            continue;
                        }
                        pool.set_gpu_health(&gpu.id, gpu.health.clone())?;
                        tx.insert_gpu(gpu).await?;
                    }
                }
                Ok(failed)
            })
        })
        .await?;
        if failed {
            // A GPU failed: its cGPUs may be re-homed (hosts.auto_rehome).
            self.trigger_reconcile();
        }
        // New GPUs, or a host back: queued launches may fit now.
        self.trigger_queue();
        if let Some(sim) = &self.sim {
            if kind.has_agent() {
                sim.add_host(name.clone());
            }
        }
        self.db
            .host(&name)
            .await?
            .ok_or_else(|| Error::NotFound { kind: "host", id: name.to_string() })
    }

    /// The first of the registration's new GPUs whose rCUDA endpoint a GPU of another host holds,
    /// with that GPU.
    async fn foreign_endpoint_claim(
        &self,
        registration: &Registration,
        stored: &[GpuRecord],
    ) -> Result<Option<(GpuRecord, GpuRecord)>, Error> {
        for gpu in &registration.gpus {
            if stored.iter().any(|s| s.same_device(gpu)) {
                continue;
            }
            if let Some(holder) = self.db.rcuda_endpoint_holder(gpu).await? {
                if holder.host != gpu.host {
                    return Ok(Some((gpu.clone(), holder)));
                }
            }
        }
        Ok(None)
    }

    /// Refuses a report that claims `holder`'s rCUDA endpoint for `claimed`, telling admins on
    /// both hosts.
    async fn refuse_endpoint_claim(&self, claimed: &GpuRecord, holder: &GpuRecord) -> Error {
        let endpoint = format!("{}:{}", claimed.rcuda_address, claimed.rcuda_port);
        let kind = AlertKind::EndpointConflict;
        let detail = format!(
            "its report claimed rCUDA endpoint {endpoint} for GPU {}, which GPU {} of host {} \
             holds: the report was refused",
            claimed.id, holder.id, holder.host
        );
        self.alert_host(&claimed.host, kind, detail).await;
        let detail = format!(
            "host {} claimed rCUDA endpoint {endpoint} of GPU {}: its report was refused",
            claimed.host, holder.id
        );
        self.alert_host(&holder.host, kind, detail).await;
        endpoint_claimed(claimed)
    }

    /// Tells the simulated cloud (if it is the backend) about every registered host with an agent.
    pub async fn sync_sim_hosts(&self) -> Result<(), Error> {
        if let Some(sim) = &self.sim {
            let hosts = self.hosts().await?;
            sim.set_hosts(
                hosts.into_iter().filter(|h| h.kind.has_agent()).map(|h| h.name).collect(),
            );
        }
        Ok(())
    }

    /// The GPU hosts whose round trips `host`'s agent measures (see
    /// [`gpgpums::Pool::rtt_targets`]). A host not registered: 404.
    pub async fn rtt_targets(&self, host: &HostId) -> Result<Vec<RttTarget>, Error> {
        let asked = host.clone();
        let targets = self
            .read_pool(move |pool| pool.rtt_targets(&asked, MAX_RTT_TARGETS))
            .await?
            .ok_or_else(|| Error::NotFound { kind: "host", id: host.to_string() })?;
        Ok(targets
            .into_iter()
            .map(|(host, rcuda)| RttTarget { host, address: rcuda.address, port: rcuda.port })
            .collect())
    }

    /// Registers the configured inventory (in-process agents). Hosts stored as configured (the
    /// usual restart) are only marked seen, all at once; the others register one by one.
    pub async fn register_inventory(&self) -> Result<(), Error> {
        let (stored_hosts, stored_gpus) = { (self.db.hosts().await?, self.db.gpus().await?) };
        let hosts: HashMap<&HostId, &HostRecord> =
            stored_hosts.iter().map(|h| (&h.name, h)).collect();
        let mut gpus: HashMap<&HostId, Vec<&GpuRecord>> = HashMap::new();
        for gpu in &stored_gpus {
            gpus.entry(&gpu.host).or_default().push(gpu);
        }
        let mut unchanged = Vec::new();
        for host in self.config.inventory() {
            let registration = Registration::from_inventory(&host);
            let stored = hosts.get(&registration.name).is_some_and(|h| {
                h.kind == registration.kind
                    && h.state != HostState::Unavailable
                    && !h.forgotten
                    && h.topology == registration.topology
            });
            let same_gpus = gpus.get(&registration.name).is_some_and(|stored| {
                stored.len() == registration.gpus.len()
                    && registration.gpus.iter().all(|g| stored.contains(&g))
            }) || (registration.gpus.is_empty()
                && !gpus.contains_key(&registration.name));
            if stored && same_gpus {
                unchanged.push(registration.name);
            } else {
                self.register_host(registration).await?;
            }
        }
        self.db.touch_hosts(&unchanged, now_ms()).await?;
        Ok(())
    }

    /// The round trips of the inventory's in-process hosts, which no agent measures: each host's
    /// to the hosts a real agent would measure ([`gpgpums::Pool::rtt_targets`]), derived from
    /// their topologies ([`gpgpums::Pool::nominal_rtt_us`]), recorded where they changed. So
    /// `network.max_rtt_us` works on the embedded default as on a measured fleet.
    pub async fn record_nominal_rtts(&self) -> Result<(), Error> {
        let stored: HashMap<HostId, BTreeMap<HostId, u32>> =
            self.db.hosts().await?.into_iter().map(|h| (h.name, h.rtt_us)).collect();
        let names: Vec<HostId> = self.config.inventory().into_iter().map(|h| h.name).collect();
        self.with_pool(move |pool, tx| {
            Box::pin(async move {
                let now = now_ms();
                for name in &names {
                    let Some(targets) = pool.rtt_targets(name, MAX_RTT_TARGETS) else { continue };
                    let rtts: BTreeMap<HostId, u32> = targets
                        .into_iter()
                        .filter_map(|(to, _)| Some((to.clone(), pool.nominal_rtt_us(name, &to)?)))
                        .collect();
                    if stored.get(name).is_some_and(|known| *known == rtts) || rtts.is_empty() {
                        continue;
                    }
                    tx.set_host_rtts(name, &rtts, now).await?;
                    pool.set_host_rtts(name, rtts)?;
                }
                Ok(())
            })
        })
        .await
    }

    /// Every host, and the alerts of those that have some.
    pub async fn hosts_with_alerts(
        &self,
    ) -> Result<(Vec<HostRecord>, HashMap<HostId, Vec<db::HostAlert>>), Error> {
        Ok((self.db.hosts().await?, self.db.host_alerts().await?))
    }

    /// What the local VMs take on each host that holds any (the pool's bookings).
    pub async fn local_vms_taken(&self) -> Result<HashMap<HostId, gpgpums::Resources>, Error> {
        self.read_pool(|pool| {
            pool.hosts()
                .filter_map(|(id, ..)| Some((id.clone(), pool.host_resources(id)?.1)))
                .filter(|(_, taken)| *taken != gpgpums::Resources::default())
                .collect()
        })
        .await
    }

    pub async fn hosts(&self) -> Result<Vec<HostRecord>, Error> {
        Ok(self.db.hosts().await?)
    }

    /// Drains (or undrains) a host: it takes no new cGPUs; what it has stays.
    pub async fn set_drained(&self, name: &HostId, drained: bool) -> Result<HostRecord, Error> {
        let name = name.clone();
        let updated = name.clone();
        self.with_pool(move |pool, tx| {
            Box::pin(async move {
                let host = tx
                    .host(&name)
                    .await?
                    .ok_or_else(|| Error::NotFound { kind: "host", id: name.to_string() })?;
                let state = match (drained, host.state) {
                    (true, _) => HostState::Drained,
                    (false, HostState::Unavailable) => HostState::Unavailable,
                    (false, _) => HostState::Schedulable,
                };
                tx.set_host_state(&name, state, drained).await?;
                pool.set_host_state(&name, state)?;
                Ok(())
            })
        })
        .await?;
        if !drained {
            self.trigger_queue();
        }
        self.db
            .host(&updated)
            .await?
            .ok_or_else(|| Error::NotFound { kind: "host", id: updated.to_string() })
    }

    /// Marks hosts whose agents stopped reporting as unavailable. Returns how many.
    pub(crate) async fn expire_heartbeats(&self, timeout: Duration) -> Result<usize, Error> {
        let deadline = now_ms() - timeout.as_millis() as i64;
        // In name order, the order every statement that writes several hosts locks them.
        let stale: std::collections::BTreeSet<HostId> = self
            .hosts()
            .await?
            .into_iter()
            .filter(|h| {
                h.kind.has_agent() && h.state == HostState::Schedulable && h.last_seen_ms < deadline
            })
            .map(|h| h.name)
            .collect();
        let count = stale.len();
        if count > 0 {
            self.with_pool(move |pool, tx| {
                Box::pin(async move {
                    for name in &stale {
                        tracing::warn!(host = %name, "no heartbeat; host unavailable for new cGPUs");
                        tx.set_host_state(name, HostState::Unavailable, false).await?;
                        pool.set_host_state(name, HostState::Unavailable)?;
                    }
                    Ok(())
                })
            })
            .await?;
        }
        Ok(count)
    }

    /// Computes the host's whole table under a new generation and has its agent apply it.
    ///
    /// Pushes to a host are serialized, and one push stands for every request made before it read
    /// the database (group commit): a caller takes a ticket after its own change committed; a push
    /// that succeeds covers every ticket taken before its read, and a caller whose ticket is
    /// covered when it gets the lock returns at once.
    pub(crate) async fn push_routes(&self, host: &HostId) -> Result<(), Error> {
        self.push_routes_from(host, None).await
    }

    /// [`Self::push_routes`], with the host's table read ahead (see [`Self::read_tables_ahead`])
    /// if it has one: it stands for this push's read if no change of the host took a ticket
    /// since that read began.
    pub(crate) async fn push_routes_from(
        &self,
        host: &HostId,
        ahead: Option<ReadAhead>,
    ) -> Result<(), Error> {
        let follow = self.push_table(host, ahead).await?;
        // A host that runs its GPUs' servers answered ports that moved: the tables that route
        // to them follow (their own hosts run no servers, or their ports are recorded now, so
        // this ends).
        for next in follow {
            if let Err(e) = Box::pin(self.push_routes(&next)).await {
                tracing::warn!(host = %next, error = %crate::error::ErrorChain(&e), "route push after a server moved failed; the reconciler retries");
            }
        }
        Ok(())
    }

    /// [`Self::push_routes_from`] without the pushes that follow from it: returns the hosts
    /// whose tables route to servers of this host that moved (see [`Self::note_servers`]).
    async fn push_table(
        &self,
        host: &HostId,
        ahead: Option<ReadAhead>,
    ) -> Result<std::collections::BTreeSet<HostId>, Error> {
        use std::sync::atomic::Ordering;
        let pushes = self.host_lock(host);
        let ticket = pushes.ticket.fetch_add(1, Ordering::SeqCst) + 1;
        let mut ahead = ahead.filter(|ahead| ahead.ticket + 1 == ticket);
        let mut covered = pushes.covered.lock().await;
        if *covered >= ticket {
            return Ok(Default::default());
        }
        let timeout = Duration::from_millis(self.config.launch.agent_timeout_ms);
        for _ in 0..3 {
            // Every ticket up to here was taken after its change committed, so the read below sees
            // it; a table read ahead covers the tickets before it, and this push's own.
            let (reading, (record, routed, servers)) = match ahead.take() {
                Some(ahead) => (ticket, ahead.table),
                None => (
                    pushes.ticket.load(Ordering::SeqCst),
                    self.batchers.route_tables.submit(host.clone()).await?,
                ),
            };
            let (record, table) = {
                // A route matches the VM's tap and fixed IP together: the tap cannot be spoofed
                // from inside a VM, and tells VMs apart where tenant networks overlap. A VM
                // without both (none since the saga requires them) gets no route.
                let mut routes: Vec<Route> = Vec::new();
                let mut vms_without_cgpus = Vec::new();
                let mut lost = Vec::new();
                // A VM's rows come together (both readers group them): the VM of the last route,
                // and the VM listed without a route for a lost cGPU, while its rows last.
                let (mut routed_vm, mut idle_vm) = (None, None);
                let mut served_here: Option<HashSet<(gpgpums::VmId, u32)>> = None;
                for c in routed {
                    let (Some(vm_ip), Some(vm_tap)) = (c.fixed_ip, c.tap) else {
                        tracing::error!(vm = %c.vm, %host, "no tap or fixed IP: not routed");
                        continue;
                    };
                    match c.cgpu {
                        // Lost, or on a managed GPU whose server does not accept yet
                        // (port 0): missing from its VM until it does.
                        Some(cgpu) if cgpu.lost || cgpu.target.port() == 0 => {
                            // On a managed GPU of this same host: its agent routes it to its
                            // server once that accepts, without waiting for this push's answer.
                            let served = served_here.get_or_insert_with(|| {
                                servers.iter().map(|s| (s.vm, s.index)).collect()
                            });
                            let here =
                                (!cgpu.lost && served.contains(&(c.vm, cgpu.index))).then_some(
                                    ServedHere { masked: cgpu.masked, gpu_number: cgpu.gpu_number },
                                );
                            lost.push(LostCgpu { vm: c.vm, index: cgpu.index, here });
                            // Its VM reads its environment even when none of its cGPUs has a
                            // route (listed once, after its routes).
                            if routed_vm != Some(c.vm) && idle_vm != Some(c.vm) {
                                idle_vm = Some(c.vm);
                                let remoting = c.remoting;
                                vms_without_cgpus.push(VmPort {
                                    vm: c.vm,
                                    vm_ip,
                                    vm_tap,
                                    remoting,
                                });
                            }
                        }
                        Some(cgpu) => {
                            if idle_vm.take_if(|vm| *vm == c.vm).is_some() {
                                // Listed for a lost cGPU before this route: it has a route.
                                vms_without_cgpus.pop();
                            }
                            routed_vm = Some(c.vm);
                            routes.push(Route {
                                vm: c.vm,
                                vm_ip,
                                vm_tap,
                                masked: cgpu.masked,
                                target: cgpu.target,
                                gpu_number: cgpu.gpu_number,
                                index: Some(cgpu.index),
                                remoting: c.remoting,
                            })
                        }
                        None => {
                            let port = VmPort { vm: c.vm, vm_ip, vm_tap, remoting: c.remoting };
                            vms_without_cgpus.push(port);
                        }
                    }
                }
                let generation = record.routes_generation;
                let metadata = self.config.masking.metadata_endpoint();
                (
                    record,
                    RouteTable { generation, routes, metadata, vms_without_cgpus, lost, servers },
                )
            };
            let generation = table.generation;
            let targets: Vec<SocketAddrV4> = table.routes.iter().map(|r| r.target).collect();
            let sent_here: HashSet<(gpgpums::VmId, u32)> =
                table.lost.iter().filter(|l| l.here.is_some()).map(|l| (l.vm, l.index)).collect();
            inc(&self.metrics.route_pushes);
            let outcome = tokio::time::timeout(timeout, self.agents.apply(&record, table)).await;
            match outcome {
                Ok(Ok(mut answered)) => {
                    self.batchers.applied_generations.submit((host.clone(), generation)).await?;
                    *covered = reading;
                    if !record.managed_servers {
                        return Ok(Default::default());
                    }
                    // Only a cGPU this table asked the agent to route itself was.
                    for server in &mut answered {
                        server.routed_here &= sent_here.contains(&server.key());
                    }
                    return self.note_servers(host, &answered).await;
                }
                Ok(Err(AgentError::Stale { .. })) => {
                    // The agent holds a newer generation than ours (a newer push, or a database
                    // restored from an older backup): catch up past it and push again.
                    let applied = self
                        .agents
                        .applied_generation(&record)
                        .await
                        .map_err(|e| Error::unavailable("host agent", e))?
                        .unwrap_or(0);
                    self.db.raise_routes_generation(host, applied).await?;
                }
                Ok(Err(AgentError::Refused { reason, entry: Some(entry), .. })) => {
                    inc(&self.metrics.route_push_failures);
                    if let Some(target) = refused_target(&entry, &targets) {
                        self.taint_refused_target(host, target, &reason).await?;
                    }
                    return Err(Error::unavailable(
                        "host agent",
                        format!("host {host} refused its routes at {entry}: {reason}"),
                    ));
                }
                Ok(Err(e)) => {
                    inc(&self.metrics.route_push_failures);
                    return Err(Error::unavailable("host agent", e));
                }
                Err(_) => {
                    inc(&self.metrics.route_push_failures);
                    return Err(Error::unavailable(
                        "host agent",
                        format!("host {host} did not apply its routes within {timeout:?}"),
                    ));
                }
            }
        }
        inc(&self.metrics.route_push_failures);
        Err(Error::unavailable(
            "host agent",
            format!("host {host} keeps holding a newer route table"),
        ))
    }
}

impl App {
    /// Pushes each host's table in turn, after `what` changed them; a failed push is left to the
    /// reconciler (the host is behind, so its next pass pushes again).
    pub(crate) async fn push_or_leave(&self, hosts: impl IntoIterator<Item = HostId>, what: &str) {
        for host in hosts {
            if let Err(e) = self.push_routes(&host).await {
                tracing::warn!(%host, error = %crate::error::ErrorChain(&e), "route push after {what} failed; the reconciler retries");
            }
        }
    }
}

/// The refusal of a report that claims another host's rCUDA endpoint for `claimed`: the agent
/// learns which of its GPUs, not whose endpoint it is.
fn endpoint_claimed(claimed: &GpuRecord) -> Error {
    Error::Conflict(format!(
        "GPU {}: rCUDA endpoint {}:{} belongs to another host's GPU; an admin sees the conflict",
        claimed.id, claimed.rcuda_address, claimed.rcuda_port
    ))
}

/// The rCUDA endpoint of the route an agent named as at fault, if it named a route's target.
fn refused_target(entry: &str, targets: &[SocketAddrV4]) -> Option<SocketAddrV4> {
    let index = entry.strip_prefix("routes[")?.strip_suffix("].target")?;
    targets.get(index.parse::<usize>().ok()?).copied()
}

impl App {
    /// Taints the GPU served at `target`, which the agent of `host` refused to route to, if it is
    /// one of `host`'s own: an agent can take only its own GPUs out of service. A refusal that
    /// blames another host's GPU is recorded against the refusing host instead.
    async fn taint_refused_target(
        &self,
        host: &HostId,
        target: SocketAddrV4,
        reason: &str,
    ) -> Result<(), Error> {
        let gpu = { self.db.gpu_serving(host, target).await? };
        match gpu {
            Some(gpu) => {
                tracing::warn!(%gpu, %host, reason, "an agent refused routes to its GPU; tainting it");
                let taint = format!("the agent of host {host} refused routes to it: {reason}");
                self.set_gpu_taint(&gpu, Some(taint)).await?;
            }
            None => {
                let detail = format!(
                    "refused its routes, blaming rCUDA endpoint {target}, which is not one of \
                     its GPUs: {reason}"
                );
                self.alert_host(host, AlertKind::ForeignRefusal, detail).await;
            }
        }
        Ok(())
    }
}

/// A host's table as read under a new generation: the host, its routes, and the servers it runs
/// (when it runs its GPUs' servers).
pub(crate) type TableRead = (HostRecord, Vec<RoutedCgpu>, Vec<ServerSpec>);

/// A host's table read before its push, under a generation of its own, and the host's push ticket
/// when the read began (see [`App::push_routes_from`]).
#[derive(Debug)]
pub(crate) struct ReadAhead {
    ticket: u64,
    table: TableRead,
}

/// Starts new generations of the queued hosts' tables and reads their routes (the
/// [`super::batch::Batcher`] task's work). A batch that fails as a whole is retried host by host.
pub(crate) fn read_route_tables(
    app: Arc<App>,
    queued: Vec<Queued<HostId, TableRead>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut hosts: Vec<HostId> = queued.iter().map(|(host, _)| host.clone()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        match app.next_tables(&hosts, false).await {
            Ok(tables) => {
                for (host, reply) in queued {
                    let _ = reply.send(table_of(&tables, &host));
                }
            }
            Err(e) if hosts.len() == 1 => fail_all(queued, e),
            Err(e) => {
                tracing::debug!(error = %e, "batch of route table reads failed; one host at a time");
                for (host, reply) in queued {
                    let table = app
                        .next_tables(std::slice::from_ref(&host), false)
                        .await
                        .and_then(|tables| table_of(&tables, &host));
                    let _ = reply.send(table);
                }
            }
        }
    })
}

fn table_of(tables: &BTreeMap<HostId, TableRead>, host: &HostId) -> Result<TableRead, Error> {
    tables.get(host).cloned().ok_or_else(|| Error::NotFound { kind: "host", id: host.to_string() })
}

/// Records the generations agents confirmed, the highest per host, in one statement (the
/// [`super::batch::Batcher`] task's work).
pub(crate) fn write_applied_generations(
    app: Arc<App>,
    queued: Vec<Queued<(HostId, u64), ()>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut highest: BTreeMap<HostId, u64> = BTreeMap::new();
        for ((host, generation), _) in &queued {
            let entry = highest.entry(host.clone()).or_default();
            *entry = (*entry).max(*generation);
        }
        let applied: Vec<(HostId, u64)> = highest.into_iter().collect();
        let outcome = async { app.db.set_applied_generations(&applied).await }.await;
        match outcome {
            Ok(()) => {
                for (_, reply) in queued {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => fail_all(queued, e.into()),
        }
    })
}

impl App {
    /// [`Self::next_tables`] of `hosts`, each with its push ticket from before the read (see
    /// [`App::push_routes_from`]), reading every host's routes at once (see
    /// [`db::routed_cgpus_everywhere`]): for a pass that pushes most tables, where reading them 64
    /// hosts at a time costs several times as much. The same rule holds: on PostgreSQL the hosts'
    /// rows stay locked from their new generations to the read (a second or two at a million
    /// cGPUs, during which other pushes to these hosts wait).
    pub(crate) async fn read_tables_ahead(
        &self,
        hosts: &[HostId],
    ) -> Result<HashMap<HostId, ReadAhead>, Error> {
        use std::sync::atomic::Ordering;
        let tickets: HashMap<&HostId, u64> =
            hosts.iter().map(|h| (h, self.host_lock(h).ticket.load(Ordering::SeqCst))).collect();
        Ok(self
            .next_tables(hosts, true)
            .await?
            .into_iter()
            .filter_map(|(name, table)| {
                let ticket = *tickets.get(&name)?;
                Some((name, ReadAhead { ticket, table }))
            })
            .collect())
    }

    /// New generations of the hosts' tables with the routes read under them (see
    /// [`db::Db::next_route_tables`]).
    async fn next_tables(
        &self,
        hosts: &[HostId],
        every_host: bool,
    ) -> Result<BTreeMap<HostId, TableRead>, Error> {
        let (records, mut routed, mut served) =
            self.db.next_route_tables(hosts, every_host).await?;
        Ok(records
            .into_iter()
            .map(|record| {
                let routes = routed.remove(&record.name).unwrap_or_default();
                let servers = served.remove(&record.name).unwrap_or_default();
                (record.name.clone(), (record, routes, servers))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_with(rtt_us: &[(&str, u32)], recorded_ms: i64) -> HostRecord {
        HostRecord {
            name: "vm-1".parse().unwrap(),
            seq: 1,
            kind: HostKind::ComputeRgpu,
            state: HostState::Schedulable,
            drained: false,
            agent_url: None,
            last_seen_ms: 0,
            routes_generation: 0,
            applied_generation: 0,
            forgotten: false,
            managed_servers: false,
            gpu_address: None,
            topology: Default::default(),
            rtt_us: rtts(rtt_us),
            rtt_recorded_ms: recorded_ms,
            local_vms: None,
        }
    }

    fn rtts(pairs: &[(&str, u32)]) -> BTreeMap<HostId, u32> {
        pairs.iter().map(|(h, us)| (h.parse().unwrap(), *us)).collect()
    }

    #[test]
    fn round_trips_are_recorded_when_they_move_and_at_most_once_an_interval() {
        let every = 60_000;
        let never_recorded = host_with(&[], 0);
        let first = rtts(&[("g1", 180)]);
        // The first measurement at once; nothing reported, nothing recorded.
        assert!(rtts_to_record(&never_recorded, Some(&first), 1_000, every).is_some());
        assert!(rtts_to_record(&never_recorded, None, 1_000, every).is_none());
        let recorded = host_with(&[("g1", 180)], 1_000);
        let noise = rtts(&[("g1", 200)]);
        let moved = rtts(&[("g1", 60)]);
        let other_hosts = rtts(&[("g2", 180)]);
        // Noise never; a move or another set of hosts once the interval is past.
        for now in [1_500, 61_000] {
            assert!(rtts_to_record(&recorded, Some(&noise), now, every).is_none(), "{now}");
        }
        for changed in [&moved, &other_hosts, &BTreeMap::new()] {
            assert!(rtts_to_record(&recorded, Some(changed), 30_000, every).is_none());
            assert_eq!(rtts_to_record(&recorded, Some(changed), 61_000, every), Some(changed));
        }
    }
}
