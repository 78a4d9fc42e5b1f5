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
//! Then the launch latency again while 16 clients scrape `/metrics` (an admin token each, every
//! 50 ms each: 320 scrapes a second), with 50,000 deleted VMs in the history as a service that has
//! run a while has: once with the gauges cached (`metrics.gauge_refresh_ms` at its default, 5 s)
//! and once computed per scrape (`gauge_refresh_ms = 0`, what every scrape cost before the cache:
//! the pool's lock, and a count of the VMs by state).
//!
//! Run: `cargo bench -p gsaasd --bench check` (args: `-- [runs] [cgpus] [scrapers]`).
#![allow(clippy::print_stdout)]

mod common;

use std::time::{Duration, Instant};

use common::percentile;
use gsaasd::auth::Role;
use gsaasd::config::Config;
use gsaasd::service;

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

/// Inserts `n` deleted VMs of another project, as the history of a service that has run a while.
async fn seed_history(db: &gsaasd::db::Db, n: usize) {
    let mut conn = db.conn().await.unwrap();
    sqlx::query(&format!(
        "WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {n}) \
         INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
         created_ms, updated_ms) SELECT 'history-' || i, 'history', 'history', 'old', '{{}}', \
         'first-fit', 'deleted', 'done', '{{}}', i, i FROM seq"
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
}

/// Launch latencies (check, selection, POST -> 202, in ms) of `runs` sequential launches on a
/// fresh gsaasd with `gauge_refresh_ms`, while `scrapers` clients scrape `/metrics` every 50 ms.
async fn measure(runs: usize, cgpus: u32, scrapers: usize, gauge_refresh_ms: u64) -> [Vec<f64>; 3] {
    let dir = std::env::temp_dir().join(format!("gsaas-bench-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        ..Config::default()
    };
    config.hosts.reconcile_interval_secs = 3600;
    config.metrics.gauge_refresh_ms = gauge_refresh_ms;
    let svc = service::start(config).await.expect("gsaasd starts");
    if scrapers > 0 {
        seed_history(&svc.app.db, 50_000).await;
    }
    let base = svc.url();
    let token = svc.app.keys.issue("alpha", Some("alpha"), Role::Member, Duration::from_secs(3600));
    let admin = svc.app.keys.issue("ops", Some("ops"), Role::Admin, Duration::from_secs(3600));
    let http = reqwest::Client::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraping: Vec<_> = (0..scrapers)
        .map(|_| {
            let (http, url, admin, stop) =
                (http.clone(), format!("{base}/metrics"), admin.clone(), stop.clone());
            tokio::spawn(async move {
                let mut scrapes = 0u64;
                let mut every = tokio::time::interval(Duration::from_millis(50));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    every.tick().await;
                    let r = http.get(&url).bearer_auth(&admin).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                    scrapes += 1;
                }
                scrapes
            })
        })
        .collect();
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut scrapes = 0;
    for scraper in scraping {
        scrapes += scraper.await.unwrap();
    }
    if scrapers > 0 {
        eprintln!("{scrapers} scrapers, gauge_refresh_ms = {gauge_refresh_ms}: {scrapes} scrapes");
    }
    svc.abort();
    let _ = std::fs::remove_dir_all(&dir);
    for v in [&mut check, &mut post, &mut selection] {
        v.sort_by(f64::total_cmp);
    }
    [check, selection, post]
}

async fn run(runs: usize, cgpus: u32, scrapers: usize) {
    let [check, selection, post] = measure(runs, cgpus, 0, 5000).await;
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
    if scrapers == 0 {
        return;
    }
    let [_, _, cached] = measure(runs, cgpus, scrapers, 5000).await;
    let [_, _, uncached] = measure(runs, cgpus, scrapers, 0).await;
    println!(
        "\nPOST /v1/vms -> 202 while {scrapers} clients scrape /metrics every 50 ms each, 50,000 deleted VMs in the history\n"
    );
    println!("| gauges | p50 | p99 | p50 vs idle |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("no scrapers", &post),
        ("cached (gauge_refresh_ms = 5000, the default)", &cached),
        ("computed per scrape (gauge_refresh_ms = 0)", &uncached),
    ] {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.2}x |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            percentile(v, 0.5) / percentile(&post, 0.5)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let cgpus: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let scrapers: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(16);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(runs, cgpus, scrapers));
}
