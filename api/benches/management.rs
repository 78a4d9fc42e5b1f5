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

mod common;

use std::time::{Duration, Instant};

use common::{percentile, RealAgentBed};
use gsaasd::app::vms::LaunchInput;
use gsaasd::auth::{Caller, Role};
use gsaasd::http::views::{launch_spec, LaunchRequest};
use gsaasd::model::VmState;

#[derive(Default)]
struct Sample {
    reserve: Vec<f64>,
    rodvr: Vec<f64>,
    management: Vec<f64>,
    wall: Vec<f64>,
    check: Vec<f64>,
}

async fn run(runs: usize, sizes: &[u32]) {
    let bed = RealAgentBed::start("mgmt", "").await;
    let app = bed.app.clone();

    let caller = Caller::new("bench", Some("alpha".into()), Role::Member);
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
            let (spec, policy, queue) = launch_spec(request);
            let began = Instant::now();
            let launched = app
                .launch(
                    &caller,
                    LaunchInput { spec, policy, idempotency_key: None, tenant: None, queue },
                )
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
                let d =
                    app.visible_vm(&caller, id, gsaasd::policy::actions::VM_SHOW).await.unwrap();
                if d.vm.state == VmState::Ready {
                    break d;
                }
                assert!(d.vm.state == VmState::Creating && Instant::now() < deadline, "{:?}", d.vm);
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            app.terminate(&caller, id).await.unwrap();
            loop {
                let d =
                    app.visible_vm(&caller, id, gsaasd::policy::actions::VM_SHOW).await.unwrap();
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
        "\nA VM's cGPUs are also written into its cloud-init user_data (its boot-time rCUDA environment, \
         in /etc/rcuda.env), which Nova caps at 65,535 bytes of base64; a launch past that is \
         refused with 422 before anything is stored."
    );
    drop(bed);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    common::enter_own_netns("mgmt", &args);
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(15);
    let sizes: Vec<u32> = args
        .get(1)
        .map(|a| a.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 25, 50, 75, 500, 1000]);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(runs, &sizes));
}
