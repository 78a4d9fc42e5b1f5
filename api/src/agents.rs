//! The hosts' RODVR agents, behind one small trait.
//!
//! gsaasd pushes each host's complete route table with a generation; the agent persists it and
//! applies it. Two implementations: [`RemoteAgents`] talks to real `rodvr-agent`s over HTTP with
//! tokens signed by gsaasd, and [`InProcessAgents`] runs the same agent core inside gsaasd (the
//! embedded default): the same validation, generation rules and rendering, over the in-memory
//! firewall instead of the kernel. Their tables live in memory only: gsaasd's database is the
//! source of truth, and after a restart the reconciler finds them empty and pushes every table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gpgpums::HostId;
use rodvr_contract::auth::TokenSigner;
use rodvr_contract::client::AgentClient;
use rodvr_contract::protocol::{
    check_generation, HostKind as AgentHostKind, Ipv4Cidr, RouteTable, ServerStatus,
};
use rodvr_core::agent::{Agent, AgentError as CoreError, HostFacts};
use rodvr_core::firewall::{Dataplane, MemoryFirewall};
use rodvr_core::render::TableParams;
use rodvr_core::state::{GenerationConflict, Ledger};

use crate::config::HostsConfig;
use crate::model::HostRecord;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent could not be reached or failed to apply.
    #[error("agent of host {host} unavailable: {reason}")]
    Unavailable {
        host: HostId,
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The agent holds a newer generation than the one offered.
    #[error("agent of host {host} holds a newer table than generation {offered}")]
    Stale { host: HostId, offered: u64 },
    /// The agent refused the table, naming the entry at fault when it could.
    #[error("agent of host {host} refused the table: {reason}")]
    Refused { host: HostId, reason: String, entry: Option<String> },
    /// The agent answered something it cannot hold (a generation out of range).
    #[error("agent of host {host} misbehaves: {reason}")]
    Misbehaving { host: HostId, reason: String },
}

#[async_trait]
pub trait HostAgents: Send + Sync + std::fmt::Debug {
    /// Pushes `table`, the host's complete route table; Ok once the agent has applied it, with
    /// the state of each server the table lists (hosts that run their GPUs' servers).
    async fn apply(
        &self,
        host: &HostRecord,
        table: RouteTable,
    ) -> Result<Vec<ServerStatus>, AgentError>;

    /// The generation the host's agent has applied, if any (drift detection).
    async fn applied_generation(&self, host: &HostRecord) -> Result<Option<u64>, AgentError>;
}

/// Agents inside gsaasd, one per host, their tables in memory.
#[derive(Debug)]
pub struct InProcessAgents {
    masked_range: Ipv4Cidr,
    agents: Mutex<HashMap<HostId, Arc<Agent<MemoryFirewall>>>>,
}

impl InProcessAgents {
    pub fn new(masked_range: Ipv4Cidr) -> Self {
        InProcessAgents { masked_range, agents: Mutex::new(HashMap::new()) }
    }

    fn agent(&self, host: &HostRecord) -> Arc<Agent<MemoryFirewall>> {
        let mut agents = self.agents.lock().expect("agents lock");
        if let Some(agent) = agents.get(&host.name) {
            return agent.clone();
        }
        let ledger = Ledger::in_memory();
        let params = TableParams {
            masked_range: self.masked_range,
            gpu_interface: "gpu0".into(),
            local_rcuda: vec![],
            local_servers: None,
            metadata_listener: None,
            agent_api: None,
        };
        let facts = HostFacts {
            host: host.name.clone(),
            kind: match host.kind {
                gpgpums::HostKind::ComputeGpu => AgentHostKind::ComputeGpu,
                _ => AgentHostKind::ComputeRgpu,
            },
            agent_url: "in-process".into(),
            gpus: vec![],
            // The inventory registers the host, with its topology.
            topology: Default::default(),
            gpu_address: None,
            local_vms: None,
        };
        let agent =
            Arc::new(Agent::new(ledger, Dataplane::new(MemoryFirewall::new(), params), facts));
        agents.insert(host.name.clone(), agent.clone());
        agent
    }

    /// Where a packet from `source` arriving on `interface` for `masked` is sent on `host`, per the
    /// table its agent applied.
    pub fn resolve(
        &self,
        host: &HostRecord,
        source: std::net::Ipv4Addr,
        interface: &str,
        masked: std::net::SocketAddrV4,
    ) -> Option<std::net::SocketAddrV4> {
        self.agent(host).with_firewall(|fw| fw.resolve(source, interface, masked))
    }

    /// Simulates the host's agent restarting without its table (a wiped disk): it comes back
    /// holding none.
    pub fn forget(&self, host: &HostId) {
        self.agents.lock().expect("agents lock").remove(host);
    }
}

#[async_trait]
impl HostAgents for InProcessAgents {
    async fn apply(
        &self,
        host: &HostRecord,
        table: RouteTable,
    ) -> Result<Vec<ServerStatus>, AgentError> {
        let offered = table.generation;
        let agent = self.agent(host);
        // Its ledger and firewall are in memory: applying is a short computation, done in place.
        match agent.put_table(table) {
            Ok(status) => {
                // In memory, the cuts that follow a real agent's answer take no time.
                if let Err(e) = agent.tidy_connections() {
                    tracing::warn!(host = %host.name, error = %e, "cutting re-targeted connections failed; retried with the next table");
                }
                Ok(status.servers)
            }
            Err(CoreError::Conflict(GenerationConflict::Older { .. })) => {
                Err(AgentError::Stale { host: host.name.clone(), offered })
            }
            Err(e @ (CoreError::Persist(_) | CoreError::Apply(_))) => {
                Err(AgentError::Unavailable {
                    host: host.name.clone(),
                    reason: e.to_string(),
                    source: Some(Box::new(e)),
                })
            }
            Err(e) => {
                let entry = match &e {
                    CoreError::Invalid(invalid) => Some(invalid.entry.clone()),
                    _ => None,
                };
                let reason = crate::error::ErrorChain(&e).to_string();
                Err(AgentError::Refused { host: host.name.clone(), reason, entry })
            }
        }
    }

    async fn applied_generation(&self, host: &HostRecord) -> Result<Option<u64>, AgentError> {
        Ok(self.agent(host).state().applied_generation)
    }
}

/// Real agents over HTTP, at the URLs gsaasd's config gives (never where an agent says it is).
#[derive(Debug)]
pub struct RemoteAgents {
    signer: TokenSigner,
    hosts: HostsConfig,
    /// One client for every agent: built once, its connections kept alive between pushes.
    http: reqwest::Client,
}

impl RemoteAgents {
    /// `http` trusts the agents' CA (`hosts.agent_ca`).
    pub fn new(signer: TokenSigner, hosts: HostsConfig, http: reqwest::Client) -> Self {
        RemoteAgents { signer, hosts, http }
    }

    fn client(&self, host: &HostRecord) -> Result<AgentClient, AgentError> {
        let url = self.hosts.agent_url(&host.name).ok_or_else(|| AgentError::Unavailable {
            host: host.name.clone(),
            reason: "gsaasd's config gives no URL for its agent".into(),
            source: None,
        })?;
        let (http, signer) = (self.http.clone(), self.signer.clone());
        Ok(AgentClient::with_http(http, url, host.name.clone(), signer))
    }

    fn map(host: &HostRecord, offered: u64, e: rodvr_contract::client::ClientError) -> AgentError {
        match e.status() {
            Some(409) => AgentError::Stale { host: host.name.clone(), offered },
            Some(status) if (400..500).contains(&status) => AgentError::Refused {
                host: host.name.clone(),
                entry: e.entry().map(str::to_owned),
                reason: e.to_string(),
            },
            _ => AgentError::Unavailable {
                host: host.name.clone(),
                reason: "request failed".into(),
                source: Some(Box::new(e)),
            },
        }
    }
}

#[async_trait]
impl HostAgents for RemoteAgents {
    async fn apply(
        &self,
        host: &HostRecord,
        table: RouteTable,
    ) -> Result<Vec<ServerStatus>, AgentError> {
        let offered = table.generation;
        self.client(host)?
            .put_routes(&table)
            .await
            .map(|status| status.servers)
            .map_err(|e| Self::map(host, offered, e))
    }

    async fn applied_generation(&self, host: &HostRecord) -> Result<Option<u64>, AgentError> {
        let state = self.client(host)?.routes().await.map_err(|e| Self::map(host, 0, e))?;
        if let Some(generation) = state.applied_generation {
            check_generation(generation).map_err(|reason| AgentError::Misbehaving {
                host: host.name.clone(),
                reason: format!("it reports having applied {reason}"),
            })?;
        }
        Ok(state.applied_generation)
    }
}
