//! GSaaS checking time (dissertation Table 5.5: 4.7 ms; issue target: p99 <= 1 ms) and the whole
//! launch request latency (POST /v1/vms -> 202) beside it.
//!
//! gsaasd runs in this process (`service::start`, SQLite, the simulated cloud at zero delay,
//! in-process agents, the dissertation's testbed). One client launches N VMs one after another
//! (1 shared cGPU of 100 MiB; `cgpus` argument to change), waits for each to be `ready`, terminates
//! it and waits for `deleted` before the next launch, so each request meets an idle server.
//!
//! - check: the VM's `timings.check`, measured by gsaasd from the start of `App::launch` to the
//!   end of the cloud's check (request validation, digest, cloud check).
//! - POST -> 202: measured by the client around the request (HTTP over 127.0.0.1, JWT verification,
//!   JSON parsing, check, the reservation transaction, the response).
//!
//! Run: `cargo bench -p gsaasd --bench check` (args: `-- [runs] [cgpus]`).
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use gsaasd::auth::Role;
use gsaasd::config::Config;
use gsaasd::service;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn wait(http: &reqwest::Client, url: &str, token: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let vm: serde_json::Value =
            http.get(url).bearer_auth(token).send().await.unwrap().json().await.unwrap();
        if vm["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "{vm}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn run(runs: usize, cgpus: u32) {
    let dir = std::env::temp_dir().join(format!("gsaas-bench-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        ..Config::default()
    };
    config.hosts.reconcile_interval_secs = 3600;
    let svc = service::start(config).await.expect("gsaasd starts");
    let base = svc.url();
    let token = svc.app.keys.issue("alpha", Some("alpha"), Role::Member, Duration::from_secs(3600));
    let http = reqwest::Client::new();
    let body = serde_json::json!({
        "name": "bench", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": cgpus, "gpu_memory_mib": 100, "mode": "shared"
    });
    let (mut check, mut post, mut selection) = (Vec::new(), Vec::new(), Vec::new());
    let warmup = 20;
    for i in 0..runs + warmup {
        let began = Instant::now();
        let r = http
            .post(format!("{base}/v1/vms"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let vm: serde_json::Value = r.json().await.unwrap();
        let elapsed = began.elapsed().as_secs_f64() * 1e3;
        assert_eq!(status, 202, "{vm}");
        if i >= warmup {
            post.push(elapsed);
            check.push(vm["timings"]["check"].as_f64().unwrap() * 1e3);
            selection.push(vm["timings"]["gpu_selection"].as_f64().unwrap() * 1e3);
        }
        let url = format!("{base}/v1/vms/{}", vm["id"].as_str().unwrap());
        wait(&http, &url, &token, "ready").await;
        http.delete(&url).bearer_auth(&token).send().await.unwrap();
        wait(&http, &url, &token, "deleted").await;
    }
    for v in [&mut check, &mut post, &mut selection] {
        v.sort_by(f64::total_cmp);
    }
    println!("\nGSaaS checking and launch latency, {runs} sequential launches of {cgpus} cGPU(s), SQLite, idle server\n");
    println!("| stage | paper (Table 5.5) | p50 | p99 | max | target |");
    println!("|---|---|---|---|---|---|");
    let row = |name: &str, paper: &str, v: &[f64], target: &str| {
        println!(
            "| {name} | {paper} | {:.3} ms | {:.3} ms | {:.3} ms | {target} |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v[v.len() - 1]
        )
    };
    row("check (validation + cloud check)", "4.7 ms", &check, "p99 <= 1 ms");
    row("GPU selection (gpgpums place)", "-", &selection, "-");
    row("POST /v1/vms -> 202 (client)", "-", &post, "-");
    svc.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let cgpus: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(runs, cgpus));
}
