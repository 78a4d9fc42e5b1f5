//! The agent's TOML config file.
//!
//! Everything host-specific that the controller must not decide lives here: the masked range, the
//! GPU-network interface, where the state file and the controller's public key are, and (for hosts
//! without an NVIDIA driver) the GPU inventory. Errors always name the file.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpgpums::ids::HostId;
use serde::Deserialize;

use gsaas_infra::httpd::{HttpLimits, TlsFiles};
use rodvr_contract::protocol::Ipv4Cidr;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is invalid")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("config file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// `[local_vms]`: see [`Config::local_vms`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalVmsConfig {
    /// vCPUs.
    pub cpus: u64,
    pub memory_mib: u64,
}

impl LocalVmsConfig {
    pub fn resources(&self) -> gpgpums::Resources {
        gpgpums::Resources::new(self.cpus.saturating_mul(1000), self.memory_mib)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This host's name as the cloud knows it.
    pub host: HostId,
    /// Address the agent's API listens on (port 0: any free port, printed at start).
    pub listen: SocketAddr,
    /// URL the controller uses to reach this agent; defaults to `http://{listen}`.
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// Where the accepted route table is persisted.
    pub state_file: PathBuf,
    /// PEM file with the controller's Ed25519 public key.
    pub controller_public_key: PathBuf,
    /// Addresses handed to VMs as masked endpoints.
    pub masked_range: Ipv4Cidr,
    /// The host's interface on the GPU network.
    pub gpu_interface: String,
    /// The `nft` program and leading arguments (default `["nft"]`).
    #[serde(default = "default_nft_command")]
    pub nft_command: Vec<String>,
    /// A `conntrack` program to cut the connections of re-targeted routes with (wrap it like
    /// `nft_command` when the agent runs outside the host's network namespace); empty (the
    /// default): the agent cuts them itself, over netlink, in its own namespace.
    #[serde(default)]
    pub conntrack_command: Vec<String>,
    /// Seconds between re-applications of a table that failed to apply.
    #[serde(default = "default_retry_secs")]
    pub retry_interval_secs: u64,
    #[serde(default)]
    pub controller: Option<ControllerConfig>,
    /// This host's GPU servers (`[gpu_servers]`; `[rcuda]`, its older name, is still read).
    #[serde(default, alias = "gpu_servers")]
    pub rcuda: Option<RcudaConfig>,
    /// GPUs of this host when NVML is not available.
    #[serde(default)]
    pub gpus: Vec<GpuConfig>,
    /// Where this host sits in the network, reported to gsaasd: its group at each of the
    /// operator's levels (`zone = "z1"`, `rack = "r12"`).
    #[serde(default)]
    pub topology: gpgpums::Topology,
    /// The CPU and memory this GPU host offers the `local` VMs gsaasd pins to it (what Nova may
    /// give them beside the host's own and other VMs'), reported to gsaasd, which puts none
    /// past them. Absent: only the host's GPUs bind.
    #[serde(default)]
    pub local_vms: Option<LocalVmsConfig>,
    /// Limits of the agent's HTTP server.
    #[serde(default)]
    pub http: HttpLimits,
    /// The agent's certificate and key: its API is served over TLS (https://).
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// Where the agent serves each VM its live rCUDA environment (`GET /rcuda.env`,
    /// `/rcuda.json`): a host address VMs reach only through their route from the masked
    /// metadata endpoint gsaasd names. None: no live environment (VMs keep their boot values).
    #[serde(default)]
    pub metadata_listen: Option<std::net::SocketAddrV4>,
    /// Connections one VM may hold on the metadata listener at once.
    #[serde(default = "default_metadata_connections_per_vm")]
    pub metadata_max_connections_per_vm: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    pub url: String,
    /// Bearer token the agent presents to the controller (or `token_file`).
    #[serde(default)]
    pub token: String,
    /// A file holding the token (a mounted Secret): read at start, so the token stays out of
    /// the config.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default = "default_heartbeat_secs")]
    pub heartbeat_interval_secs: u64,
    /// How often the agent measures its round trips to the GPU hosts gsaasd names (one TCP
    /// connect to each one's rCUDA endpoint); 0: never.
    #[serde(default = "default_rtt_secs")]
    pub rtt_interval_secs: u64,
    /// How long one connect may take before it counts as no answer.
    #[serde(default = "default_rtt_timeout_ms")]
    pub rtt_timeout_ms: u64,
    /// How often it asks gsaasd again which GPU hosts to measure.
    #[serde(default = "default_rtt_targets_secs")]
    pub rtt_targets_refresh_secs: u64,
    /// PEM bundle of the CAs the controller's certificate must chain to (an https `url`); the
    /// system's CAs when absent.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

impl ControllerConfig {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs(self.heartbeat_interval_secs)
    }

    /// How often round trips are measured, and how long one connect may take; `None`: never.
    pub fn rtt_schedule(&self) -> Option<(Duration, Duration, Duration)> {
        (self.rtt_interval_secs > 0).then(|| {
            (
                Duration::from_secs(self.rtt_interval_secs),
                Duration::from_millis(self.rtt_timeout_ms),
                Duration::from_secs(self.rtt_targets_refresh_secs),
            )
        })
    }
}

/// Where this host's GPU servers listen, and which remote-GPU layer they speak: one server per
/// GPU, on `base_port + index`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RcudaConfig {
    /// This host's address on the GPU network.
    pub address: Ipv4Addr,
    /// `rcuda` (the default) or `lupine`: every GPU server of this host speaks it.
    #[serde(default)]
    pub remoting: gpgpums::Remoting,
    /// The first GPU's server port; the layer's own port when left out (rCUDA 8308, LUPINE
    /// 14833).
    #[serde(default)]
    pub base_port: Option<u16>,
    /// The agent runs the servers itself, one per cGPU, each held to its share (the
    /// `servers` module). Off: one server per GPU, started by the operator.
    #[serde(default)]
    pub managed: bool,
    /// The server's command (managed): it takes its port from `GSAAS_SERVER_PORT` (and the
    /// layer's own variable: `LUPINE_PORT`, `RCUDA_PORT`) and its GPU from
    /// `CUDA_VISIBLE_DEVICES`, and listens on every address or on `address`.
    #[serde(default)]
    pub command: Vec<String>,
    /// The ports the servers listen on (managed), `"FIRST-LAST"`: one per cGPU, chosen by the
    /// agent and reported to gsaasd, which routes to it.
    #[serde(default)]
    pub ports: Option<PortRange>,
    /// The unprivileged user the servers run as (managed).
    #[serde(default)]
    pub user: Option<String>,
    /// The memory interposer (`libgsaas-share.so`, built from `gpu-share/`) preloaded into every
    /// server (managed). Without it a shared cGPU's memory is not held to its share.
    #[serde(default)]
    pub interposer: Option<PathBuf>,
    /// More environment for the servers (`LD_LIBRARY_PATH` of the layer's libraries, ...); the
    /// agent's own environment is not passed on.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Where the agent keeps its servers' records, share states and logs (a 0700 directory).
    #[serde(default = "default_servers_run_dir")]
    pub run_dir: PathBuf,
    /// The cgroup (v2) under which each server gets one of its own; by default `gsaas-servers`
    /// at the root of the unified hierarchy.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// Processes one server may hold (`pids.max`).
    #[serde(default = "default_server_pids_max")]
    pub pids_max: u32,
    /// Host memory one server may hold, MiB (`memory.max`; its page-locked memory too).
    #[serde(default = "default_server_memory_mib")]
    pub memory_max_mib: u64,
    /// Its CPU weight against the other servers (`cpu.weight`, 1-10000).
    #[serde(default = "default_server_cpu_weight")]
    pub cpu_weight: u32,
    /// How long a table's answer waits for its new servers to accept, ms.
    #[serde(default = "default_server_ready_ms")]
    pub ready_timeout_ms: u64,
    /// How long a server may take to accept before it is started again, s.
    #[serde(default = "default_server_start_secs")]
    pub start_timeout_secs: u64,
    /// How far past its share a shared cGPU's server may go in GPU memory as the driver counts
    /// it (NVML: the driver's own per-context memory included) before the agent ends it, MiB.
    #[serde(default = "default_server_memory_slack_mib")]
    pub memory_slack_mib: u64,
    /// The host runs NVIDIA MPS (managed): a shared cGPU may then ask for a compute share, which
    /// the agent sets as its server's active-thread percentage (and its memory share as MPS's
    /// pinned device-memory limit too). The operator runs the MPS control daemon; every server
    /// is its client, one fault domain per GPU (docs/operator/gpu-servers.md).
    #[serde(default)]
    pub mps: bool,
    /// The MPS control daemon's pipe directory (`CUDA_MPS_PIPE_DIRECTORY`), which the servers'
    /// user must be able to reach.
    #[serde(default = "default_mps_pipe_directory")]
    pub mps_pipe_directory: PathBuf,
    /// Warm spare servers to keep per GPU (managed, not under MPS; 0, the default: none, at
    /// most 8): a new cGPU takes a spare of its GPU, its share set at the handover, so an attach
    /// does not wait for a server to start; a new spare starts behind it. Each spare is a
    /// process (and whatever the server holds before its first client) that serves nobody.
    #[serde(default)]
    pub spare_servers: u32,
}

impl RcudaConfig {
    /// Servers at `address` that the operator starts, one per GPU, on the layer's ports.
    pub fn unmanaged(address: Ipv4Addr) -> Self {
        Self {
            address,
            remoting: Default::default(),
            base_port: None,
            managed: false,
            command: Vec::new(),
            ports: None,
            user: None,
            interposer: None,
            env: Default::default(),
            run_dir: default_servers_run_dir(),
            cgroup: None,
            pids_max: default_server_pids_max(),
            memory_max_mib: default_server_memory_mib(),
            cpu_weight: default_server_cpu_weight(),
            ready_timeout_ms: default_server_ready_ms(),
            start_timeout_secs: default_server_start_secs(),
            memory_slack_mib: default_server_memory_slack_mib(),
            mps: false,
            mps_pipe_directory: default_mps_pipe_directory(),
            spare_servers: 0,
        }
    }

    pub fn base_port(&self) -> u16 {
        self.base_port.unwrap_or(self.remoting.default_port())
    }

    /// Why the managed servers' settings cannot work; `None` when they can (or are off).
    fn managed_problem(&self) -> Option<String> {
        if !self.managed {
            return self
                .mps
                .then(|| "gpu_servers.mps needs managed = true: only the agent's own servers can be given a compute share".to_owned());
        }
        let problem = if self.command.is_empty() {
            "gpu_servers.command must name the server's program (managed = true)".to_owned()
        } else if self.ports.is_none() {
            "gpu_servers.ports must give the servers' ports, \"FIRST-LAST\" (managed = true)"
                .to_owned()
        } else if self.user.as_deref().is_none_or(|u| u.is_empty() || u == "root") {
            "gpu_servers.user must name an unprivileged user, not root (managed = true)".to_owned()
        } else if self.pids_max == 0 {
            "gpu_servers.pids_max must be at least 1".to_owned()
        } else if self.memory_max_mib == 0 {
            "gpu_servers.memory_max_mib must be at least 1".to_owned()
        } else if !(1..=10_000).contains(&self.cpu_weight) {
            "gpu_servers.cpu_weight must be 1 to 10000".to_owned()
        } else if !(1..=600_000).contains(&self.ready_timeout_ms) {
            "gpu_servers.ready_timeout_ms must be 1 to 600000".to_owned()
        } else if !(1..=3600).contains(&self.start_timeout_secs) {
            "gpu_servers.start_timeout_secs must be 1 to 3600".to_owned()
        } else if self.mps && !self.mps_pipe_directory.is_absolute() {
            "gpu_servers.mps_pipe_directory must be an absolute path".to_owned()
        } else if self.spare_servers > 8 {
            "gpu_servers.spare_servers must be 0 to 8 per GPU".to_owned()
        } else if self.mps && self.spare_servers > 0 {
            "gpu_servers.spare_servers needs mps off: an MPS client's share is set when it starts"
                .to_owned()
        } else if let Some(name) = self.env.keys().find(|k| {
            k.is_empty()
                || k.contains('=')
                || k.contains('\0')
                || k.starts_with("GSAAS_")
                || *k == "CUDA_VISIBLE_DEVICES"
                || *k == "LD_PRELOAD"
                || k.starts_with("CUDA_MPS_")
        }) {
            format!("gpu_servers.env: {name:?} is set by the agent or is not a variable name")
        } else {
            return None;
        };
        Some(problem)
    }
}

/// A range of TCP ports, `"FIRST-LAST"` (both included, no port 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn ports(self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.last
    }

    pub fn contains(self, port: u16) -> bool {
        self.ports().contains(&port)
    }
}

impl std::str::FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a port range like \"20000-20999\" (1-65535)");
        let (first, last) = s.split_once('-').ok_or_else(bad)?;
        let first: u16 = first.trim().parse().map_err(|_| bad())?;
        let last: u16 = last.trim().parse().map_err(|_| bad())?;
        if first == 0 || last < first {
            return Err(bad());
        }
        Ok(Self { first, last })
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    /// Defaults to `{host}:gpu{index}`.
    #[serde(default)]
    pub id: Option<String>,
    /// Its server's port; defaults to `gpu_servers.base_port + index`.
    #[serde(default, alias = "server_port")]
    pub rcuda_port: Option<u16>,
    /// Set by an operator to take the GPU out of service (why: reported to gsaasd, which places
    /// no new cGPUs on it); hosts with NVML report health from the driver instead.
    #[serde(default)]
    pub unhealthy: Option<String>,
    /// Compute capability (`"8.0"`), as far as the operator states it (NVML reads it where a
    /// driver is loaded, as it reads the next two).
    #[serde(default)]
    pub compute_capability: Option<gpgpums::MajorMinor>,
    /// The CUDA version its driver supports (`"12.4"`).
    #[serde(default)]
    pub cuda_version: Option<gpgpums::MajorMinor>,
    #[serde(default)]
    pub uuid: Option<String>,
    /// os-traits names or the operator's own (`CUSTOM_...`).
    #[serde(default)]
    pub traits: std::collections::BTreeSet<String>,
    /// A partition (a MIG instance): the index of the GPU it is carved from. With `profile`.
    #[serde(default)]
    pub parent: Option<u32>,
    /// A partition's profile, as NVIDIA names it (`1g.10gb`). With `parent`.
    #[serde(default)]
    pub profile: Option<String>,
}

impl GpuConfig {
    /// What the operator states of it; the rest is its host's, set with its servers' endpoints
    /// (`discovery::inventory`).
    pub fn attributes(&self) -> gpgpums::GpuAttributes {
        let (capability, cuda, uuid) = (self.compute_capability, self.cuda_version, &self.uuid);
        gpgpums::GpuAttributes::stated(capability, cuda, uuid.clone(), self.traits.clone())
    }
}

fn default_nft_command() -> Vec<String> {
    vec!["nft".into()]
}
fn default_retry_secs() -> u64 {
    10
}
fn default_heartbeat_secs() -> u64 {
    10
}
fn default_rtt_secs() -> u64 {
    20
}
fn default_rtt_timeout_ms() -> u64 {
    1000
}
fn default_rtt_targets_secs() -> u64 {
    300
}
fn default_metadata_connections_per_vm() -> usize {
    8
}
fn default_servers_run_dir() -> PathBuf {
    PathBuf::from("/run/rodvr-agent/servers")
}
fn default_server_pids_max() -> u32 {
    256
}
fn default_server_memory_mib() -> u64 {
    16384
}
fn default_server_cpu_weight() -> u32 {
    100
}
fn default_server_ready_ms() -> u64 {
    10_000
}
fn default_server_start_secs() -> u64 {
    120
}
fn default_mps_pipe_directory() -> PathBuf {
    PathBuf::from("/tmp/nvidia-mps")
}

fn default_server_memory_slack_mib() -> u64 {
    512
}

impl Config {
    /// Reads and checks the config at `path`, and the controller token file it names.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut config = Self::parse(&text, path)?;
        if let Some(controller) = &mut config.controller {
            if let Some(file) = &controller.token_file {
                let token = std::fs::read_to_string(file)
                    .map_err(|source| ConfigError::Read { path: file.clone(), source })?;
                controller.token = token.trim().to_owned();
                if controller.token.is_empty() {
                    return Err(ConfigError::Invalid {
                        path: file.clone(),
                        reason: "the controller token file is empty".into(),
                    });
                }
            }
        }
        Ok(config)
    }

    /// Parses `text`; `path` is only used to name the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        let invalid = |reason: String| ConfigError::Invalid { path: path.to_owned(), reason };
        if config.nft_command.is_empty() {
            return Err(invalid("nft_command must name a program".into()));
        }
        if config.conntrack_command.first().is_some_and(String::is_empty) {
            return Err(invalid("conntrack_command must name a program, or be left out".into()));
        }
        if config.gpu_interface.is_empty() || config.gpu_interface.len() > 15 {
            return Err(invalid("gpu_interface must be 1 to 15 bytes long".into()));
        }
        if config.retry_interval_secs == 0 {
            return Err(invalid("retry_interval_secs must be at least 1".into()));
        }
        if let Some(c) = &config.controller {
            if c.heartbeat_interval_secs == 0 {
                return Err(invalid(
                    "controller.heartbeat_interval_secs must be at least 1".into(),
                ));
            }
            if !(1..=10_000).contains(&c.rtt_timeout_ms) {
                return Err(invalid("controller.rtt_timeout_ms must be 1 to 10000".into()));
            }
            if c.rtt_interval_secs > 0 && c.rtt_timeout_ms > c.rtt_interval_secs * 1000 {
                return Err(invalid(
                    "controller.rtt_timeout_ms must not be longer than rtt_interval_secs".into(),
                ));
            }
            if c.rtt_targets_refresh_secs == 0 {
                return Err(invalid(
                    "controller.rtt_targets_refresh_secs must be at least 1".into(),
                ));
            }
            match (c.token.is_empty(), &c.token_file) {
                (true, None) => {
                    return Err(invalid("controller.token or token_file is required".into()))
                }
                (false, Some(_)) => {
                    return Err(invalid("set controller.token or token_file, not both".into()))
                }
                _ => {}
            }
        }
        config.http.check().map_err(invalid)?;
        if config.listen.ip().is_unspecified() {
            return Err(invalid(format!(
                "listen {} must be the host's management address, not every address: VMs \
                 would reach the agent through their gateway",
                config.listen
            )));
        }
        if !(1..=config.http.max_connections).contains(&config.metadata_max_connections_per_vm) {
            return Err(invalid(
                "metadata_max_connections_per_vm must be between 1 and http.max_connections".into(),
            ));
        }
        if let Some(listen) = config.metadata_listen {
            let ip = *listen.ip();
            if listen.port() == 0
                || ip.is_unspecified()
                || ip.is_broadcast()
                || ip.is_multicast()
                || config.masked_range.contains(ip)
            {
                return Err(invalid(format!(
                    "metadata_listen {listen} must be one unicast host address, outside the \
                     masked range, with a port"
                )));
            }
        }
        if let Some((level, why)) = gpgpums::topology_problem(&config.topology) {
            let at = level.map_or("topology".to_owned(), |level| format!("topology.{level}"));
            return Err(invalid(format!("{at}: {why}")));
        }
        if let Some(offers) = config.local_vms {
            if let Some((field, why)) = offers.resources().problem() {
                let field = if field == "cpu_milli" { "cpus" } else { field };
                return Err(invalid(format!("local_vms.{field}: {why}")));
            }
        }
        for gpu in &config.gpus {
            if gpu.parent.is_some() != gpu.profile.is_some() {
                return Err(invalid(format!(
                    "gpus: GPU {}: a partition has both parent and profile, a whole GPU neither",
                    gpu.index
                )));
            }
        }
        if let Some(problem) = config.rcuda.as_ref().and_then(RcudaConfig::managed_problem) {
            return Err(invalid(problem));
        }
        if !config.gpus.is_empty() && config.rcuda.is_none() {
            return Err(invalid(
                "gpus are listed but [gpu_servers] (their servers' address) is not".into(),
            ));
        }
        Ok(config)
    }

    pub fn agent_url(&self, bound: SocketAddr) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.advertise_url.clone().unwrap_or_else(|| format!("{scheme}://{bound}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agent.toml");
        let config = Config::load(&path).unwrap();
        assert_eq!(config.host.as_str(), "compute-gpu0");
        assert_eq!(config.masked_range.to_string(), "100.127.0.0/16");
        assert_eq!(config.gpus.len(), 2);
        assert_eq!(config.controller.unwrap().heartbeat_interval(), Duration::from_secs(10));
    }

    #[test]
    fn the_controller_token_comes_from_the_config_or_a_file() {
        let dir = std::env::temp_dir().join(format!("rodvr-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = "host = 'h'\nlisten = '127.0.0.1:0'\nstate_file = '/s'\n\
                    controller_public_key = '/k'\nmasked_range = '100.127.0.0/16'\n\
                    gpu_interface = 'gpu0'\n[controller]\nurl = 'http://c'\n";
        let load = |extra: &str| {
            let path = dir.join("agent.toml");
            std::fs::write(&path, format!("{base}{extra}")).unwrap();
            Config::load(&path)
        };
        let token = dir.join("token");
        std::fs::write(&token, "tok-from-file\n").unwrap();
        let file = format!("token_file = '{}'\n", token.display());
        assert_eq!(load(&file).unwrap().controller.unwrap().token, "tok-from-file");
        assert_eq!(load("token = 'inline'\n").unwrap().controller.unwrap().token, "inline");
        let err = load("").unwrap_err().to_string();
        assert!(err.contains("token or token_file"), "{err}");
        let err = load(&format!("token = 'x'\n{file}")).unwrap_err().to_string();
        assert!(err.contains("not both"), "{err}");
        let err = load("token_file = '/nonexistent/token'\n").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/token"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_agent_listens_on_one_address_only() {
        let config = |listen: &str| {
            format!(
                "host = 'h'\nlisten = '{listen}'\nstate_file = '/s'\ncontroller_public_key = '/k'\n\
                 masked_range = '100.127.0.0/16'\ngpu_interface = 'gpu0'\n"
            )
        };
        let path = Path::new("agent.toml");
        for every in ["0.0.0.0:7450", "[::]:7450"] {
            let err = Config::parse(&config(every), path).unwrap_err().to_string();
            assert!(err.contains("management address"), "{every}: {err}");
        }
        assert!(Config::parse(&config("10.0.0.11:7450"), path).is_ok());
    }

    /// The least an agent's config holds.
    const MINIMAL: &str = "host = 'h'\nlisten = '10.0.0.11:7450'\nstate_file = '/s'\n\
                           controller_public_key = '/k'\nmasked_range = '100.127.0.0/16'\n\
                           gpu_interface = 'gpu0'\n";

    #[test]
    fn a_partition_names_its_parent_and_profile_together() {
        let config = |partition: &str| {
            format!(
                "{MINIMAL}[rcuda]\naddress = '10.78.0.2'\n\
                 [[gpus]]\nindex = 0\nmodel = 'A100'\nmemory_mib = 81920\n\
                 [[gpus]]\nindex = 100\nmodel = 'A100 MIG 3g.40gb'\nmemory_mib = 40960\n{partition}"
            )
        };
        let path = Path::new("agent.toml");
        let both = Config::parse(&config("parent = 0\nprofile = '3g.40gb'\n"), path).unwrap();
        assert_eq!(
            (both.gpus[1].parent, both.gpus[1].profile.as_deref()),
            (Some(0), Some("3g.40gb"))
        );
        for one in ["parent = 0\n", "profile = '3g.40gb'\n"] {
            let err = Config::parse(&config(one), path).unwrap_err().to_string();
            assert!(err.contains("both parent and profile"), "{one}: {err}");
        }
    }

    #[test]
    fn a_hosts_gpu_servers_name_their_layer() {
        let path = Path::new("agent.toml");
        let parse = |servers: &str| Config::parse(&format!("{MINIMAL}{servers}"), path);
        let old = parse("[rcuda]\naddress = '10.78.0.2'\n").unwrap().rcuda.unwrap();
        assert_eq!((old.remoting, old.base_port()), (gpgpums::Remoting::Rcuda, 8308));
        let lupine = parse("[gpu_servers]\naddress = '10.78.0.2'\nremoting = 'lupine'\n")
            .unwrap()
            .rcuda
            .unwrap();
        assert_eq!((lupine.remoting, lupine.base_port()), (gpgpums::Remoting::Lupine, 14833));
        let err = parse("[gpu_servers]\naddress = '10.78.0.2'\nremoting = 'scuda'\n").unwrap_err();
        let err = format!("{err:?}");
        assert!(err.contains("scuda") && err.contains("lupine"), "{err}");
    }

    #[test]
    fn managed_servers_need_a_command_ports_and_an_unprivileged_user() {
        let path = Path::new("agent.toml");
        let parse = |servers: &str| {
            Config::parse(
                &format!("{MINIMAL}[gpu_servers]\naddress = '10.78.0.2'\n{servers}"),
                path,
            )
        };
        let full = "managed = true\ncommand = ['/opt/lupine/bin/lupine_driver_server']\n\
                    ports = '20000-20999'\nuser = 'gsaas-gpu'\n";
        let servers = parse(full).unwrap().rcuda.unwrap();
        assert!(servers.managed);
        assert_eq!(servers.ports.unwrap().ports(), 20000..=20999);
        assert!(!parse("").unwrap().rcuda.unwrap().managed, "off unless asked");
        let mps = parse(&format!("{full}mps = true\n")).unwrap().rcuda.unwrap();
        assert!(mps.mps && !servers.mps);
        assert_eq!(mps.mps_pipe_directory, Path::new("/tmp/nvidia-mps"));
        for (change, named) in [
            (full.replace("command = ['/opt/lupine/bin/lupine_driver_server']\n", ""), "command"),
            (full.replace("ports = '20000-20999'\n", ""), "ports"),
            (full.replace("'gsaas-gpu'", "'root'"), "user"),
            (format!("{full}cpu_weight = 0\n"), "cpu_weight"),
            (format!("{full}[gpu_servers.env]\nLD_PRELOAD = '/tmp/evil.so'\n"), "LD_PRELOAD"),
            (format!("{full}[gpu_servers.env]\nGSAAS_SHARE_FD = '0'\n"), "GSAAS_SHARE_FD"),
            // The share is the agent's to set, per server; not a variable for all of them.
            (
                format!("{full}[gpu_servers.env]\nCUDA_MPS_ACTIVE_THREAD_PERCENTAGE = '100'\n"),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            ),
            ("mps = true\n".to_owned(), "managed = true"),
            (format!("{full}mps = true\nmps_pipe_directory = 'pipes'\n"), "absolute"),
            (format!("{full}mps = true\nspare_servers = 1\n"), "spare_servers"),
            (format!("{full}spare_servers = 9\n"), "spare_servers"),
        ] {
            let err = parse(&change).unwrap_err().to_string();
            assert!(err.contains(named), "{change}: {err}");
        }
        for bad in ["0-10", "30-20", "20000", "a-b", "1-70000"] {
            let err = parse(&full.replace("20000-20999", bad)).unwrap_err();
            assert!(format!("{err:?}").contains("port range"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn the_hosts_topology_is_names() {
        let config = |topology: &str| format!("{MINIMAL}[topology]\n{topology}");
        let path = Path::new("agent.toml");
        let placed = Config::parse(&config("zone = 'z1'\nrack = 'r12'\n"), path).unwrap();
        assert_eq!(placed.topology.get("rack").map(String::as_str), Some("r12"));
        let err = Config::parse(&config("rack = 'r 12'\n"), path).unwrap_err().to_string();
        assert!(err.contains("topology.rack") && err.contains("no group name"), "{err}");
    }

    #[test]
    fn what_the_host_offers_local_vms_is_in_range() {
        let config = |offers: &str| format!("{MINIMAL}[local_vms]\n{offers}");
        let path = Path::new("agent.toml");
        let parsed = Config::parse(&config("cpus = 64\nmemory_mib = 524288\n"), path).unwrap();
        let offers = parsed.local_vms.unwrap().resources();
        assert_eq!(offers, gpgpums::Resources::new(64_000, 524_288));
        let err = Config::parse(&config("cpus = 1000000\nmemory_mib = 1\n"), path);
        assert!(err.unwrap_err().to_string().contains("local_vms.cpus"));
        // Half an offer is no offer: the parser's error names the missing field.
        let err = format!("{:?}", Config::parse(&config("cpus = 4\n"), path).unwrap_err());
        assert!(err.contains("memory_mib"), "{err}");
    }

    #[test]
    fn errors_name_the_file() {
        let path = Path::new("/etc/rodvr/agent.toml");
        let err = Config::parse("host = 'x'", path).unwrap_err();
        assert!(err.to_string().contains("/etc/rodvr/agent.toml"), "{err}");
        let err = Config::load(Path::new("/nonexistent/agent.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/agent.toml"), "{err}");
    }
}
