//! Launch + terminate cycles per second through the HTTP API (issue target: >= 2,000/s on SQLite,
//! >= 1,000/s on PostgreSQL on the 2-core project machine).
//!
//! gsaasd runs in this process (`service::start`: the simulated cloud at zero delay, in-process
//! agents on the dissertation's testbed of 1 compute-GPU host with 4 x 8 GiB GPUs and 3 compute-rGPU
//! hosts). C client tasks each repeat one *cycle*, each over its own HTTP/1.1 keep-alive
//! connection:
//!
//!   POST /v1/vms (1 shared cGPU of 100 MiB) -> 202
//!   -> GET /v1/vms/{id}?wait=20 until `ready` (long-poll; or every POLL without `wait`)
//!   -> DELETE /v1/vms/{id} -> 202
//!   -> GET /v1/vms/{id}?wait=20 until `deleted`.
//!
//! Cycles/s = cycles completed inside the measured window / window. The client and the server
//! share the same runtime and the same 2 cores, so the client's cost (HTTP, JSON, polling) is in
//! the figure. The client is a load generator's, lean as `wrk`'s or `oha`'s: a bare hyper
//! connection per client and typed parsing of the two fields it reads (`id`, `state`). Through
//! reqwest (URL parsing, a pooled client cloned per request, redirect and retry layers, a whole
//! JSON tree per answer) it took about a fifth of the machine's CPU. Server-side, the bench also
//! counts VMs that reached `ready` (`launches_ready`) and the route pushes, to show what the
//! server did in the window.
//!
//! Run: `cargo bench -p gsaasd --bench cycles` (args: `-- [secs] [concurrency,...] [sqlite|postgres|both] [long-poll|poll]`).
#![allow(clippy::print_stdout)]

use gsaas_test_support as support;

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use common::percentile;
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

/// How a client follows a VM to its next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// `GET /v1/vms/{id}?wait=20`: one request that answers when the VM settles.
    LongPoll,
    /// `GET /v1/vms/{id}` every [`POLL`].
    Poll,
}

/// The fields of a VM answer that a client acts on.
#[derive(Deserialize)]
struct VmAnswer {
    id: String,
    state: String,
}

/// One client: a keep-alive HTTP/1.1 connection and its requests.
struct Client {
    send: SendRequest<Full<Bytes>>,
    authorization: HeaderValue,
    host: HeaderValue,
    counts: Arc<Counts>,
}

impl Client {
    async fn connect(addr: SocketAddr, token: &str, counts: Arc<Counts>) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect to gsaasd");
        stream.set_nodelay(true).unwrap();
        let (send, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        Client {
            send,
            authorization: HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            host: HeaderValue::from_str(&addr.to_string()).unwrap(),
            counts,
        }
    }

    /// Sends a request; answers the status and the body.
    async fn request(
        &mut self,
        method: Method,
        uri: &str,
        body: Option<&Bytes>,
    ) -> Result<(u16, Bytes), String> {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, self.host.clone())
            .header(header::AUTHORIZATION, self.authorization.clone());
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body.cloned().unwrap_or_default())).unwrap();
        self.send.ready().await.map_err(|e| e.to_string())?;
        let response = self.send.send_request(request).await.map_err(|e| e.to_string())?;
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }

    /// Follows the VM at `uri` until it is in `target`.
    async fn wait(&mut self, uri: &str, target: &str, follow: Follow) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let long_poll = format!("{uri}?wait=20");
        loop {
            let uri = match follow {
                Follow::Poll => {
                    tokio::time::sleep(POLL).await;
                    uri
                }
                Follow::LongPoll => &long_poll,
            };
            let (status, body) = self.request(Method::GET, uri, None).await?;
            let vm: VmAnswer = serde_json::from_slice(&body)
                .map_err(|e| format!("GET {status}: {e}: {}", String::from_utf8_lossy(&body)))?;
            if vm.state == target {
                return Ok(());
            }
            if vm.state == "error" || Instant::now() > deadline {
                return Err(format!("VM stuck: {}", String::from_utf8_lossy(&body)));
            }
        }
    }

    /// One launch + terminate cycle.
    async fn cycle(&mut self, launch: &Bytes, follow: Follow) -> Result<(), String> {
        let (status, body) = self.request(Method::POST, "/v1/vms", Some(launch)).await?;
        if status != 202 {
            return Err(format!("launch {status}: {}", String::from_utf8_lossy(&body)));
        }
        let vm: VmAnswer = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let uri = format!("/v1/vms/{}", vm.id);
        self.wait(&uri, "ready", follow).await?;
        let (status, _) = self.request(Method::DELETE, &uri, None).await?;
        if status != 202 {
            return Err(format!("terminate {status}"));
        }
        self.wait(&uri, "deleted", follow).await
    }
}

async fn one(store: Store, clients: usize, measure: Duration, follow: Follow) -> Row {
    let (config, dir) = test_config(store);
    let svc = service::start(config).await.expect("gsaasd starts");
    let addr: SocketAddr = svc.url().trim_start_matches("http://").parse().expect("gsaasd address");
    let token = svc.app.keys.issue("alpha", Some("alpha"), Role::Member, Duration::from_secs(3600));
    let launch = Bytes::from(
        serde_json::json!({
            "name": "bench", "image": "cirros-0.6.2", "flavor": "m1.small",
            "ncgpus": 1, "gpu_memory_mib": 100, "mode": "shared"
        })
        .to_string(),
    );
    let counts = Arc::new(Counts::default());
    let warmup = Duration::from_secs(2);
    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + measure;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (token, launch, counts) = (token.clone(), launch.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr, &token, counts.clone()).await;
            let mut lat = Vec::new();
            while Instant::now() < window_end {
                let began = Instant::now();
                let ok = client.cycle(&launch, follow).await;
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
                        if client.send.is_closed() {
                            client = Client::connect(addr, &token, counts.clone()).await;
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
    // RUST_LOG=sqlx::query=debug lists every statement (to count them per cycle).
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
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
