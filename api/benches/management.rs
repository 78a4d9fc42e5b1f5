//! GSaaS management time per VM (dissertation Table 5.5: 7.90 / 15.67 / 23.38 s at 25 / 50 / 75
//! cGPUs; issue target: <= 50 ms at 75) with a REAL agent: the `rodvr-agent` binary, applying its
//! tables with `nft` to the kernel.
//!
//! The bench re-executes itself inside a network namespace it creates (`ip netns add`, removed at
//! the end), so every rule lands in that namespace and all traffic stays on its 127.0.0.1. Inside:
//! gsaasd (`service::start`, SQLite, `[hosts] backend = "agent"`, the simulated cloud at zero delay)
//! and the real `rodvr-agent` binary (built with `cargo build --release -p rodvr-agent`), configured
//! as a compute-GPU host with 8 GPUs of 80 GiB that registers with gsaasd over HTTP. Each run
//! launches one VM of N shared cGPUs of 100 MiB (`App::launch`, in process, as the HTTP handler
//! calls it), waits for `ready`, terminates it and waits for `deleted` (so every run meets an empty
//! route table, as in the paper).
//!
//! Columns (p50 over the runs):
//! - reserve + persist: `App::launch` time minus its `timings.check`: the one transaction that
//!   places every cGPU in the GPGPUMS pool, builds the cloud-init and stores VM and cGPUs.
//! - RODVR configuration: `timings.rodvr_configuration`, measured by gsaasd around the route push:
//!   the host's table computed from the database, PUT to the agent, which validates it, persists
//!   it (fsync) and applies it with one `nft -j -f -` transaction, answered, recorded.
//! - management = the two (the paper's GPU selection + RODVR configuration).
//! - reservation start -> routes applied, wall clock: `timings.total - timings.check` (ms
//!   resolution): includes the saga's bookkeeping around the zero-delay cloud (create, wait ACTIVE).
//!
//! Run: `cargo build --release -p rodvr-agent && cargo bench -p gsaasd --bench management`
//! (args: `-- [runs] [sizes,...]`; needs root, `ip` and `nft`).
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gsaasd::app::vms::LaunchInput;
use gsaasd::auth::{Caller, Role};
use gsaasd::config::{Config, HostsBackend};
use gsaasd::http::views::LaunchRequest;
use gsaasd::model::VmState;
use gsaasd::service;

const NETNS_ENV: &str = "GSAAS_BENCH_NETNS";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn agent_binary() -> PathBuf {
    std::env::var_os("RODVR_AGENT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/rodvr-agent"))
    })
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Default)]
struct Sample {
    reserve: Vec<f64>,
    rodvr: Vec<f64>,
    management: Vec<f64>,
    wall: Vec<f64>,
    check: Vec<f64>,
}

async fn run(runs: usize, sizes: &[u32]) {
    let dir = std::env::temp_dir().join(format!("gsaas-bench-mgmt-{}", std::process::id()));
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
    let host = "compute-gpu0";
    let agent_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    config.hosts.agent_urls.insert(host.parse().unwrap(), format!("http://127.0.0.1:{agent_port}"));
    let svc = service::start(config.clone()).await.expect("gsaasd starts");
    let app = svc.app.clone();

    // The real agent, registering with gsaasd.
    let token = app.keys.issue(host, None, Role::Agent, Duration::from_secs(3600));
    let agent_config = dir.join("agent.toml");
    let mut gpus = String::new();
    for i in 0..8 {
        gpus += &format!("[[gpus]]\nindex = {i}\nmodel = \"H100\"\nmemory_mib = 81920\n\n");
    }
    std::fs::write(
        &agent_config,
        format!(
            "host = \"{host}\"\nlisten = \"127.0.0.1:{agent_port}\"\nstate_file = \"{}\"\ncontroller_public_key = \"{}\"\n\
             masked_range = \"100.127.0.0/16\"\ngpu_interface = \"gpu0\"\n\n[controller]\nurl = \"{}\"\n\
             token = \"{token}\"\nheartbeat_interval_secs = 3600\n\n[rcuda]\naddress = \"10.232.0.11\"\n\n{gpus}",
            dir.join("routes.json").display(),
            config.signing_key_path().with_extension("pub").display(),
            svc.url(),
        ),
    )
    .unwrap();
    let bin = agent_binary();
    assert!(bin.exists(), "{} missing: cargo build --release -p rodvr-agent", bin.display());
    let mut child = Command::new(&bin)
        .arg("--config")
        .arg(&agent_config)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start rodvr-agent");
    let stdout = child.stdout.take().unwrap();
    let _agent = Agent(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    eprintln!("{}", line.trim());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !app.hosts().await.unwrap().iter().any(|h| h.name.as_str() == host) {
        assert!(Instant::now() < deadline, "the agent did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let caller =
        Caller { subject: "bench".into(), project: Some("alpha".into()), role: Role::Member };
    let mut rows = Vec::new();
    for &n in sizes {
        let mut s = Sample::default();
        let mut refused = None;
        for i in 0..runs + 1 {
            let request: LaunchRequest = serde_json::from_value(serde_json::json!({
                "name": format!("mgmt-{n}-{i}"), "image": "cirros-0.6.2", "flavor": "m1.small",
                "ncgpus": n, "gpu_memory_mib": 100, "mode": "shared"
            }))
            .unwrap();
            let (spec, policy) = request.into_spec();
            let began = Instant::now();
            let launched = app
                .launch(&caller, LaunchInput { spec, policy, idempotency_key: None, tenant: None })
                .await;
            let launch_s = began.elapsed().as_secs_f64();
            let details = match launched {
                Ok((details, _)) => details,
                Err(e) => {
                    refused = Some(format!("{e} (after {:.2} ms)", launch_s * 1e3));
                    break;
                }
            };
            let id = details.vm.id;
            let check = details.vm.timings.check.unwrap_or(0.0);
            let deadline = Instant::now() + Duration::from_secs(30);
            let ready = loop {
                let d = app.visible_vm(&caller, id).await.unwrap();
                if d.vm.state == VmState::Ready {
                    break d;
                }
                assert!(d.vm.state == VmState::Creating && Instant::now() < deadline, "{:?}", d.vm);
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            app.terminate(&caller, id).await.unwrap();
            loop {
                let d = app.visible_vm(&caller, id).await.unwrap();
                if d.vm.state == VmState::Deleted {
                    break;
                }
                assert!(Instant::now() < deadline, "{:?}", d.vm);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if i == 0 {
                continue; // warm-up
            }
            let t = &ready.vm.timings;
            let reserve = (launch_s - check) * 1e3;
            let rodvr = t.rodvr_configuration.unwrap() * 1e3;
            s.reserve.push(reserve);
            s.rodvr.push(rodvr);
            s.management.push(reserve + rodvr);
            s.wall.push((t.total.unwrap() - check) * 1e3);
            s.check.push(check * 1e3);
        }
        for v in [&mut s.reserve, &mut s.rodvr, &mut s.management, &mut s.wall, &mut s.check] {
            v.sort_by(f64::total_cmp);
        }
        eprintln!("{n} cGPUs: management p50 {:.2} ms", percentile(&s.management, 0.5));
        rows.push((n, s, refused));
    }

    println!("\nGSaaS management time, one VM of N cGPUs, real rodvr-agent + nft in a network namespace, SQLite, p50 of {runs} runs\n");
    println!("| cGPUs | paper management (Table 5.5) | reserve + persist | RODVR configuration | management | p90 management | reservation start -> routes applied (wall, ms res.) | speed-up vs paper |");
    println!("|---|---|---|---|---|---|---|---|");
    for (n, s, refused) in &rows {
        let paper = match n {
            25 => Some(7.9014),
            50 => Some(15.6715),
            75 => Some(23.3833),
            _ => None,
        };
        if let Some(reason) = refused {
            println!(
                "| {n} | {} | refused: {reason} | | | | | |",
                paper.map_or("-".into(), |p| format!("{p} s"))
            );
            continue;
        }
        let m = percentile(&s.management, 0.5);
        println!(
            "| {n} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {} |",
            paper.map_or("-".into(), |p| format!("{p} s")),
            percentile(&s.reserve, 0.5),
            percentile(&s.rodvr, 0.5),
            m,
            percentile(&s.management, 0.9),
            percentile(&s.wall, 0.5),
            paper.map_or("-".into(), |p| format!("{:.0}x", p * 1e3 / m)),
        );
    }
    println!(
        "\nA VM's cGPUs are also written into its cloud-init user_data (the rCUDA environment, once, \
         in /etc/rcuda.env), which Nova caps at 65,535 bytes of base64; a launch past that is \
         refused with 422 before anything is stored."
    );
    drop(svc);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if std::env::var_os(NETNS_ENV).is_none() {
        // Outside: make a namespace, run this same binary in it, remove the namespace.
        let name = format!("gsaas-mgmt-{}", std::process::id());
        sh(Command::new("ip").args(["netns", "add", &name]));
        let status = Command::new("ip")
            .args(["netns", "exec", &name])
            .arg(std::env::current_exe().unwrap())
            .args(&args)
            .env(NETNS_ENV, &name)
            .status();
        sh(Command::new("ip").args(["netns", "del", &name]));
        std::process::exit(if status.is_ok_and(|s| s.success()) { 0 } else { 1 });
    }
    sh(Command::new("ip").args(["link", "set", "lo", "up"]));
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(15);
    let sizes: Vec<u32> = args
        .get(1)
        .map(|a| a.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 25, 50, 75, 500, 1000]);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(runs, &sizes));
}
