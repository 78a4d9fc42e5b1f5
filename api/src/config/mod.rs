//! gsaasd's configuration: one TOML file, every field defaulted, so that no file at all gives the
//! embedded default (SQLite in `.gsaas/`, the simulated cloud, in-process host agents, the paper's
//! testbed as inventory).
//!
//! Unknown fields are errors (a typo must not silently fall back to a default), and every error
//! carries the file's path.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

use gpgpums::{HostId, HostKind, DEFAULT_POLICY};
use gsaas_infra::httpd::{HttpLimits, TlsFiles};
use rodvr_contract::protocol::Ipv4Cidr;
use serde::Deserialize;

mod inventory;
pub mod sources;

pub use crate::secret_url::{redact_url, SecretUrl};
pub use inventory::{InventoryEntry, InventoryGpu, InventoryHost, InventoryPartition};

use crate::cloud::nova::NovaConfig;
use crate::cloud::sim::{SimConfig, SimVmNetworkConfig};

/// The longest lifetime a token may be issued with: a year.
pub const MAX_TOKEN_TTL_SECS: u64 = 366 * 24 * 3600;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// The whole config, from `origin` (the file, variables and flags it came from), is invalid.
    #[error("invalid config (from {origin}): {reason}")]
    Invalid { origin: String, reason: String },
    /// A variable or a flag (`setting`, as written) does not fit the config.
    #[error("{setting}: {reason}")]
    Setting { setting: String, reason: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the REST API listens.
    pub listen: SocketAddr,
    /// Where the embedded database and the generated signing key live.
    pub data_dir: PathBuf,
    /// `sqlite://PATH` or `postgres://...`; default: `sqlite://<data_dir>/gsaas.sqlite`.
    pub database_url: Option<SecretUrl>,
    /// The policy for requests that name none.
    pub default_policy: String,
    pub auth: AuthConfig,
    pub masking: MaskingConfig,
    pub launch: LaunchConfig,
    pub cloud: CloudConfig,
    pub hosts: HostsConfig,
    /// Limits of the API's HTTP server (header and body timeouts, connections).
    pub http: HttpLimits,
    /// gsaasd's certificate and key: the API (and `metrics.listen`) are served over TLS.
    pub tls: Option<TlsFiles>,
    pub metrics: MetricsConfig,
    /// The quota limits of every project that has none of its own (`PUT /v1/quotas/{project}`).
    pub quotas: QuotaDefaults,
    /// How launches that wait for capacity are served.
    pub queue: QueueConfig,
    /// The remote-GPU layers: the one a request gets when it names none, and what a VM needs
    /// to load LUPINE's client.
    pub remoting: RemotingConfig,
    /// OpenStack-style notifications to RabbitMQ.
    pub notifications: NotificationsConfig,
    /// The GPU inventory used with in-process agents; empty means the paper's testbed.
    pub inventory: Vec<InventoryHost>,
}

/// Notifications of VMs' and cGPUs' lives (`gpu.vm.create.end` and the like), as oslo.messaging
/// publishes OpenStack's: written to an outbox with each change, published to RabbitMQ after.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsConfig {
    /// oslo.messaging's transport URL, `rabbit://user:password@host:5672/vhost` (or `amqp://`,
    /// `amqps://`); none: no notifications are written or published.
    pub transport_url: Option<SecretUrl>,
    /// The topic exchange (Nova's is `nova`; Ceilometer's `notification_control_exchanges` must
    /// list it).
    pub exchange: String,
    /// The topic: messages go with routing key `<topic>.info` (or `.error`) to the queue of that
    /// name, declared and bound by gsaasd.
    pub topic: String,
    /// A durable exchange and queues and persistent messages, which a broker restart keeps
    /// (listeners must declare them alike: oslo.messaging's `amqp_durable_queues = true`).
    pub durable: bool,
    /// The notifications' `publisher_id` (default `gsaas.<host name>`).
    pub publisher_id: Option<String>,
    /// How often the outbox is read when it was empty.
    pub poll_ms: u64,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig {
            transport_url: None,
            exchange: "gsaas".to_owned(),
            topic: "notifications".to_owned(),
            durable: true,
            publisher_id: None,
            poll_ms: 250,
        }
    }
}

impl NotificationsConfig {
    /// The broker's AMQP URI, if notifications are on.
    pub fn amqp_uri(&self) -> Result<Option<String>, String> {
        self.transport_url
            .as_ref()
            .map(|url| {
                crate::notifier::amqp_uri(url.expose())
                    .map_err(|e| format!("notifications.transport_url: {e}"))
            })
            .transpose()
    }

    fn problem(&self) -> Option<String> {
        let name =
            |s: &str| !s.is_empty() && s.len() <= 255 && s.chars().all(|c| c.is_ascii_graphic());
        if let Err(e) = self.amqp_uri() {
            return Some(e);
        }
        if !name(&self.exchange) || !name(&self.topic) {
            return Some("notifications.exchange and .topic: 1 to 255 printable characters".into());
        }
        if self.poll_ms == 0 || self.poll_ms > 60_000 {
            return Some("notifications.poll_ms: must be from 1 to 60000".into());
        }
        None
    }
}

/// The remote-GPU layers (`gpgpums::remoting`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemotingConfig {
    /// The layer of a launch that names none (`rcuda`, `lupine`).
    pub default: gpgpums::Remoting,
    /// Where a LUPINE VM's image keeps the client (`libcuda.so.1`, `libnvidia-ml.so.1`): its
    /// login shells put it first on `LD_LIBRARY_PATH` when it exists.
    pub lupine_library_dir: String,
}

impl Default for RemotingConfig {
    fn default() -> Self {
        RemotingConfig {
            default: gpgpums::Remoting::Rcuda,
            lupine_library_dir: "/opt/lupine/lib".to_owned(),
        }
    }
}

impl RemotingConfig {
    /// Why `lupine_library_dir` cannot be written into a VM's shell profile, if it cannot: an
    /// absolute path of letters, digits, `.`, `_`, `-` and `/` (nothing a shell would read).
    fn problem(&self) -> Option<String> {
        let dir = &self.lupine_library_dir;
        let fine = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
        let good = dir.starts_with('/') && dir.len() <= 255 && dir.chars().all(fine);
        (!good).then(|| {
            "remoting.lupine_library_dir: must be an absolute path of at most 255 letters, \
             digits, '.', '_', '-' and '/'"
                .to_owned()
        })
    }
}

/// Default limits per project; an absent limit is no limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaDefaults {
    pub cgpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub exclusive_gpus: Option<u64>,
    pub vms: Option<u64>,
    /// The highest priority a project's launches may ask for (0: none above the lowest, so no
    /// tenant jumps the queue or preempts others unless an admin lets its project).
    pub max_priority: u32,
    /// Limits per GPU model, by the model's exact name (`[quotas.models."H100 80GB"]`).
    pub models: BTreeMap<String, gpgpums::ModelLimits>,
}

impl QuotaDefaults {
    pub fn quota(&self) -> gpgpums::Quota {
        gpgpums::Quota {
            cgpus: self.cgpus,
            memory_mib: self.memory_mib,
            exclusive_gpus: self.exclusive_gpus,
            vms: self.vms,
            max_priority: Some(self.max_priority),
            models: self.models.clone(),
        }
    }
}

/// The queue of launches that wait for capacity (see `gpgpums::queue`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// A queued launch that waits longer ends in `error` (`queue_timeout`); 0: it waits forever.
    pub queue_timeout_secs: u64,
    /// Let launches that fit start ahead of one that does not.
    pub backfill: bool,
    /// How often other projects' launches may start ahead of the head of the queue before it
    /// stops them.
    pub max_passes: u32,
    /// How long the head of the queue stops other projects' launches at most (its project's
    /// barrier); then they start where they fit, and it holds again only after `max_passes`
    /// more of them started.
    pub max_hold_secs: u64,
    /// The highest priority a launch may ask for (the lowest is 0).
    pub max_priority: i32,
    /// Take cGPUs back from preemptible VMs of lower priority for a launch that does not fit.
    pub preemption: bool,
    /// The queue is served on every release and at least this often (timeouts, other replicas).
    pub serve_interval_secs: u64,
    /// How many requests (launches and attaches) one project may have waiting; more get 429.
    pub max_waiting_per_project: u64,
    /// How long the head of the queue waits for the cGPUs a preemption is taking back for it
    /// (their detach) before other requests may start ahead of it again.
    pub reclaim_wait_secs: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            queue_timeout_secs: 3600,
            backfill: true,
            max_passes: 16,
            max_hold_secs: 600,
            max_priority: 100,
            preemption: true,
            serve_interval_secs: 5,
            max_waiting_per_project: 1000,
            reclaim_wait_secs: 120,
        }
    }
}

impl QueueConfig {
    /// The planner's rules (`gpgpums::queue`) these settings give.
    pub fn rules(&self) -> gpgpums::queue::Rules {
        gpgpums::queue::Rules {
            backfill: self.backfill,
            max_passes: self.max_passes,
            max_hold_ms: i64::try_from(self.max_hold_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
            preemption: self.preemption,
        }
    }
}

/// The largest quota limit: storage keeps limits as signed 64-bit integers, and JSON parsers
/// read numbers up to 2^53 exactly.
pub const MAX_QUOTA_LIMIT: u64 = 1 << 53;
/// The highest `queue.max_priority` a service may set, and so the highest priority a launch may
/// ever ask for.
pub const MAX_QUEUE_PRIORITY: i32 = 1_000_000;

/// Why a quota's limits are out of range, naming the resource as `{prefix}{resource}`.
pub fn check_quota(quota: &gpgpums::Quota, prefix: &str) -> Result<(), (String, String)> {
    for resource in gpgpums::Resource::ALL {
        if let Some(limit) = quota.get(resource).filter(|l| *l > MAX_QUOTA_LIMIT) {
            return Err((
                format!("{prefix}{resource}"),
                format!("{limit} is above the maximum {MAX_QUOTA_LIMIT}"),
            ));
        }
    }
    let models = &quota.models;
    if models.len() > gpgpums::MAX_MODEL_LIMITS {
        let most = gpgpums::MAX_MODEL_LIMITS;
        let reason = format!("{} models are more than {most}", models.len());
        return Err((format!("{prefix}models"), reason));
    }
    for (model, limits) in models {
        if let Some(problem) = gpgpums::traits::model_name_problem(model) {
            return Err((format!("{prefix}models"), problem));
        }
        for resource in gpgpums::Resource::ALL {
            if let Some(limit) = limits.get(resource).filter(|l| *l > MAX_QUOTA_LIMIT) {
                return Err((
                    format!("{prefix}models.{model}.{resource}"),
                    format!("{limit} is above the maximum {MAX_QUOTA_LIMIT}"),
                ));
            }
        }
    }
    Ok(())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            data_dir: PathBuf::from(".gsaas"),
            database_url: None,
            default_policy: DEFAULT_POLICY.to_owned(),
            auth: AuthConfig::default(),
            masking: MaskingConfig::default(),
            launch: LaunchConfig::default(),
            cloud: CloudConfig::default(),
            hosts: HostsConfig::default(),
            http: HttpLimits::default(),
            tls: None,
            metrics: MetricsConfig::default(),
            quotas: QuotaDefaults::default(),
            queue: QueueConfig::default(),
            remoting: RemotingConfig::default(),
            notifications: NotificationsConfig::default(),
            inventory: Vec::new(),
        }
    }
}

/// `/metrics`: on the API's listener it needs an admin or `metrics` token; `listen` serves it
/// without one on an address of its own (a scrape network tenants cannot reach).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// A second listener for `/metrics` alone, without a token.
    pub listen: Option<SocketAddr>,
    /// The pool and VM gauges are computed at most this often, however many scrapers ask.
    pub gauge_refresh_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: None, gauge_refresh_ms: 5000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `jwt` (default) or `keystone`: also accept tenants' Keystone tokens.
    pub mode: AuthMode,
    /// Keystone roles that make a GSaaS admin, on a token scoped as `keystone_admin_scope` says.
    pub keystone_admin_roles: Vec<String>,
    /// Where an admin role counts: Keystone's system scope, and/or one named admin project. An
    /// admin role in any other project makes a member of that project, nothing more.
    pub keystone_admin_scope: KeystoneAdminScope,
    /// How long a token Keystone refused is refused again without asking Keystone.
    pub keystone_refusal_cache_secs: u64,
    /// Keystone validations (of tokens not cached either way) and sign-ins one client may cause
    /// per minute; beyond it, 429. A client is an IPv4 address or an IPv6 /64; clients behind one
    /// proxy share its address. Sign-outs never draw on it.
    pub keystone_validations_per_minute: u32,
    /// How many validated Keystone tokens to remember.
    pub keystone_cache_capacity: usize,
    /// How long a validated Keystone token is trusted before asking Keystone again (revocation).
    pub keystone_cache_secs: u64,
    /// Ed25519 private key (PKCS#8 PEM) that signs tenant, admin and agent tokens; generated at first
    /// start when missing. Default: `<data_dir>/signing-key.pem`.
    pub signing_key: Option<PathBuf>,
    /// A policy file in oslo.policy's YAML form: who may do what (`gsaasd policy dump` prints
    /// the rules and their defaults). None: the defaults.
    pub policy_file: Option<PathBuf>,
    /// How often the policy file is checked for changes (its rules apply once read; a file
    /// with a problem keeps the rules in force). 0: only on SIGHUP.
    pub policy_reload_secs: u64,
    /// Lifetime of tokens from `gsaasd token issue`.
    pub token_ttl_secs: u64,
    /// Lifetime of the tokens agents renew theirs with (they renew at half of it).
    pub agent_token_ttl_secs: u64,
    /// How often each replica reloads the revoked token ids: a revocation takes effect everywhere
    /// within this many seconds.
    pub revocation_refresh_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::Jwt,
            keystone_admin_roles: vec!["admin".into()],
            keystone_admin_scope: KeystoneAdminScope::default(),
            keystone_refusal_cache_secs: 30,
            keystone_validations_per_minute: 60,
            keystone_cache_capacity: 10_000,
            keystone_cache_secs: 300,
            signing_key: None,
            policy_file: None,
            policy_reload_secs: 5,
            token_ttl_secs: 24 * 3600,
            agent_token_ttl_secs: 24 * 3600,
            revocation_refresh_secs: 5,
        }
    }
}

/// Where a Keystone admin role makes a GSaaS admin (`[auth.keystone_admin_scope]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeystoneAdminScope {
    /// On a system-scoped token (`openstack --os-system-scope all token issue`).
    pub system: bool,
    /// In this project (its id, or its name in `project_domain`).
    pub project: Option<String>,
    /// The domain (id or name) of `project` when it is given by name.
    pub project_domain: String,
}

impl Default for KeystoneAdminScope {
    fn default() -> Self {
        KeystoneAdminScope { system: true, project: None, project_domain: "Default".into() }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaskingConfig {
    /// The masked range the agents own (in-process agents use it; real agents have their own).
    pub range: Ipv4Cidr,
    /// The address every VM uses for its cGPUs; it must be inside each agent's masked range.
    pub address: Ipv4Addr,
    /// cGPU `j` of a VM is at `address:base_port + j`.
    pub base_port: u16,
    /// Each VM reads its live rCUDA environment at `address:metadata_port` (served by its host's
    /// agent, when the agent has `metadata_listen`); none: VMs keep the values of their boot.
    pub metadata_port: Option<u16>,
}

impl MaskingConfig {
    /// The masked endpoint where VMs read their live rCUDA environment.
    pub fn metadata_endpoint(&self) -> Option<SocketAddrV4> {
        self.metadata_port.map(|port| SocketAddrV4::new(self.address, port))
    }
}

impl Default for MaskingConfig {
    fn default() -> Self {
        MaskingConfig {
            range: Ipv4Cidr::new(Ipv4Addr::new(100, 127, 0, 0), 16).expect("a valid prefix"),
            address: Ipv4Addr::new(100, 127, 0, 1),
            base_port: 8308,
            metadata_port: Some(80),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LaunchConfig {
    /// How long the cloud may take to make a server ACTIVE.
    pub active_timeout_secs: u64,
    /// How long the VM's network may take to come up once ACTIVE.
    pub deploy_timeout_secs: u64,
    /// How long a host agent may take to apply routes.
    pub agent_timeout_ms: u64,
    /// How long a gsaasd's claim on a running saga lasts unless renewed; after a crash, another
    /// gsaasd (or the restarted one) resumes the saga once the claim runs out.
    pub saga_lease_secs: u64,
    /// The image of a launch that names none (the dissertation's `gsaas -l -ncgpus=2` names
    /// none); none: such a launch is refused, naming `image`. On the simulated cloud, the first
    /// image it lists unless set.
    pub default_image: Option<String>,
    /// The flavor of a launch that names none (on the simulated cloud, the first it lists).
    pub default_flavor: Option<String>,
    /// How often a long-poll (`GET /v1/vms/{id}?wait=`) reads its VM again when no write of this
    /// gsaasd wakes it: at most how late it answers a VM settled by another replica's saga.
    pub long_poll_reread_ms: u64,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        LaunchConfig {
            active_timeout_secs: 600,
            deploy_timeout_secs: 600,
            agent_timeout_ms: 10_000,
            saga_lease_secs: 30,
            long_poll_reread_ms: 250,
            default_image: None,
            default_flavor: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "backend", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CloudConfig {
    /// The simulated Nova.
    Sim {
        #[serde(default)]
        sim: SimConfig,
    },
    /// OpenStack Nova; credentials from clouds.yaml / `OS_*` (the service user needs the admin role
    /// to read which host a server runs on).
    Nova {
        #[serde(default)]
        nova: NovaConfig,
    },
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig::Sim { sim: SimConfig::default() }
    }
}

impl CloudConfig {
    /// The simulated cloud's settings, when that is the backend.
    pub fn sim_mut(&mut self) -> Option<&mut SimConfig> {
        match self {
            CloudConfig::Sim { sim } => Some(sim),
            CloudConfig::Nova { .. } => None,
        }
    }
}

/// How gsaasd recognises its callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Only gsaasd's own JWTs (the embedded default).
    #[default]
    Jwt,
    /// Also tenants' Keystone tokens (`X-Auth-Token`), validated with Keystone; needs the Nova backend
    /// for the service credentials.
    Keystone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostsBackend {
    /// Agents inside gsaasd: tables rendered and kept in memory, no kernel touched; the inventory comes
    /// from this file.
    InProcess,
    /// Real `rodvr-agent`s, which register over HTTP with their inventory.
    Agent,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostsConfig {
    pub backend: HostsBackend,
    /// A host whose agent has not reported for this long takes no new cGPUs.
    pub heartbeat_timeout_secs: u64,
    /// The longest a fence holds its bookings when the host's agent never confirms the routes
    /// withdrawn (see `app::fences`); then they are released and admins get an alert.
    pub fence_timeout_secs: u64,
    /// How often the reconciler runs.
    pub reconcile_interval_secs: u64,
    /// The reconciler moves the cGPUs of GPUs that failed (unhealthy, or on a host that stopped
    /// heartbeating) to healthy GPUs; those that fit nowhere become `lost`.
    pub auto_rehome: bool,
    /// Where gsaasd reaches each host's agent, by host name. The URL an agent reports about itself
    /// is never used: gsaasd would otherwise send that host's tokens and route tables wherever an
    /// agent pointed it.
    pub agent_urls: BTreeMap<HostId, String>,
    /// For hosts not in `agent_urls`: a URL with `{host}` standing for the host's name, e.g.
    /// `https://{host}.gpu.example:7450` (with TLS, the agent must prove that name).
    pub agent_url_template: Option<String>,
    /// PEM bundle of the CAs agents' certificates must chain to (https agent URLs); the system's
    /// CAs when absent.
    pub agent_ca: Option<PathBuf>,
    /// The least time between two recordings of one host's round trips (each changes the pool,
    /// which every replica then reloads), so that no agent, however its measurements swing,
    /// changes the pool more often. Its first measurement is recorded at once.
    pub rtt_record_interval_secs: u64,
}

impl Default for HostsConfig {
    fn default() -> Self {
        HostsConfig {
            backend: HostsBackend::InProcess,
            heartbeat_timeout_secs: 30,
            fence_timeout_secs: 86_400,
            reconcile_interval_secs: 10,
            auto_rehome: false,
            agent_urls: BTreeMap::new(),
            agent_url_template: None,
            agent_ca: None,
            rtt_record_interval_secs: 60,
        }
    }
}

impl HostsConfig {
    /// Where gsaasd reaches `host`'s agent, if an operator said so.
    pub fn agent_url(&self, host: &HostId) -> Option<String> {
        self.agent_urls.get(host).cloned().or_else(|| {
            self.agent_url_template.as_ref().map(|t| t.replace("{host}", host.as_str()))
        })
    }

    fn check(&self) -> Result<(), String> {
        for (host, url) in &self.agent_urls {
            check_agent_url(url).map_err(|why| format!("hosts.agent_urls.{host}: {why}"))?;
        }
        if let Some(template) = &self.agent_url_template {
            if !template.contains("{host}") {
                return Err("hosts.agent_url_template: must contain {host}".into());
            }
            check_agent_url(&template.replace("{host}", "host"))
                .map_err(|why| format!("hosts.agent_url_template: {why}"))?;
        }
        if !(1..=MAX_TOKEN_TTL_SECS).contains(&self.fence_timeout_secs) {
            return Err("hosts.fence_timeout_secs: must be between 1 and a year".into());
        }
        Ok(())
    }
}

/// Why `url` cannot be an agent's base URL: http(s), a host, nothing else.
fn check_agent_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{url:?} must be an http:// or https:// URL"));
    }
    if parsed.host().is_none() {
        return Err(format!("{url:?} names no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!("{url:?} must not carry credentials"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("{url:?} must not have a query or fragment"));
    }
    Ok(())
}

impl Config {
    /// The config file alone (the defaults without one).
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        sources::resolve(path, std::iter::empty(), &[])
    }

    /// The config from every source: `flags` (flag, key, value), then the `GSAAS_*` variables
    /// among `vars`, then the file, then the defaults (see [`sources`]).
    pub fn resolve(
        path: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
        flags: &[(&str, &str, toml::Value)],
    ) -> Result<Config, ConfigError> {
        sources::resolve(path, vars, flags)
    }

    fn check(&self) -> Result<(), String> {
        let max_ttl = MAX_TOKEN_TTL_SECS;
        for (field, ttl) in [
            ("auth.token_ttl_secs", self.auth.token_ttl_secs),
            ("auth.agent_token_ttl_secs", self.auth.agent_token_ttl_secs),
        ] {
            if !(1..=max_ttl).contains(&ttl) {
                return Err(format!("{field}: must be between 1 and {max_ttl} (a year)"));
            }
        }
        self.http.check()?;
        check_quota(&self.quotas.quota(), "quotas.")
            .map_err(|(field, reason)| format!("{field}: {reason}"))?;
        if !(0..=MAX_QUEUE_PRIORITY).contains(&self.queue.max_priority) {
            return Err(format!("queue.max_priority: must be between 0 and {MAX_QUEUE_PRIORITY}"));
        }
        if i64::from(self.quotas.max_priority) > i64::from(self.queue.max_priority) {
            return Err("quotas.max_priority: must be at most queue.max_priority".into());
        }
        if self.queue.serve_interval_secs == 0
            || self.queue.max_passes == 0
            || self.queue.max_hold_secs == 0
        {
            return Err("queue.serve_interval_secs, queue.max_passes and queue.max_hold_secs: \
                        must be at least 1"
                .into());
        }
        if self.queue.max_hold_secs > MAX_TOKEN_TTL_SECS {
            return Err("queue.max_hold_secs: must be at most a year".into());
        }
        if self.queue.queue_timeout_secs > MAX_TOKEN_TTL_SECS {
            return Err("queue.queue_timeout_secs: must be at most a year".into());
        }
        if self.queue.reclaim_wait_secs > 86_400 {
            return Err("queue.reclaim_wait_secs: must be at most a day".into());
        }
        if self.auth.keystone_validations_per_minute == 0 {
            return Err("auth.keystone_validations_per_minute: must be at least 1".into());
        }
        if self.auth.revocation_refresh_secs == 0 {
            return Err("auth.revocation_refresh_secs: must be at least 1".into());
        }
        if let Some(problem) = self.remoting.problem() {
            return Err(problem);
        }
        if let Some(problem) = self.notifications.problem() {
            return Err(problem);
        }
        if gpgpums::PolicyRegistry::builtin().resolve(&self.default_policy).is_err() {
            return Err(format!("default_policy: unknown policy {:?}", self.default_policy));
        }
        let last_port = u32::from(self.masking.base_port) + gpgpums::MAX_CGPUS_PER_VM;
        if last_port > u32::from(u16::MAX) {
            return Err(format!(
                "masking.base_port: {} leaves no room for {} cGPUs",
                self.masking.base_port,
                gpgpums::MAX_CGPUS_PER_VM
            ));
        }
        if let Some(port) = self.masking.metadata_port {
            if port == 0
                || (u32::from(self.masking.base_port)..last_port).contains(&u32::from(port))
            {
                return Err(format!(
                    "masking.metadata_port: {port} must be a port outside the cGPUs' {}..{last_port}",
                    self.masking.base_port
                ));
            }
        }
        if !self.masking.range.contains(self.masking.address) {
            return Err(format!(
                "masking.address: {} is outside masking.range {}",
                self.masking.address, self.masking.range
            ));
        }
        match &self.cloud {
            CloudConfig::Sim { sim } => {
                if sim.fixed_ip_range.prefix_len() > 30 {
                    return Err(format!(
                        "cloud.sim.fixed_ip_range: {} leaves no address for VMs (at most /30)",
                        sim.fixed_ip_range
                    ));
                }
                if let SimVmNetworkConfig::Netns(netns) = &sim.vm_network {
                    netns.check().map_err(|reason| format!("cloud.sim.vm_network.{reason}"))?;
                }
                if self.auth.mode == AuthMode::Keystone {
                    return Err("auth.mode: keystone needs cloud.backend = \"nova\" (its service credentials)".into());
                }
            }
            CloudConfig::Nova { .. } => {}
        }
        self.hosts.check()?;
        if !(10..=60_000).contains(&self.launch.long_poll_reread_ms) {
            return Err("launch.long_poll_reread_ms: must be between 10 and 60000".into());
        }
        // An rCUDA server belongs to one host (see migration 0015).
        let mut gpu_networks: HashMap<Ipv4Addr, &HostId> = HashMap::new();
        for host in &self.inventory {
            if let Some(address) = host.gpu_network_address {
                if let Some(first) = gpu_networks.insert(address, &host.name) {
                    return Err(format!(
                        "inventory: hosts {first} and {} have the same gpu_network_address \
                         {address}: an rCUDA server belongs to one host",
                        host.name
                    ));
                }
            }
            if host.kind != HostKind::ComputeGpu && !host.gpus.is_empty() {
                return Err(format!(
                    "inventory: host {} is {}, only compute-gpu hosts have GPUs",
                    host.name, host.kind
                ));
            }
            host.check(self.masking.range)
                .map_err(|why| format!("inventory: host {}: {why}", host.name))?;
        }
        Ok(())
    }

    /// On the simulated cloud, a launch that names no image or flavor gets the first the cloud
    /// lists unless `[launch]` names one: the embedded default runs the dissertation's
    /// `gsaas -l -ncgpus=2 -poolmem=2048 -mode=shared` as typed. Nova has no such default.
    pub fn apply_cloud_defaults(&mut self) {
        let CloudConfig::Sim { sim } = &self.cloud else { return };
        let launch = &mut self.launch;
        if launch.default_image.is_none() {
            launch.default_image = sim.images.first().cloned();
        }
        if launch.default_flavor.is_none() {
            launch.default_flavor = sim.flavors.first().cloned();
        }
    }

    pub fn database_url(&self) -> String {
        self.database_url.as_ref().map(|url| url.expose().to_owned()).unwrap_or_else(|| {
            format!("sqlite://{}?mode=rwc", self.data_dir.join("gsaas.sqlite").display())
        })
    }

    pub fn signing_key_path(&self) -> PathBuf {
        self.auth.signing_key.clone().unwrap_or_else(|| self.data_dir.join("signing-key.pem"))
    }

    /// The configured inventory, or the dissertation's testbed: one compute-GPU host with 4 GPUs of
    /// 8 GiB (Quadro M4000), three compute-rGPU hosts, all on one switch (its topology, from
    /// which their round trips are derived: `network.max_rtt_us` works on the embedded default).
    pub fn inventory(&self) -> Vec<InventoryHost> {
        if !self.inventory.is_empty() {
            return self.inventory.clone();
        }
        let host = |name: &str, kind| InventoryHost {
            name: HostId::new(name).expect("valid name"),
            kind,
            gpus: vec![],
            gpu_network_address: None,
            remoting: Default::default(),
            server_base_port: None,
            topology: [("switch".to_owned(), "testbed".to_owned())].into(),
        };
        let mut gpu_host = host("compute-gpu", HostKind::ComputeGpu);
        gpu_host.gpus = vec![InventoryGpu {
            // The Quadro M4000 is a Maxwell GM204: compute capability 5.2.
            compute_capability: Some(gpgpums::MajorMinor::new(5, 2)),
            ..InventoryGpu::of("NVIDIA Quadro M4000", 8192, 4)
        }];
        gpu_host.gpu_network_address = Some(Ipv4Addr::new(10, 78, 0, 1));
        let mut hosts = vec![gpu_host];
        for i in 0..3 {
            hosts.push(host(&format!("compute{i}-rgpu"), HostKind::ComputeRgpu));
        }
        hosts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[cloud.sim.vm_network] kind = "netns"` (see `cloud::sim_netns`).
    #[test]
    fn the_sim_clouds_netns_network_is_selected_and_checked() {
        let dir = std::env::temp_dir().join(format!("gsaas-sim-netns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gsaasd.toml");
        let text = |ns: &str| {
            format!(
                "[cloud]\nbackend = \"sim\"\n[cloud.sim.vm_network]\nkind = \"netns\"\n\
                 namespaces = {{ compute0-rgpu = \"{ns}\" }}\n"
            )
        };
        std::fs::write(&path, text("ns-crg")).unwrap();
        let mut cloud = Config::load(Some(&path)).unwrap().cloud;
        let sim = cloud.sim_mut().unwrap().clone();
        let SimVmNetworkConfig::Netns(netns) = sim.vm_network else { panic!("not netns") };
        assert_eq!(netns.namespaces[&HostId::new("compute0-rgpu").unwrap()], "ns-crg");
        std::fs::write(&path, text("a b")).unwrap();
        let err = format!("{:?}", Config::load(Some(&path)).unwrap_err());
        assert!(err.contains("cloud.sim.vm_network.namespaces.compute0-rgpu"), "{err}");
        let mut cloud = Config::load(None).unwrap().cloud;
        let sim = cloud.sim_mut().unwrap().clone();
        assert_eq!(sim.vm_network, SimVmNetworkConfig::AddressPool, "the default is unchanged");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gsaasd.toml");
        let config = Config::load(Some(&path)).unwrap();
        assert_eq!(config.hosts.backend, HostsBackend::InProcess);
        assert_eq!(config.inventory().len(), 4);
    }

    #[test]
    fn no_file_is_the_embedded_default() {
        let config = Config::load(None).unwrap();
        assert!(config.database_url().starts_with("sqlite://"));
        let inventory = config.inventory();
        assert_eq!(inventory[0].gpus[0].count, 4);
        assert_eq!(inventory.iter().filter(|h| h.kind == HostKind::ComputeRgpu).count(), 3);
    }

    #[test]
    fn hosts_name_their_gpu_servers_layer_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("gsaas-config-layers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("layers.toml");
        let host = |extra: &str| {
            format!(
                "[[inventory]]\nname = \"g1\"\nkind = \"compute-gpu\"\n\
                 gpu_network_address = \"10.78.0.1\"\ngpus = [{{ model = \"A100\", \
                 memory_mib = 81920, count = 2 }}]\n{extra}"
            )
        };
        std::fs::write(&path, host("remoting = \"lupine\"\n")).unwrap();
        let gpus = Config::load(Some(&path)).unwrap().inventory[0].gpus();
        let servers: Vec<(u16, gpgpums::Remoting)> =
            gpus.iter().map(|g| (g.rcuda.port(), g.attributes.remoting)).collect();
        assert_eq!(
            servers,
            [(14833, gpgpums::Remoting::Lupine), (14834, gpgpums::Remoting::Lupine)]
        );
        let refused = |extra: &str| {
            std::fs::write(&path, host(extra)).unwrap();
            Config::load(Some(&path)).unwrap_err()
        };
        let err = refused("remoting = \"scuda\"\n");
        assert!(format!("{err:?}").contains("scuda"), "{err:?}");
        for (extra, says) in [
            ("server_base_port = 65535\n", "past port 65535"),
            ("server_base_port = 0\n", "must not be 0"),
        ] {
            let err = refused(extra).to_string();
            assert!(err.contains("server_base_port") && err.contains(says), "{extra}: {err}");
        }
        // The default layer, and where a LUPINE VM's image keeps the client: checked before a
        // shell in a VM reads it.
        std::fs::write(&path, "[remoting]\ndefault = \"lupine\"\n").unwrap();
        assert_eq!(Config::load(Some(&path)).unwrap().remoting.default, gpgpums::Remoting::Lupine);
        for bad in ["opt/lupine", "/opt/$(reboot)", "/opt/lupine lib", ""] {
            std::fs::write(&path, format!("[remoting]\nlupine_library_dir = \"{bad}\"\n")).unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("remoting.lupine_library_dir"), "{bad}: {err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_carry_the_path_and_name_the_problem() {
        let dir = std::env::temp_dir().join(format!("gsaas-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:0\"\nlisten_port = 3\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err();
        assert!(err.to_string().contains("bad.toml"), "{err}");
        assert!(format!("{:?}", err).contains("listen_port"), "{err:?}");
        std::fs::write(
            &path,
            "[cloud]\nbackend = \"sim\"\n[cloud.sim]\nfixed_ip_range = \"10.0.0.0/32\"\n",
        )
        .unwrap();
        let err = Config::load(Some(&path)).unwrap_err();
        assert!(err.to_string().contains("at most /30"), "{err}");
        std::fs::write(
            &path,
            "[[inventory]]\nname = \"g1\"\nkind = \"compute-gpu\"\ngpu_network_address = \"10.78.0.1\"\n\
             [[inventory]]\nname = \"g2\"\nkind = \"compute-gpu\"\ngpu_network_address = \"10.78.0.1\"\n",
        )
        .unwrap();
        let err = Config::load(Some(&path)).unwrap_err();
        assert!(err.to_string().contains("g1 and g2 have the same gpu_network_address"), "{err}");
        for bad in ["0", "9", "60001"] {
            std::fs::write(&path, format!("[launch]\nlong_poll_reread_ms = {bad}\n")).unwrap();
            let err = Config::load(Some(&path)).unwrap_err();
            assert!(err.to_string().contains("long_poll_reread_ms: must be between"), "{err}");
        }
        std::fs::write(&path, "default_policy = \"worst-fit\"\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err();
        assert!(
            err.to_string().contains("bad.toml") && err.to_string().contains("worst-fit"),
            "{err}"
        );
        // Partitions: numbered as agents number them (100 per GPU after the first 100), so adding
        // a whole GPU moves none; bad ones name the field.
        let partitioned = |partitions: &str| {
            format!(
                "[[inventory]]\nname = \"g1\"\nkind = \"compute-gpu\"\ngpus = [\
                 {{ model = \"A100\", memory_mib = 81920, count = 2, partitions = [{partitions}] }},\
                 {{ model = \"T4\", memory_mib = 16384 }}]\n"
            )
        };
        std::fs::write(&path, partitioned("{ profile = \"3g.40gb\", memory_mib = 40960 }"))
            .unwrap();
        let gpus = Config::load(Some(&path)).unwrap().inventory[0].gpus();
        let places: Vec<(u32, Option<(u32, String)>)> =
            gpus.iter().map(|g| (g.index, g.partition.clone())).collect();
        assert_eq!(
            places,
            [
                (0, None),
                (1, None),
                (2, None),
                (100, Some((0, "3g.40gb".to_owned()))),
                (200, Some((1, "3g.40gb".to_owned())))
            ]
        );
        assert_eq!(gpus[3].model, "A100 MIG 3g.40gb");
        assert_eq!(gpus[3].rcuda.port(), gpgpums::Remoting::Rcuda.default_port() + 100);
        let many = "[[inventory]]\nname = \"g1\"\nkind = \"compute-gpu\"\ngpus = [\
                    { model = \"T4\", memory_mib = 16384, count = 100 },\
                    { model = \"A100\", memory_mib = 81920, partitions = [\
                    { profile = \"7g.80gb\", memory_mib = 81920 }] }]\n";
        std::fs::write(&path, many).unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("at most 100 whole GPUs"), "{err}");
        for (partitions, why) in [
            ("{ profile = \"3g.40gb\", memory_mib = 40960, count = 3 }", "have 122880 MiB"),
            ("{ profile = \"3G\", memory_mib = 1024 }", "no partition profile"),
            ("{ profile = \"1g.10gb\", memory_mib = 1024, traits = [\"mig\"] }", "traits"),
            ("{ profile = \"1g.10gb\", memory_mib = 1024, count = 300 }", "more than 256 GPUs"),
            ("{ profile = \"1g.10gb\", memory_mib = 1, count = 4294967295 }", "more than 256 GPUs"),
        ] {
            std::fs::write(&path, partitioned(partitions)).unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("inventory: host g1"), "{partitions}: {err}");
        }
        std::fs::write(
            &path,
            "[[inventory]]\nname = \"g1\"\nkind = \"compute-gpu\"\ntopology = { rack = \"r 1\" }\n",
        )
        .unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("host g1: topology.rack: "), "{err}");
        let err = Config::load(Some(&dir.join("missing.toml"))).unwrap_err();
        assert!(err.to_string().contains("missing.toml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
