//! Elastic cGPUs with a REAL agent (issue [2/5]): how long attaching N cGPUs to a running VM takes,
//! from the request to the new routes live and the VM's environment served with them, and the same
//! for detaching 1 cGPU from a VM of 75. Target: attaching 1 cGPU <= 10 ms p50 and <= 25 ms p99;
//! the paper configures each cGPU in 0.31 s.
//!
//! gsaasd and the `rodvr-agent` binary run as in the management bench ([`common`]), the agent with
//! its metadata listener on 127.0.0.1. The bench gives each VM's fixed IP to the namespace's `lo`
//! and reads the environment as the VM does, `GET /rcuda.env` from the VM's address (the agent
//! answers by source address); what differs inside a VM is the DNAT from the masked metadata
//! endpoint, which the e2e test covers. The agent serves a table's environment only once it has
//! applied that table to the kernel, so "served" implies "routes live".
//!
//! One attach run: launch a VM of 1 cGPU (not timed), `App::attach` N cGPUs (as the HTTP handler
//! calls it; returns with the 202), poll the environment until it lists N + 1 devices (served),
//! then poll the VM until every cGPU is `live` (settled: what the API and `--wait` see); terminate.
//! One detach run: on a VM of 75, `App::detach` cGPU 37 -> environment lists 74 -> settled; then
//! attach 1 back (not timed; it takes index 37 again).
//!
//! With managed servers (issue [1/5]: the agent starts a server per cGPU, here the stand-in of
//! `rodvr-agent/tests/standin_server.py`, and a cGPU is served only once its server accepts), a
//! third argument: `managed`, `spares` (managed with 4 warm spare servers per GPU), `both`
//! (unmanaged and managed, two rounds each, alternately) or `all` (the three, alternately).
//!
//! Run: `cargo build --release -p rodvr-agent && cargo bench -p gsaasd --bench elastic`
//! (args: `-- [runs] [attach sizes,...] [unmanaged|managed|spares|both|all]`, default 200 runs of 1, 8, 75,
//! unmanaged; needs root, `ip`, `nft`, `nsenter`, and python3 for the stand-in servers).
#![allow(clippy::print_stdout)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{percentile, RealAgentBed};
use gpgpums::{Mode, VmId};
use gsaasd::app::elastic::AttachInput;
use gsaasd::app::vms::LaunchInput;
use gsaasd::auth::{Caller, Role};
use gsaasd::http::views::{launch_spec, LaunchRequest};
use gsaasd::model::{CgpuState, VmState};

const METADATA_LISTEN: &str = "127.0.0.1:8775";
const DETACHED_INDEX: u32 = 37;

struct Bench {
    bed: RealAgentBed,
    caller: Caller,
}

/// Milliseconds from the request: to its answer, to the environment served, to the VM settled.
#[derive(Default)]
struct Sample {
    accepted: Vec<f64>,
    served: Vec<f64>,
    settled: Vec<f64>,
}

impl Sample {
    fn sort(&mut self) {
        for v in [&mut self.accepted, &mut self.served, &mut self.settled] {
            v.sort_by(f64::total_cmp);
        }
    }
}

impl Bench {
    async fn launch(&self, ncgpus: u32) -> (VmId, Ipv4Addr) {
        let request: LaunchRequest = serde_json::from_value(serde_json::json!({
            "image": "cirros-0.6.2", "flavor": "m1.small",
            "ncgpus": ncgpus, "gpu_memory_mib": 100, "mode": "shared"
        }))
        .unwrap();
        let (spec, policy, queue) = launch_spec(request);
        let input = LaunchInput { spec, policy, idempotency_key: None, tenant: None, queue };
        let (details, _) = self.bed.app.launch(&self.caller, input).await.expect("launch");
        let id = details.vm.id;
        self.wait_vm(id, |s, _| s == VmState::Ready).await;
        let ip = self
            .bed
            .app
            .visible_vm(&self.caller, id, gsaasd::policy::actions::VM_SHOW)
            .await
            .unwrap()
            .vm
            .fixed_ip
            .unwrap();
        // The VM's address on lo, to read its environment from (already there for a reused one).
        let _ = Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", "lo"]).output();
        (id, ip)
    }

    async fn terminate(&self, id: VmId) {
        self.bed.app.terminate(&self.caller, id).await.unwrap();
        self.wait_vm(id, |s, _| s == VmState::Deleted).await;
    }

    /// Polls the VM until `done(state, cGPU states)`.
    async fn wait_vm(&self, id: VmId, done: impl Fn(VmState, &[CgpuState]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let d = self
                .bed
                .app
                .visible_vm(&self.caller, id, gsaasd::policy::actions::VM_SHOW)
                .await
                .unwrap();
            let cgpus: Vec<CgpuState> = d.cgpus.iter().map(|c| c.state).collect();
            if done(d.vm.state, &cgpus) {
                return;
            }
            assert!(Instant::now() < deadline && d.vm.state != VmState::Error, "{:?}", d.vm);
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }

    async fn settled(&self, id: VmId, n: usize) {
        self.wait_vm(id, |_, c| c.len() == n && c.iter().all(|s| *s == CgpuState::Live)).await
    }

    fn attach_input(ncgpus: u32) -> AttachInput {
        AttachInput {
            ncgpus,
            gpu_memory_mib: Some(100),
            mode: Mode::Shared,
            distinct_gpus: false,
            policy: None,
            queue: false,
            compute_percent: None,
            borrow: None,
        }
    }

    /// Times one change: `change` makes the request; then the environment the VM at `ip` reads
    /// must list `devices`, and the VM must settle with that many cGPUs.
    async fn time_change(
        &self,
        sample: &mut Sample,
        id: VmId,
        env: &reqwest::Client,
        devices: usize,
        change: impl std::future::Future<Output = ()>,
    ) {
        let began = Instant::now();
        change.await;
        let accepted = began.elapsed();
        let deadline = Instant::now() + Duration::from_secs(30);
        let want = format!("export RCUDA_DEVICE_COUNT={devices}\n");
        loop {
            let url = format!("http://{METADATA_LISTEN}/rcuda.env");
            if let Ok(response) = env.get(&url).send().await {
                if response.text().await.is_ok_and(|t| t.starts_with(&want)) {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the environment never listed {devices} devices");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let served = began.elapsed();
        self.settled(id, devices).await;
        let settled = began.elapsed();
        sample.accepted.push(accepted.as_secs_f64() * 1e3);
        sample.served.push(served.as_secs_f64() * 1e3);
        sample.settled.push(settled.as_secs_f64() * 1e3);
    }
}

/// A client of the agent's metadata listener that connects from the VM's address.
fn env_client(ip: Ipv4Addr) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(ip))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The agent's `[gpu_servers]` keys that make it run a stand-in server per cGPU (the stand-in is
/// copied where the servers' unprivileged user can read it).
fn managed_servers(spares: u32) -> String {
    let dir = std::env::temp_dir().join(format!("gsaas-bench-standin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("standin_server.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../rodvr-agent/tests/standin_server.py"),
        &script,
    )
    .unwrap();
    // Where the agent probes its servers: the GPU-server address, on this namespace's `lo`.
    let _ = Command::new("ip").args(["addr", "add", "10.232.0.11/32", "dev", "lo"]).status();
    format!(
        "managed = true\ncommand = [\"/usr/bin/python3\", \"{}\"]\nports = \"20000-20999\"\n\
         user = \"nobody\"\nrun_dir = \"{}\"\nspare_servers = {spares}\n",
        script.display(),
        dir.join("run").display()
    )
}

/// Warm spares per GPU in the `spares` runs.
const SPARES_PER_GPU: u32 = 4;

/// How the bench's agent runs the GPU servers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Servers {
    Unmanaged,
    Managed,
    /// Managed, with a warm spare per GPU.
    Spares,
}

async fn run(runs: usize, sizes: &[u32], mode: Servers) {
    let extra = format!("metadata_listen = \"{METADATA_LISTEN}\"\n");
    let servers = match mode {
        Servers::Unmanaged => String::new(),
        Servers::Managed => managed_servers(0),
        Servers::Spares => managed_servers(SPARES_PER_GPU),
    };
    let bed = RealAgentBed::start_with("elastic", &extra, &servers).await;
    let caller = Caller::new("bench", Some("alpha".into()), Role::Member);
    let b = Bench { bed, caller };
    let app = b.bed.app.clone();
    let mut rows = Vec::new();
    for &n in sizes {
        let mut sample = Sample::default();
        for i in 0..runs + 1 {
            let (id, ip) = b.launch(1).await;
            let env = env_client(ip);
            let mut s = Sample::default();
            let attach = async {
                app.attach(&b.caller, id, Bench::attach_input(n), None).await.expect("attach");
            };
            b.time_change(&mut s, id, &env, 1 + n as usize, attach).await;
            b.terminate(id).await;
            if i > 0 {
                sample.accepted.extend(s.accepted);
                sample.served.extend(s.served);
                sample.settled.extend(s.settled);
            }
        }
        sample.sort();
        eprintln!("attach {n}: served p50 {:.2} ms", percentile(&sample.served, 0.5));
        rows.push((format!("attach {n} to a VM of 1"), sample));
    }

    let (id, ip) = b.launch(75).await;
    let env = env_client(ip);
    let mut sample = Sample::default();
    for i in 0..runs + 1 {
        let mut s = Sample::default();
        let detach = async {
            app.detach(&b.caller, id, DETACHED_INDEX).await.expect("detach");
        };
        b.time_change(&mut s, id, &env, 74, detach).await;
        let mut back = Sample::default();
        let attach = async {
            app.attach(&b.caller, id, Bench::attach_input(1), None).await.expect("attach");
        };
        b.time_change(&mut back, id, &env, 75, attach).await;
        if i > 0 {
            sample.accepted.extend(s.accepted);
            sample.served.extend(s.served);
            sample.settled.extend(s.settled);
        }
    }
    sample.sort();
    rows.push(("detach 1 from a VM of 75".to_owned(), sample));
    b.terminate(id).await;

    let servers = match mode {
        Servers::Unmanaged => "unmanaged servers",
        Servers::Managed => "a managed stand-in server per cGPU",
        Servers::Spares => "a managed stand-in server per cGPU, 4 warm spares per GPU",
    };
    println!(
        "\nElastic cGPUs, real rodvr-agent + nft in a network namespace, {servers}, SQLite, \
         {runs} runs each (after 1 warm-up); ms from the request\n"
    );
    println!("| change | accepted (202) p50 | environment served p50 | p99 | VM settled p50 | p99 | paper (0.31 s per cGPU) |");
    println!("|---|---|---|---|---|---|---|");
    for (what, s) in &rows {
        let paper = what
            .strip_prefix("attach ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .map_or("-".to_owned(), |n| format!("{:.2} s", n * 0.31));
        println!(
            "| {what} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {paper} |",
            percentile(&s.accepted, 0.5),
            percentile(&s.served, 0.5),
            percentile(&s.served, 0.99),
            percentile(&s.settled, 0.5),
            percentile(&s.settled, 0.99),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    common::enter_own_netns("elastic", &args);
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(200);
    let sizes: Vec<u32> = args
        .get(1)
        .map(|a| a.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 75]);
    use Servers::*;
    let modes: Vec<Servers> = match args.get(2).map(String::as_str) {
        None | Some("unmanaged") => vec![Unmanaged],
        Some("managed") => vec![Managed],
        Some("spares") => vec![Spares],
        Some("both") => vec![Unmanaged, Managed, Managed, Unmanaged],
        Some("all") => vec![Unmanaged, Managed, Spares, Spares, Managed, Unmanaged],
        Some(other) => panic!("{other}: unmanaged, managed, spares, both or all"),
    };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for mode in modes {
        rt.block_on(run(runs, &sizes, mode));
    }
}
