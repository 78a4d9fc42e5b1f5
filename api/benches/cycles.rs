//! Launch + terminate cycles per second through the HTTP API (issue target: >= 2,000/s on SQLite,
//! >= 1,000/s on PostgreSQL on the 2-core project machine).
//!
//! gsaasd runs in this process (`service::start`: the simulated cloud at zero delay, in-process
//! agents on the dissertation's testbed of 1 compute-GPU host with 4 x 8 GiB GPUs and 3 compute-rGPU
//! hosts). C client tasks each repeat one *cycle* over HTTP/1.1 keep-alive (reqwest):
//!
//!   POST /v1/vms (1 shared cGPU of 100 MiB) -> 202
//!   -> GET /v1/vms/{id}?wait=20 until `ready` (long-poll; or every POLL without `wait`)
//!   -> DELETE /v1/vms/{id} -> 202
//!   -> GET /v1/vms/{id}?wait=20 until `deleted`.
//!
//! Cycles/s = cycles completed inside the measured window / window. The client and the server
//! share the same runtime and the same 2 cores, so the client's cost (HTTP, JSON, polling) is in
//! the figure. Server-side, the bench also counts VMs that reached `ready` (`launches_ready`) and
//! the route pushes, to show what the server did in the window.
//!
//! Run: `cargo bench -p gsaasd --bench cycles` (args: `-- [secs] [concurrency,...] [sqlite|postgres|both] [long-poll|poll]`).
#![allow(clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gsaasd::auth::Role;
use gsaasd::service;
use support::{test_config, Store};

const POLL: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Counts {
    cycles: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
}

struct Row {
    store: Store,
    clients: usize,
    secs: f64,
    cycles: u64,
    requests: u64,
    errors: u64,
    follow: Follow,
    ready: u64,
    pushes: u64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// How a client follows a VM to its next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// `GET /v1/vms/{id}?wait=20`: one request that answers when the VM settles.
    LongPoll,
    /// `GET /v1/vms/{id}` every [`POLL`].
    Poll,
}

async fn wait(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    counts: &Counts,
    target: &str,
    follow: Follow,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let request = match follow {
            Follow::Poll => {
                tokio::time::sleep(POLL).await;
                http.get(url)
            }
            Follow::LongPoll => http.get(format!("{url}?wait=20")),
        };
        let r = request.bearer_auth(token).send().await.map_err(|e| e.to_string())?;
        counts.requests.fetch_add(1, Ordering::Relaxed);
        let vm: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
        if vm["state"] == target {
            return Ok(());
        }
        if vm["state"] == "error" || Instant::now() > deadline {
            return Err(format!("VM stuck: {vm}"));
        }
    }
}

async fn one(store: Store, clients: usize, measure: Duration, follow: Follow) -> Row {
    let (config, dir) = test_config(store);
    let svc = service::start(config).await.expect("gsaasd starts");
    let base = svc.url();
    let token = svc.app.keys.issue("alpha", Some("alpha"), Role::Member, Duration::from_secs(3600));
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients * 2).build().unwrap();
    let body = serde_json::json!({
        "name": "bench", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": 1, "gpu_memory_mib": 100, "mode": "shared"
    });
    let counts = Arc::new(Counts::default());
    let warmup = Duration::from_secs(2);
    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + measure;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, base, token, body, counts) =
            (http.clone(), base.clone(), token.clone(), body.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let req = |r: reqwest::RequestBuilder| r.bearer_auth(&token);
            while Instant::now() < window_end {
                let began = Instant::now();
                let ok: Result<(), String> = async {
                    let r = req(http.post(format!("{base}/v1/vms")).json(&body))
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    if r.status().as_u16() != 202 {
                        return Err(format!(
                            "launch {}: {}",
                            r.status(),
                            r.text().await.unwrap_or_default()
                        ));
                    }
                    let vm: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
                    let id = vm["id"].as_str().unwrap().to_owned();
                    let url = format!("{base}/v1/vms/{id}");
                    wait(&http, &url, &token, &counts, "ready", follow).await?;
                    let r = req(http.delete(&url)).send().await.map_err(|e| e.to_string())?;
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    if r.status().as_u16() != 202 {
                        return Err(format!("terminate {}", r.status()));
                    }
                    let _ = r.bytes().await;
                    wait(&http, &url, &token, &counts, "deleted", follow).await?;
                    Ok(())
                }
                .await;
                let done = Instant::now();
                match ok {
                    Ok(()) if done >= window_start && done < window_end => {
                        counts.cycles.fetch_add(1, Ordering::Relaxed);
                        lat.push(done.duration_since(began).as_secs_f64() * 1e3);
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if counts.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("cycle failed: {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            lat
        }));
    }
    // Server-side counters over the window.
    tokio::time::sleep_until(window_start.into()).await;
    let m = &svc.app.metrics;
    let (ready0, push0, req0) = (
        m.launches_ready.load(Ordering::Relaxed),
        m.route_pushes.load(Ordering::Relaxed),
        counts.requests.load(Ordering::Relaxed),
    );
    let cycles0 = counts.cycles.load(Ordering::Relaxed);
    tokio::time::sleep_until(window_end.into()).await;
    let (ready1, push1, req1) = (
        m.launches_ready.load(Ordering::Relaxed),
        m.route_pushes.load(Ordering::Relaxed),
        counts.requests.load(Ordering::Relaxed),
    );
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort_by(f64::total_cmp);
    let row = Row {
        store,
        clients,
        secs: measure.as_secs_f64(),
        cycles: counts.cycles.load(Ordering::Relaxed) - cycles0,
        requests: req1 - req0,
        errors: counts.errors.load(Ordering::Relaxed),
        follow,
        ready: ready1 - ready0,
        pushes: push1 - push0,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    };
    svc.abort();
    let _ = std::fs::remove_dir_all(&dir);
    row
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let secs: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(8);
    let concurrency: Vec<usize> = args
        .get(1)
        .map(|a| a.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![16, 64, 128, 256]);
    let stores = match args.get(2).map(String::as_str) {
        Some("sqlite") => vec![Store::Sqlite],
        Some("postgres") => vec![Store::Postgres],
        _ => vec![Store::Sqlite, Store::Postgres],
    };
    let follow = match args.get(3).map(String::as_str) {
        Some("poll") => Follow::Poll,
        _ => Follow::LongPoll,
    };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut rows = Vec::new();
    for &store in &stores {
        for &c in &concurrency {
            let row = rt.block_on(one(store, c, Duration::from_secs(secs), follow));
            eprintln!(
                "{:?} c={} cycles/s={:.0}",
                row.store,
                row.clients,
                row.cycles as f64 / row.secs
            );
            rows.push(row);
        }
    }
    println!("\n| store | clients | following | window | cycles | cycles/s | cycle p50 | cycle p99 | HTTP req/cycle | VMs ready/s (server) | route pushes/s | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {:?} | {} | {:?} | {:.0} s | {} | {:.0} | {:.1} ms | {:.1} ms | {:.1} | {:.0} | {:.0} | {} |",
            r.store,
            r.clients,
            r.follow,
            r.secs,
            r.cycles,
            r.cycles as f64 / r.secs,
            r.p50_ms,
            r.p99_ms,
            r.requests as f64 / r.cycles.max(1) as f64,
            r.ready as f64 / r.secs,
            r.pushes as f64 / r.secs,
            r.errors
        );
    }
    println!("\nOne process, one tokio runtime of 2 workers: server and clients share the machine's 2 cores. Poll interval (poll mode) {POLL:?}.");
}
