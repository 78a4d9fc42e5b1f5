//! The cGPU servers this host runs (`[gpu_servers] managed = true`): one process per cGPU that a
//! table gives the host's GPUs, each seeing its GPU alone, held to its share, and alone in its
//! PID namespace and cgroup (see [`process`], [`cgroup`], [`share`]).
//!
//! A server's life: **starting** (spawned, not yet accepting; no route goes to it) -> **ready**
//! (accepts on its port) -> ended, by itself or for not accepting within `start_timeout_secs`
//! -> **backoff** (everything of it killed; restarted after 0.5 s, doubling to 30 s for each end
//! in a row, on the same port when it is still free) -> starting. A table that no longer lists
//! the cGPU (detached, terminated, re-homed, evicted, fenced) ends it at once. The port is the
//! agent's choice from `ports`, reported to gsaasd, which routes the cGPU to it.
//!
//! **Memory, the second layer.** Every second the agent reads, through the driver (NVML), the GPU
//! memory each process holds, sums it over each server's cgroup, reports it, and ends a server of
//! a shared cGPU that holds more than its share plus `memory_slack_mib`, whatever path it took
//! past the interposer (its own ioctls, an allocation the interposer does not know); it is
//! started again after its backoff, its memory freed with its processes.
//!
//! The agent keeps a record of its servers (`servers.json` in the run directory, 0600): after it
//! is restarted, or killed with `kill -9`, the next agent **adopts** every recorded server whose
//! process still runs (its PID and start time match) and whose table still lists it, and kills
//! everything else it finds under its cgroups: no orphan server, no port held by one, and no
//! cGPU of the table without a server.
//!
//! **Warm spares** (`spare_servers`, not under MPS). Starting a server costs a process start and
//! whatever the server does before it accepts; an attach that waited for it took 60-70 ms with
//! the stand-in server. So the agent can keep one started server per GPU that serves nobody: its
//! share state's limit is 0 (nothing fits), no route and no client entry lead to its port. A new
//! cGPU on that GPU takes it: the limit becomes the cGPU's share before the cGPU's route exists,
//! and a new spare starts behind it once the table is answered, with no lock of the supervisor
//! held (a process start waits 10-20 ms in the kernel for its move into its cgroups, and the
//! next table must not wait for that), at the lowest CPU weight until its own handover (starting
//! one takes no CPU time from live servers). Spares are not recorded: a restarted agent kills
//! them with everything else it does not adopt, and starts new ones.

pub mod cgroup;
pub mod process;
pub mod share;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpgpums::ids::{GpuId, VmId};
use rodvr_contract::protocol::{GpuReport, ServerSpec, ServerState, ServerStatus};
use rodvr_core::servers::Supervisor;
use serde::{Deserialize, Serialize};

use crate::config::RcudaConfig;
use cgroup::{Cgroups, Limits, ServerCgroup};
use share::ShareState;

/// The first wait before a restart; it doubles for each end in a row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server that stayed up this long starts its backoff afresh at its next end.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long the processes of an ended server may take to go.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// A server's log is cut back to nothing past this size (a server cannot fill the disk).
const MAX_LOG_BYTES: u64 = 8 << 20;

/// Why the servers cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ServersError {
    #[error("managed GPU servers: {0}")]
    Setup(String),
}

/// What every server is started with, from `[gpu_servers]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The host's GPU-server address: servers are reached (and probed) there.
    pub address: Ipv4Addr,
    pub command: Vec<String>,
    pub ports: std::ops::RangeInclusive<u16>,
    pub uid: u32,
    pub gid: u32,
    pub interposer: Option<PathBuf>,
    /// The layer's own port variable (`LUPINE_PORT`), besides `GSAAS_SERVER_PORT`.
    pub port_variable: Option<&'static str>,
    pub env: BTreeMap<String, String>,
    pub run_dir: PathBuf,
    pub cgroup: Option<PathBuf>,
    pub limits: Limits,
    pub ready_timeout: Duration,
    pub start_timeout: Duration,
    /// How far past its share a server's GPU memory may go, as the driver counts it (the
    /// driver's own per-context memory, which the interposer cannot see).
    pub memory_slack_bytes: u64,
    /// The MPS control daemon's pipe directory, when the host runs MPS.
    pub mps: Option<PathBuf>,
    /// Warm spare servers to keep per GPU (see `[gpu_servers] spare_servers`); 0: none.
    pub spares: u32,
    pub unshare: PathBuf,
    pub setpriv: PathBuf,
}

impl Settings {
    /// The settings of `[gpu_servers]` (managed), with the user looked up and util-linux's
    /// `unshare` and `setpriv` found.
    pub fn from_config(config: &RcudaConfig) -> Result<Self, ServersError> {
        let setup = |why: String| ServersError::Setup(why);
        let name = config.user.as_deref().unwrap_or_default();
        let user = nix::unistd::User::from_name(name)
            .map_err(|e| setup(format!("cannot look up user {name:?}: {e}")))?
            .ok_or_else(|| setup(format!("no user {name:?} on this host")))?;
        if user.uid.is_root() {
            return Err(setup(format!("user {name:?} is root")));
        }
        let find = |program: &str| {
            ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
                .iter()
                .map(|dir| Path::new(dir).join(program))
                .find(|p| p.is_file())
                .ok_or_else(|| setup(format!("{program} (util-linux) is not installed")))
        };
        let ports = config.ports.ok_or_else(|| setup("no ports".into()))?;
        Ok(Self {
            address: config.address,
            command: config.command.clone(),
            ports: ports.ports(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            interposer: config.interposer.clone(),
            port_variable: match config.remoting {
                gpgpums::Remoting::Lupine => Some("LUPINE_PORT"),
                gpgpums::Remoting::Rcuda => Some("RCUDA_PORT"),
            },
            env: config.env.clone(),
            run_dir: config.run_dir.clone(),
            cgroup: config.cgroup.clone(),
            limits: Limits {
                pids_max: config.pids_max,
                memory_max_bytes: config.memory_max_mib << 20,
                cpu_weight: config.cpu_weight,
            },
            ready_timeout: Duration::from_millis(config.ready_timeout_ms),
            start_timeout: Duration::from_secs(config.start_timeout_secs),
            memory_slack_bytes: config.memory_slack_mib << 20,
            mps: config.mps.then(|| config.mps_pipe_directory.clone()),
            spares: config.spare_servers,
            unshare: find("unshare")?,
            setpriv: find("setpriv")?,
        })
    }
}

/// What the agent records of a running server, to adopt it after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    name: String,
    vm: VmId,
    index: u32,
    gpu: GpuId,
    port: u16,
    pid: u32,
    start_time: u64,
    restarts: u32,
}

/// A server's start, all but its process (see `ProcessSupervisor::prepare`).
#[derive(Debug)]
struct Prepared {
    port: u16,
    env: Vec<(String, String)>,
    log: File,
}

/// A started process of a server.
#[derive(Debug)]
struct Running {
    pid: u32,
    start_time: u64,
    /// The agent's child; `None` when adopted from an earlier agent (not its child).
    child: Option<Child>,
}

impl Running {
    /// Whether the process still runs (a child of this agent is reaped when it ended).
    fn ended(&mut self) -> Option<String> {
        if let Some(child) = &mut self.child {
            return match child.try_wait() {
                Ok(Some(status)) => Some(format!("exited ({status})")),
                Ok(None) => None,
                Err(e) => Some(format!("cannot be waited for: {e}")),
            };
        }
        (process::start_time(self.pid) != Some(self.start_time)).then(|| "exited".to_owned())
    }
}

#[derive(Debug)]
struct Server {
    spec: ServerSpec,
    name: String,
    state: ServerState,
    port: Option<u16>,
    process: Option<Running>,
    cgroup: ServerCgroup,
    share: ShareState,
    /// When it entered its state (or when its backoff ends, in backoff).
    since: Instant,
    /// The GPU memory its processes held at the last reading (bytes).
    gpu_memory: Option<u64>,
    /// Times it was ended for holding more than its share.
    over_share_ends: u32,
    /// Ends in a row (for the backoff), and restarts in all.
    ends_in_row: u32,
    restarts: u32,
    /// Whether a process of it was ever started (the next start is a restart).
    started: bool,
    reason: Option<String>,
}

impl Server {
    /// Failed, with why, and tried again after a backoff.
    fn back_off(&mut self, why: String) {
        self.state = ServerState::Failed;
        self.reason = Some(why);
        self.since = Instant::now() + backoff_after(self.ends_in_row);
        self.ends_in_row += 1;
    }

    fn status(&self) -> ServerStatus {
        ServerStatus {
            vm: self.spec.vm,
            index: self.spec.index,
            gpu: self.spec.gpu.clone(),
            state: self.state,
            port: self.port,
            pid: self.process.as_ref().map(|p| p.pid),
            restarts: self.restarts,
            gpu_memory_mib: self.gpu_memory.map(|bytes| bytes >> 20),
            reason: self.reason.as_deref().map(rodvr_contract::protocol::health_reason),
            over_share_ends: self.over_share_ends,
            routed_here: false,
        }
    }

    fn record(&self) -> Option<Record> {
        let process = self.process.as_ref()?;
        Some(Record {
            name: self.name.clone(),
            vm: self.spec.vm,
            index: self.spec.index,
            gpu: self.spec.gpu.clone(),
            port: self.port?,
            pid: process.pid,
            start_time: process.start_time,
            restarts: self.restarts,
        })
    }
}

/// Reads the GPU memory each process holds (bytes, by host PID), as the driver counts it.
pub type MemoryReader = Box<dyn Fn() -> Option<HashMap<u32, u64>> + Send + Sync>;

/// How often the memory watch reads (the supervisor ticks every 100 ms).
const MEMORY_EVERY: Duration = Duration::from_secs(1);

/// The cGPU servers of this host, as processes.
pub struct ProcessSupervisor {
    settings: Settings,
    /// How a server's `CUDA_VISIBLE_DEVICES` names each GPU: its UUID (`GPU-...`, `MIG-...`),
    /// or its index where none is known.
    visible: HashMap<GpuId, String>,
    cgroups: Cgroups,
    servers: Mutex<BTreeMap<(VmId, u32), Server>>,
    /// The warm spares, by name (see the module's doc); locked after `servers`.
    spares: Mutex<BTreeMap<String, Server>>,
    /// The new spares being started outside the locks: their ports, and their GPUs; locked
    /// after `spares`.
    launching: Mutex<HashMap<u16, GpuId>>,
    /// Told whenever a server's state or port changes, so the agent reports at once.
    changed: Arc<tokio::sync::Notify>,
    /// The memory watch: its reader, and when it last read.
    memory: Option<MemoryReader>,
    memory_read: Mutex<Option<Instant>>,
    /// Servers ended for holding more GPU memory than their share (and the slack).
    pub over_share: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ProcessSupervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSupervisor")
            .field("settings", &self.settings)
            .field("servers", &self.servers)
            .field("memory_watch", &self.memory.is_some())
            .finish_non_exhaustive()
    }
}

/// A server's name: its cgroup's, its files'.
fn server_name(vm: VmId, index: u32) -> String {
    format!("s-{}-{index}", vm.as_uuid().simple())
}

impl ProcessSupervisor {
    /// Prepares the run directory and the cgroups, adopts the recorded servers that still run
    /// (those `keep` lists; the rest are ended) and ends every other process under the
    /// servers' cgroups.
    pub fn start(
        settings: Settings,
        gpus: &[GpuReport],
        keep: &[ServerSpec],
    ) -> Result<Arc<Self>, ServersError> {
        Self::start_watching(settings, gpus, keep, None)
    }

    /// [`Self::start`] with the memory watch reading through `memory` (the agent: NVML).
    pub fn start_watching(
        settings: Settings,
        gpus: &[GpuReport],
        keep: &[ServerSpec],
        memory: Option<MemoryReader>,
    ) -> Result<Arc<Self>, ServersError> {
        let setup = ServersError::Setup;
        gsaas_infra::files::create_private_dir(&settings.run_dir)
            .map_err(|e| setup(format!("{}: {e}", settings.run_dir.display())))?;
        let cgroups = Cgroups::prepare(settings.cgroup.as_deref()).map_err(setup)?;
        let visible = gpus
            .iter()
            .map(|g| {
                (g.id.clone(), g.attributes.uuid.clone().unwrap_or_else(|| g.index.to_string()))
            })
            .collect();
        let supervisor = Self {
            settings,
            visible,
            cgroups,
            servers: Mutex::default(),
            spares: Mutex::default(),
            launching: Mutex::default(),
            changed: Arc::default(),
            memory,
            memory_read: Mutex::default(),
            over_share: Default::default(),
        };
        supervisor.adopt(keep);
        Ok(Arc::new(supervisor))
    }

    /// Told whenever a server's state or port changes.
    pub fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(VmId, u32), Server>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_spares(&self) -> MutexGuard<'_, BTreeMap<String, Server>> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_launching(&self) -> MutexGuard<'_, HashMap<u16, GpuId>> {
        self.launching.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ports the servers, the spares and the spares being started hold.
    fn held_ports(
        &self,
        servers: &BTreeMap<(VmId, u32), Server>,
        spares: &BTreeMap<String, Server>,
    ) -> HashSet<u16> {
        let mut held: HashSet<u16> =
            servers.values().chain(spares.values()).filter_map(|s| s.port).collect();
        held.extend(self.lock_launching().keys().copied());
        held
    }

    /// The warm spares now (see the module's doc), each as a status of no cGPU.
    pub fn spares(&self) -> Vec<ServerStatus> {
        self.lock_spares().values().map(Server::status).collect()
    }

    /// Whether new cGPUs take warm spares.
    fn spares_on(&self) -> bool {
        self.settings.spares > 0 && self.settings.mps.is_none()
    }

    /// The spares each GPU lacks, prepared for [`Self::start_spares`] to start outside the
    /// locks, their ports held in `launching` meanwhile (one that cannot be prepared is kept in
    /// its backoff, as any server).
    fn new_spares(
        &self,
        servers: &BTreeMap<(VmId, u32), Server>,
        spares: &mut BTreeMap<String, Server>,
    ) -> Vec<(Server, Prepared)> {
        let mut fresh = Vec::new();
        if !self.spares_on() {
            return fresh;
        }
        let mut gpus: Vec<&GpuId> = self.visible.keys().collect();
        gpus.sort();
        for gpu in gpus {
            let kept = spares.values().filter(|s| s.spec.gpu == *gpu).count()
                + self.lock_launching().values().filter(|g| *g == gpu).count();
            for _ in kept as u32..self.settings.spares {
                match self.new_spare(gpu) {
                    Ok(mut spare) => {
                        let held = self.held_ports(servers, spares);
                        match self.prepare(&mut spare, &held) {
                            Some(prepared) => {
                                self.lock_launching().insert(prepared.port, gpu.clone());
                                fresh.push((spare, prepared));
                            }
                            None => {
                                spares.insert(spare.name.clone(), spare);
                            }
                        }
                    }
                    Err(why) => eprintln!("rodvr-agent: a spare server for {gpu}: {why}"),
                }
            }
        }
        fresh
    }

    /// Starts the spares [`Self::new_spares`] prepared, with no lock held (a process start
    /// waits for the kernel to move the new process into its cgroups, 10-20 ms, and an attach
    /// meanwhile must not wait for the supervisor), then files them.
    fn start_spares(&self, fresh: Vec<(Server, Prepared)>) {
        let mut started = Vec::with_capacity(fresh.len());
        for (mut spare, prepared) in fresh {
            let port = prepared.port;
            self.spawn(&mut spare, prepared);
            started.push((spare, port));
        }
        let mut spares = self.lock_spares();
        let mut launching = self.lock_launching();
        for (spare, port) in started {
            launching.remove(&port);
            spares.insert(spare.name.clone(), spare);
        }
    }

    /// A spare for `gpu` (not yet running): limit 0, nobody's.
    fn new_spare(&self, gpu: &GpuId) -> Result<Server, String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let born = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let safe: String =
            gpu.as_str().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let name = format!("p-{safe}-{born:x}-{serial}");
        let spec = ServerSpec {
            vm: "00000000-0000-0000-0000-000000000000".parse().expect("the nil id parses"),
            index: 0,
            gpu: gpu.clone(),
            memory_mib: Some(0),
            clients: Vec::new(),
            compute_percent: None,
        };
        self.server_named(spec, name)
    }

    /// A server's cgroup limits: a spare's CPU weight is the lowest, so that starting one
    /// takes no CPU time from the live servers and the agent (it gets the configured weight
    /// at its handover).
    fn limits_of(&self, server: &Server) -> Limits {
        if server.spec.vm.as_uuid().is_nil() {
            Limits { cpu_weight: SPARE_CPU_WEIGHT, ..self.settings.limits }
        } else {
            self.settings.limits
        }
    }

    /// `spec`'s server made of a spare of its GPU, a ready one first, else one still starting:
    /// its limit becomes `spec`'s share (see the module's doc). The next tick starts a new spare.
    fn take_spare(
        &self,
        spares: &mut BTreeMap<String, Server>,
        spec: &ServerSpec,
    ) -> Option<Server> {
        if !self.spares_on() {
            return None;
        }
        let pick = |state: ServerState| {
            spares.iter().find(|(_, s)| s.spec.gpu == spec.gpu && s.state == state).map(|(n, _)| n)
        };
        let name = pick(ServerState::Ready).or_else(|| pick(ServerState::Starting))?.clone();
        let mut spare = spares.remove(&name).expect("found above");
        if let Err(e) = spare.share.set_limit_bytes(limit_of(spec)) {
            eprintln!("rodvr-agent: spare server {}: its share state: {e}", spare.name);
            self.end(&mut spare);
            self.forget_files(&spare);
            return None;
        }
        if let Err(e) = spare.cgroup.set_cpu_weight(self.settings.limits) {
            eprintln!("rodvr-agent: spare server {}: its CPU weight: {e}", spare.name);
        }
        spare.spec = spec.clone();
        // A spare starts behind it after this table's answer (`replenish`).
        Some(spare)
    }

    /// Removes a server's share state and log.
    fn forget_files(&self, server: &Server) {
        let _ = std::fs::remove_file(server.share.path());
        let _ = std::fs::remove_file(self.log_path(&server.name));
    }

    fn records_path(&self) -> PathBuf {
        self.settings.run_dir.join("servers.json")
    }

    fn share_path(&self, name: &str) -> PathBuf {
        self.settings.run_dir.join(format!("{name}.share"))
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.settings.run_dir.join(format!("{name}.log"))
    }

    /// Takes over the recorded servers that still run and that `keep` lists; ends the rest.
    fn adopt(&self, keep: &[ServerSpec]) {
        let records: Vec<Record> = std::fs::read(self.records_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        let wanted: HashMap<(VmId, u32), &ServerSpec> = keep.iter().map(|s| (s.key(), s)).collect();
        let mut servers = self.lock();
        for record in records {
            let key = (record.vm, record.index);
            let Some(spec) = wanted.get(&key).filter(|s| s.gpu == record.gpu) else { continue };
            // Its own name, or the spare's it was made of.
            let named = record.name == server_name(record.vm, record.index)
                || record.name.starts_with("p-") && !record.name.contains('/');
            if !named || process::start_time(record.pid) != Some(record.start_time) {
                continue;
            }
            let cgroup = self.cgroups.open(&record.name);
            let Ok(share) = ShareState::open(&self.share_path(&record.name)) else { continue };
            if !cgroup.populated() || share.limit_bytes().ok() != Some(limit_of(spec)) {
                continue;
            }
            let accepting = self.accepts(record.port);
            servers.insert(
                key,
                Server {
                    spec: (*spec).clone(),
                    name: record.name,
                    state: if accepting { ServerState::Ready } else { ServerState::Starting },
                    port: Some(record.port),
                    process: Some(Running {
                        pid: record.pid,
                        start_time: record.start_time,
                        child: None,
                    }),
                    cgroup,
                    share,
                    since: Instant::now(),
                    gpu_memory: None,
                    over_share_ends: 0,
                    ends_in_row: 0,
                    restarts: record.restarts,
                    started: true,
                    reason: None,
                },
            );
        }
        let adopted: HashSet<String> = servers.values().map(|s| s.name.clone()).collect();
        for name in self.cgroups.names() {
            if !adopted.contains(&name) {
                if let Err(e) = self.cgroups.open(&name).kill_and_remove(KILL_WAIT) {
                    eprintln!("rodvr-agent: ending an unknown server {name}: {e}");
                }
            }
        }
        // Files of servers that are no more.
        if let Ok(entries) = std::fs::read_dir(&self.settings.run_dir) {
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                let stem = file.strip_suffix(".share").or_else(|| file.strip_suffix(".log"));
                if stem.is_some_and(|stem| !adopted.contains(stem)) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        self.persist(&servers);
    }

    /// Writes the records of the running servers (atomically; 0600). Not synced: the records
    /// serve an agent restarted on this host while its servers run, and both read the page
    /// cache; a host crash ends the servers with them (their start times then differ).
    fn persist(&self, servers: &BTreeMap<(VmId, u32), Server>) {
        let records: Vec<Record> = servers.values().filter_map(Server::record).collect();
        let path = self.records_path();
        let tmp = self.settings.run_dir.join(".servers.json.tmp");
        let bytes = serde_json::to_vec_pretty(&records).expect("records serialize");
        let written = gsaas_infra::files::open_private(&tmp, false)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            eprintln!("rodvr-agent: cannot record the servers in {}: {e}", path.display());
        }
    }

    /// Whether something accepts on `port` at the servers' address.
    fn accepts(&self, port: u16) -> bool {
        let addr = SocketAddrV4::new(self.settings.address, port).into();
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    }

    /// A port for a server: `preferred` while it is still free, else the lowest free one of the
    /// range that no other server holds.
    fn free_port(&self, held: &HashSet<u16>, preferred: Option<u16>) -> Option<u16> {
        let free = |port: u16| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok();
        preferred
            .filter(|p| free(*p))
            .or_else(|| self.settings.ports.clone().find(|p| !held.contains(p) && free(*p)))
    }

    /// Starts `server`'s process on a free port (the one it had while it is free); on failure
    /// it is `failed`, with why, and tried again after a backoff.
    fn launch(&self, server: &mut Server, held: &HashSet<u16>) {
        if let Some(prepared) = self.prepare(server, held) {
            self.spawn(server, prepared);
        }
    }

    /// Everything of `server`'s start but the process: its port (the one it had while it is
    /// free), its cgroups, its log and its environment; `None` when one cannot be had (it is
    /// then in its backoff).
    fn prepare(&self, server: &mut Server, held: &HashSet<u16>) -> Option<Prepared> {
        let Some(port) = self.free_port(held, server.port) else {
            let range = &self.settings.ports;
            let why = format!("no free port in {}-{}", range.start(), range.end());
            server.back_off(why);
            return None;
        };
        server.port = Some(port);
        let Some(visible) = self.visible.get(&server.spec.gpu) else {
            let why = format!("{} is not one of this host's GPUs", server.spec.gpu);
            server.back_off(why);
            return None;
        };
        let prepared = (|| -> Result<Prepared, String> {
            let cgroup = self
                .cgroups
                .create(&server.name, self.limits_of(server))
                .map_err(|e| e.to_string())?;
            server.cgroup = cgroup;
            let log = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(self.log_path(&server.name))
                .map_err(|e| format!("its log: {e}"))?;
            gsaas_infra::files::restrict(&self.log_path(&server.name), 0o600)
                .map_err(|e| format!("its log: {e}"))?;
            let env = self.environment(&server.spec, visible, port, server.share.file());
            Ok(Prepared { port, env, log })
        })();
        match prepared {
            Ok(prepared) => Some(prepared),
            Err(why) => {
                server.back_off(why);
                None
            }
        }
    }

    /// Starts the process of a prepared server (see [`Self::prepare`]).
    fn spawn(&self, server: &mut Server, prepared: Prepared) {
        let launch = process::Launch {
            unshare: &self.settings.unshare,
            setpriv: &self.settings.setpriv,
            uid: self.settings.uid,
            gid: self.settings.gid,
            command: &self.settings.command,
            env: prepared.env,
            cgroup_procs: server.cgroup.procs_files(),
            share: server.share.file(),
            log: &prepared.log,
        };
        match process::spawn(&launch) {
            Ok(child) => {
                let pid = child.id();
                let start_time = process::start_time(pid).unwrap_or_default();
                if server.started {
                    server.restarts += 1;
                }
                server.started = true;
                server.process = Some(Running { pid, start_time, child: Some(child) });
                server.state = ServerState::Starting;
                server.since = Instant::now();
            }
            Err(e) => {
                server.back_off(format!("cannot start: {e}"));
            }
        }
    }

    /// The server's whole environment.
    fn environment(
        &self,
        spec: &ServerSpec,
        visible: &str,
        port: u16,
        share: &File,
    ) -> Vec<(String, String)> {
        use std::os::fd::AsRawFd;
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/nonexistent".into()),
            ("CUDA_VISIBLE_DEVICES".into(), visible.to_owned()),
            ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
            ("GSAAS_SERVER_PORT".into(), port.to_string()),
            ("GSAAS_SERVER_ADDRESS".into(), self.settings.address.to_string()),
            ("GSAAS_SHARE_FD".into(), share.as_raw_fd().to_string()),
        ];
        if let Some(variable) = self.settings.port_variable {
            env.push((variable.into(), port.to_string()));
        }
        if let Some(interposer) = &self.settings.interposer {
            env.push(("LD_PRELOAD".into(), interposer.display().to_string()));
        }
        if let Some(pipes) = &self.settings.mps {
            // Every server is a client of the host's MPS daemon: held to its share of the SMs
            // and, by MPS too, to its share of the memory (device 0: the one it sees).
            env.push(("CUDA_MPS_PIPE_DIRECTORY".into(), pipes.display().to_string()));
            if let Some(percent) = spec.compute_percent {
                env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), percent.to_string()));
            }
            if let Some(mib) = spec.memory_mib {
                env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("0={mib}M")));
            }
        }
        env.extend(self.settings.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// Ends every process of `server` and removes its cgroups.
    fn end(&self, server: &mut Server) {
        if let Err(e) = server.cgroup.kill_and_remove(KILL_WAIT) {
            eprintln!("rodvr-agent: ending server {}: {e}", server.name);
        }
        if let Some(mut process) = server.process.take() {
            if let Some(child) = &mut process.child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Moves every server along its life (see the module's doc); true when a state or port
    /// changed.
    pub fn tick(&self) -> bool {
        let mut servers = self.lock();
        let changed = self.tick_locked(&mut servers);
        {
            let mut spares = self.lock_spares();
            let now = Instant::now();
            let names: Vec<String> = spares.keys().cloned().collect();
            for name in names {
                let mut spare = spares.remove(&name).expect("listed above");
                let held = self.held_ports(&servers, &spares);
                self.tick_one(&mut spare, &held, now);
                spares.insert(name, spare);
            }
        }
        if changed {
            self.persist(&servers);
            self.changed.notify_one();
        }
        drop(servers);
        self.replenish();
        changed
    }

    fn tick_locked(&self, servers: &mut BTreeMap<(VmId, u32), Server>) -> bool {
        let now = Instant::now();
        let mut changed = self.watch_memory(servers, now);
        let keys: Vec<(VmId, u32)> = servers.keys().copied().collect();
        for key in keys {
            let mut server = servers.remove(&key).expect("listed above");
            let held = {
                let spares = self.lock_spares();
                self.held_ports(servers, &spares)
            };
            changed |= self.tick_one(&mut server, &held, now);
            servers.insert(key, server);
        }
        changed
    }

    /// Moves one server along its life, `held` the ports of the others; true when its state or
    /// port changed.
    fn tick_one(&self, server: &mut Server, held: &HashSet<u16>, now: Instant) -> bool {
        let before = (server.state, server.port);
        if let Some(why) = server.process.as_mut().and_then(Running::ended) {
            self.ended(server, why);
        } else if server.state == ServerState::Starting {
            let port = server.port.expect("a started server has a port");
            if self.accepts(port) {
                server.state = ServerState::Ready;
                server.reason = None;
                server.since = now;
            } else if now.duration_since(server.since) > self.settings.start_timeout {
                let why =
                    format!("did not accept within {} s", self.settings.start_timeout.as_secs());
                self.ended(server, why);
            }
        } else if server.state == ServerState::Ready
            && server.ends_in_row > 0
            && now.duration_since(server.since) > STABLE_AFTER
        {
            server.ends_in_row = 0;
        }
        if matches!(server.state, ServerState::Backoff | ServerState::Failed) && now >= server.since
        {
            self.launch(server, held);
        }
        if std::fs::metadata(self.log_path(&server.name)).is_ok_and(|m| m.len() > MAX_LOG_BYTES) {
            let _ = std::fs::write(self.log_path(&server.name), b"(cut)\n");
        }
        before != (server.state, server.port)
    }

    /// Once a second: each server's GPU memory, summed over its processes; a server of a shared
    /// cGPU past its share and the slack is ended (true: one was).
    fn watch_memory(&self, servers: &mut BTreeMap<(VmId, u32), Server>, now: Instant) -> bool {
        let Some(reader) = &self.memory else { return false };
        {
            let mut last = self.memory_read.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| now.duration_since(at) < MEMORY_EVERY) {
                return false;
            }
            *last = Some(now);
        }
        let Some(held) = reader() else { return false };
        let mut ended = false;
        for server in servers.values_mut() {
            if server.process.is_none() {
                server.gpu_memory = None;
                continue;
            }
            let bytes: u64 = server.cgroup.pids().iter().filter_map(|pid| held.get(pid)).sum();
            server.gpu_memory = Some(bytes);
            let Some(share) = server.spec.memory_mib.map(|mib| mib << 20) else { continue };
            if bytes > share.saturating_add(self.settings.memory_slack_bytes) {
                let why = format!(
                    "held {} MiB of GPU memory, past its share of {} MiB (and {} MiB of slack)",
                    bytes >> 20,
                    share >> 20,
                    self.settings.memory_slack_bytes >> 20
                );
                eprintln!("rodvr-agent: server {} {why}: ended", server.name);
                self.over_share.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                server.over_share_ends += 1;
                self.ended(server, why);
                ended = true;
            }
        }
        ended
    }

    /// `server` ended (`why`): everything of it is killed, and it waits out its backoff.
    fn ended(&self, server: &mut Server, why: String) {
        self.end(server);
        server.process = None;
        server.state = ServerState::Backoff;
        server.reason = Some(why);
        server.since = Instant::now() + backoff_after(server.ends_in_row);
        server.ends_in_row += 1;
    }

    /// Starts `spec`'s server (not yet running).
    fn new_server(&self, spec: &ServerSpec) -> Result<Server, String> {
        if let Some(why) = rodvr_core::servers::unservable(spec, self.settings.mps.is_some()) {
            return Err(why);
        }
        self.server_named(spec.clone(), server_name(spec.vm, spec.index))
    }

    /// A server of `spec` named `name` (its cgroup's, its files'), not yet running.
    fn server_named(&self, spec: ServerSpec, name: String) -> Result<Server, String> {
        let limit = limit_of(&spec);
        let share = ShareState::create(
            &self.share_path(&name),
            limit,
            self.settings.limits.memory_max_bytes,
        )
        .map_err(|e| format!("its share state: {e}"))?;
        Ok(Server {
            spec,
            cgroup: self.cgroups.open(&name),
            name,
            state: ServerState::Failed,
            port: None,
            process: None,
            share,
            since: Instant::now(),
            gpu_memory: None,
            over_share_ends: 0,
            ends_in_row: 0,
            restarts: 0,
            started: false,
            reason: None,
        })
    }
}

/// The IPv4 address of `interface` (the GPU interface: where this host's VMs' traffic to GPU
/// servers comes from once masqueraded), or none, said on stderr, when it has none.
pub fn interface_address(interface: &str) -> Option<Ipv4Addr> {
    let found = nix::ifaddrs::getifaddrs().ok().and_then(|mut addresses| {
        addresses.find_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            (a.interface_name == interface).then_some(ip)
        })
    });
    if found.is_none() {
        eprintln!(
            "rodvr-agent: {interface} has no IPv4 address: GPU hosts that run their servers \
             will not take this host's VMs until it has one"
        );
    }
    found
}

/// A spare's CPU weight until its handover (the lowest `cpu.weight`).
const SPARE_CPU_WEIGHT: u32 = 1;

/// The device memory `spec`'s server may hold, in bytes.
fn limit_of(spec: &ServerSpec) -> u64 {
    spec.memory_mib.map_or(share::UNLIMITED, |mib| mib << 20)
}

/// The wait before the next start after `ends` ends in a row.
fn backoff_after(ends: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1 << ends.min(10)).min(MAX_BACKOFF)
}

impl Supervisor for ProcessSupervisor {
    fn converge(&self, specs: &[ServerSpec]) -> Vec<ServerStatus> {
        let mut servers = self.lock();
        let wanted: HashMap<(VmId, u32), &ServerSpec> =
            specs.iter().map(|s| (s.key(), s)).collect();
        // Gone from the table, or moved to another GPU or memory: ended (a new one starts). Its
        // clients are the filter's business (a VM placed on its host after its server started
        // changes them): the server runs on.
        let moved = |spec: &ServerSpec, running: &ServerSpec| {
            (&spec.gpu, spec.memory_mib, spec.compute_percent)
                != (&running.gpu, running.memory_mib, running.compute_percent)
        };
        let ending: Vec<(VmId, u32)> = servers
            .iter()
            .filter(|(key, server)| wanted.get(key).is_none_or(|spec| moved(spec, &server.spec)))
            .map(|(key, _)| *key)
            .collect();
        for key in ending {
            let mut server = servers.remove(&key).expect("listed above");
            self.end(&mut server);
            self.forget_files(&server);
        }
        let mut refused: HashMap<(VmId, u32), String> = HashMap::new();
        for spec in specs {
            if let Some(server) = servers.get_mut(&spec.key()) {
                server.spec.clients.clone_from(&spec.clients);
                continue;
            }
            let mut spares = self.lock_spares();
            if let Some(server) = self.take_spare(&mut spares, spec) {
                servers.insert(spec.key(), server);
                continue;
            }
            match self.new_server(spec) {
                Ok(mut server) => {
                    self.launch(&mut server, &self.held_ports(&servers, &spares));
                    servers.insert(spec.key(), server);
                }
                Err(why) => {
                    eprintln!("rodvr-agent: server for cGPU {} of {}: {why}", spec.index, spec.vm);
                    refused.insert(spec.key(), why);
                }
            }
        }
        // New servers get a bounded time to accept before the answer.
        let deadline = Instant::now() + self.settings.ready_timeout;
        loop {
            self.tick_locked(&mut servers);
            let starting = specs.iter().any(|s| {
                servers.get(&s.key()).is_some_and(|server| server.state == ServerState::Starting)
            });
            if !starting || Instant::now() >= deadline {
                break;
            }
            drop(servers);
            std::thread::sleep(Duration::from_millis(2));
            servers = self.lock();
        }
        self.persist(&servers);
        self.changed.notify_one();
        specs
            .iter()
            .map(|spec| match servers.get(&spec.key()) {
                Some(server) => server.status(),
                None => ServerStatus {
                    vm: spec.vm,
                    index: spec.index,
                    gpu: spec.gpu.clone(),
                    state: ServerState::Failed,
                    port: None,
                    pid: None,
                    restarts: 0,
                    gpu_memory_mib: None,
                    reason: refused.remove(&spec.key()),
                    over_share_ends: 0,
                    routed_here: false,
                },
            })
            .collect()
    }

    fn statuses(&self) -> Vec<ServerStatus> {
        self.lock().values().map(Server::status).collect()
    }

    fn mps(&self) -> bool {
        self.settings.mps.is_some()
    }

    /// The spares each GPU lacks, started with no lock held.
    fn replenish(&self) {
        let fresh = {
            let servers = self.lock();
            let mut spares = self.lock_spares();
            self.new_spares(&servers, &mut spares)
        };
        self.start_spares(fresh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff_after(0), Duration::from_millis(500));
        assert_eq!(backoff_after(1), Duration::from_secs(1));
        assert_eq!(backoff_after(3), Duration::from_secs(4));
        assert_eq!(backoff_after(50), MAX_BACKOFF);
    }

    #[test]
    fn names_are_short_and_unique_per_cgpu() {
        let vm = VmId::from_uuid(uuid::Uuid::from_u128(0xabc));
        let name = server_name(vm, 3);
        assert_eq!(name, format!("s-{}-3", vm.as_uuid().simple()));
        assert!(name.len() < 64 && !name.contains('/'));
    }
}
