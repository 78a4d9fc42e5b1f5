//! What the benches share: percentiles, and gsaasd with a REAL agent in a network namespace of
//! the bench's own (the management and elastic benches).
//!
//! A bench with a real agent re-executes itself inside a namespace it creates (`ip netns add`,
//! removed at the end), so every rule the agent writes lands there and all traffic stays on its
//! loopback. Inside: gsaasd (`service::start`, SQLite, `[hosts] backend = "agent"`, the simulated
//! cloud at zero delay) and the `rodvr-agent` binary (`cargo build --release -p rodvr-agent`, or
//! `$RODVR_AGENT`), a compute-GPU host with 8 GPUs of 80 GiB that registers with gsaasd over HTTP.
#![allow(dead_code, clippy::print_stdout)]

/// The allocator of the `gsaasd` binary (see `api/src/main.rs`), so the benches measure gsaasd as
/// it is deployed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpgpums::{HostId, HostKind};
use gsaasd::app::App;
use gsaasd::auth::Role;
use gsaasd::config::{Config, HostsBackend, InventoryGpu, InventoryHost};
use gsaasd::service::{self, Service};

/// The `p` quantile (0..=1) of sorted samples, by nearest rank; NaN for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// CPU seconds (user + system, in USER_HZ ticks of 10 ms) from a `/proc` `stat` file: the
/// process's, every thread (`/proc/self/stat`), or the calling thread's
/// (`/proc/thread-self/stat`). The work a step did, which the machine's neighbours disturb less
/// than its wall-clock time.
pub fn cpu_seconds(stat: &str) -> f64 {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    // After the command's name (in parentheses, and it may hold spaces), utime and stime are the
    // 12th and 13th fields.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or("", |(_, f)| f).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// [`cpu_seconds`] of this process, every thread.
pub fn process_cpu_seconds() -> f64 {
    cpu_seconds("/proc/self/stat")
}

/// Each live thread's time on a CPU so far, in seconds, summed by thread name (digits dropped,
/// so that a pool's threads add up): `/proc/self/task/*/schedstat`, the scheduler's own
/// nanoseconds, where `stat`'s ticks of 10 ms are too coarse for a few polls' work. A thread that
/// ended meanwhile drops out, so compare it with [`process_cpu_seconds`].
pub fn threads_cpu_seconds() -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return by_name };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let name: String = name.trim().chars().filter(|c| !c.is_ascii_digit()).collect();
        let ns = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<f64>().ok()))
            .unwrap_or(0.0);
        *by_name.entry(name).or_insert(0.0) += ns / 1e9;
    }
    by_name
}

/// What each thread name used since `before` (a [`threads_cpu_seconds`] reading), in seconds.
pub fn threads_cpu_since(
    before: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, f64> {
    threads_cpu_seconds()
        .into_iter()
        .map(|(name, s)| {
            let used = s - before.get(&name).copied().unwrap_or(0.0);
            (name, used)
        })
        .collect()
}

/// `used` ([`threads_cpu_since`], possibly summed over runs) in ms per `per` (a count of polls,
/// boots), largest first, as one line.
pub fn threads_cpu_line(used: &std::collections::BTreeMap<String, f64>, per: f64) -> String {
    let mut used: Vec<(&String, f64)> =
        used.iter().map(|(name, s)| (name, s * 1e3 / per)).filter(|(_, ms)| *ms > 0.0005).collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1));
    used.iter().map(|(name, ms)| format!("{name} {ms:.3}")).collect::<Vec<_>>().join(", ")
}

/// gsaasd's runtime in a bench that measures it apart from its client: two workers, as in its
/// binary on this machine, named `gsaasd-worker` so that [`threads_cpu_seconds`] tells them apart.
pub fn gsaasd_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gsaasd-worker")
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The name of host `h` of a cloud of [`inventory`] size.
pub fn host_name(h: usize) -> String {
    format!("gpu-{h:05}")
}

/// A cloud's inventory: `hosts` compute-GPU hosts of `gpus_per_host` H100s of `gpu_mib` each.
pub fn inventory(hosts: usize, gpus_per_host: usize, gpu_mib: u64) -> Vec<InventoryHost> {
    (0..hosts)
        .map(|h| InventoryHost {
            name: HostId::new(host_name(h)).unwrap(),
            kind: HostKind::ComputeGpu,
            gpus: vec![InventoryGpu::of("H100", gpu_mib, gpus_per_host as u32)],
            gpu_network_address: None,
            remoting: Default::default(),
            server_base_port: None,
            topology: Default::default(),
        })
        .collect()
}

/// The models of [`mixed_inventory`], with their compute capability.
pub const MIXED_MODELS: [(&str, &str); 8] = [
    ("T4", "7.5"),
    ("A10", "8.6"),
    ("L4", "8.9"),
    ("L40S", "8.9"),
    ("A100", "8.0"),
    ("H100", "9.0"),
    ("H200", "9.0"),
    ("B200", "10.0"),
];

/// [`inventory`] of a mixed fleet: host `h` has GPUs of one model (`h` mod 8), in rack `h` mod
/// 10 (`CUSTOM_RACK_R<n>`), with NVLink on one host in three.
pub fn mixed_inventory(hosts: usize, gpus_per_host: usize, gpu_mib: u64) -> Vec<InventoryHost> {
    let mut inventory = inventory(hosts, gpus_per_host, gpu_mib);
    for (h, host) in inventory.iter_mut().enumerate() {
        let (model, cc) = MIXED_MODELS[h % MIXED_MODELS.len()];
        let mut traits = std::collections::BTreeSet::from([format!("CUSTOM_RACK_R{}", h % 10)]);
        if h % 3 == 0 {
            traits.insert("CUSTOM_NVLINK".to_owned());
        }
        host.gpus = vec![InventoryGpu {
            compute_capability: Some(cc.parse().unwrap()),
            cuda_version: Some("12.4".parse().unwrap()),
            traits,
            ..InventoryGpu::of(model, gpu_mib, gpus_per_host as u32)
        }];
    }
    inventory
}

pub fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

const NETNS_ENV: &str = "GSAAS_BENCH_NETNS";

/// Outside a namespace: creates one, runs this same binary with `args` in it, removes it and
/// exits with the child's outcome. Inside (the re-executed binary): brings `lo` up and returns.
pub fn enter_own_netns(tag: &str, args: &[String]) {
    if std::env::var_os(NETNS_ENV).is_some() {
        sh(Command::new("ip").args(["link", "set", "lo", "up"]));
        return;
    }
    let name = format!("gsaas-{tag}-{}", std::process::id());
    sh(Command::new("ip").args(["netns", "add", &name]));
    // `nsenter --net`, not `ip netns exec`: that remounts /sys, hiding the cgroups that an
    // agent running its GPU servers needs.
    let status = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{name}"))
        .arg(std::env::current_exe().expect("the bench's own path"))
        .args(args)
        .env(NETNS_ENV, &name)
        .status();
    sh(Command::new("ip").args(["netns", "del", &name]));
    std::process::exit(if status.is_ok_and(|s| s.success()) { 0 } else { 1 });
}

fn agent_binary() -> PathBuf {
    std::env::var_os("RODVR_AGENT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/rodvr-agent"))
    })
}

/// gsaasd and its one real agent; the agent is killed and the directory removed on drop.
pub struct RealAgentBed {
    pub svc: Service,
    pub app: Arc<App>,
    agent: Child,
    dir: PathBuf,
}

/// The one host of a [`RealAgentBed`].
pub const HOST: &str = "compute-gpu0";

impl RealAgentBed {
    /// Starts gsaasd and the agent (with `agent_extra`, top-level keys of its config, added) and
    /// waits until the agent registered.
    pub async fn start(tag: &str, agent_extra: &str) -> RealAgentBed {
        Self::start_with(tag, agent_extra, "").await
    }

    /// [`Self::start`] with `servers_extra` added to the agent's `[rcuda]` (`[gpu_servers]`)
    /// section.
    pub async fn start_with(tag: &str, agent_extra: &str, servers_extra: &str) -> RealAgentBed {
        let dir = std::env::temp_dir().join(format!("gsaas-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.join("data"),
            ..Config::default()
        };
        config.hosts.backend = HostsBackend::Agent;
        config.hosts.reconcile_interval_secs = 3600;
        config.hosts.heartbeat_timeout_secs = 3600;
        // gsaasd reaches the agent where its config says: a port picked here, which the agent takes.
        let agent_port =
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        config
            .hosts
            .agent_urls
            .insert(HOST.parse().unwrap(), format!("http://127.0.0.1:{agent_port}"));
        let svc = service::start(config.clone()).await.expect("gsaasd starts");
        let app = svc.app.clone();

        let token = app.keys.issue(HOST, None, Role::Agent, Duration::from_secs(3600));
        let agent_config = dir.join("agent.toml");
        let mut gpus = String::new();
        for i in 0..8 {
            gpus += &format!(
                "[[gpus]]\nindex = {i}\nmodel = \"H100\"\nmemory_mib = 81920\n\
                 uuid = \"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd\"\n\n"
            );
        }
        std::fs::write(
            &agent_config,
            format!(
                "host = \"{HOST}\"\nlisten = \"127.0.0.1:{agent_port}\"\nstate_file = \"{}\"\n\
                 controller_public_key = \"{}\"\nmasked_range = \"100.127.0.0/16\"\n\
                 gpu_interface = \"gpu0\"\n{agent_extra}\n[controller]\nurl = \"{}\"\n\
                 token = \"{token}\"\nheartbeat_interval_secs = 3600\n\n\
                 [rcuda]\naddress = \"10.232.0.11\"\n{servers_extra}\n\n{gpus}",
                dir.join("routes.json").display(),
                config.signing_key_path().with_extension("pub").display(),
                svc.url(),
            ),
        )
        .unwrap();
        let bin = agent_binary();
        assert!(bin.exists(), "{} missing: cargo build --release -p rodvr-agent", bin.display());
        let mut agent = Command::new(&bin)
            .arg("--config")
            .arg(&agent_config)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start rodvr-agent");
        let stdout = agent.stdout.take().unwrap();
        let bed = RealAgentBed { svc, app, agent, dir };
        // The agent's stdout is read to its end: a closed pipe would fail its later lines.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(20)).expect("the agent starts");
        eprintln!("{first}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !bed.app.hosts().await.unwrap().iter().any(|h| h.name.as_str() == HOST) {
            assert!(Instant::now() < deadline, "the agent did not register");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bed
    }
}

impl Drop for RealAgentBed {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
