//! gsaasd at the scale of a real cloud: 100,000 GPUs (12,500 hosts of 8) with 1,000,000 cGPUs
//! booked (250,000 ready VMs of 4), on SQLite and on PostgreSQL (issue targets: RSS <= 2 GiB,
//! start to ready <= 10 s, launch p99 <= 5 ms, a page <= 50 ms).
//!
//! How it is seeded, per store:
//! 1. gsaasd starts on an empty database with the hosts as its inventory (in-process agents) and
//!    registers them the way it always does: a host row and 8 GPU rows each (timed: `register`).
//! 2. The simulated Nova (the embedded default's cloud, kept across the restart as a real Nova
//!    would be) creates one server per VM through its `Cloud` API, pinned to the VM's host.
//! 3. The VMs and cGPUs are written in bulk, multi-row `INSERT`s of 1,000 rows in transactions of
//!    50,000: VM `v` is ready on host `(4v mod G) / 8` (G GPUs) with its 4 shared cGPUs of 8 GiB on
//!    GPUs `4v .. 4v+3 (mod G)` of that host, so every 96 GiB GPU holds 10 cGPUs (80 GiB) and has
//!    room for more; VMs belong to 100 projects.
//! 4. On PostgreSQL, `VACUUM ANALYZE`: autovacuum would vacuum and analyze the freshly loaded
//!    tables within a minute, a core busy for seconds, in the middle of the measurements.
//!
//! Measured after a restart on that database, with the same cloud:
//! - start -> ready: from `service::start` to the end of the reconciler's first pass (the pool
//!   and quota ledger loaded from the database, each host's route table pushed to its agent, the
//!   cloud's full server listing followed), and the CPU seconds the process used meanwhile (every
//!   thread; PostgreSQL's own work is not in it): the work a start does, which the machine's
//!   neighbours disturb less than its wall-clock time.
//! - RSS: the process's resident memory when ready, and that minus the RSS before the restart
//!   (the bench process also holds the simulated Nova's servers and the seeding's leftovers).
//! - launch and terminate: one client (on a thread and runtime of its own, as another process
//!   would be), sequential HTTP requests over one connection; a launch (2
//!   shared cGPUs of 8 GiB) timed from its `POST /v1/vms` to the 202 (the reservation), then each
//!   terminated, `DELETE` to 202. p50 and p99 over the runs.
//! - pages: `GET /v1/vms?limit=100` as an admin (every project's VMs) and as a member (one
//!   project's), `GET /v1/pool` as an admin (the first page: 100 hosts, 800 GPUs with holders),
//!   and the tenth page of each by its `next` link. p50 and p99.
//! - the database's size: SQLite's files, or `pg_database_size`.
//!
//! Run: `cargo bench -p gsaasd --bench scale` (args: `-- [hosts] [sqlite|postgres|both] [runs]
//! [pace_ms]`; 12500 hosts, both stores, 1000 runs, launches back to back by default (`pace_ms`:
//! one launch every so many milliseconds instead); the PostgreSQL store starts a throwaway server
//! as the tests do, so run as root).
//!
//! `GSAAS_SCALE_FLEET=mixed`: a fleet of 8 models ([`common::mixed_inventory`]: racks, NVLink,
//! compute capabilities), the launching project with limits on two models, and launches that
//! cycle through [`MIXED_LAUNCHES`]' constraints (by model, by trait required, forbidden or
//! preferred, by compute capability, and none).
#![allow(clippy::print_stdout)]

use gsaas_test_support as support;

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{host_name, percentile};
use gpgpums::{GpuId, HostId, VmId};
use gsaasd::auth::Role;
use gsaasd::cloud::sim::SimCloud;
use gsaasd::cloud::{Cloud, HostConstraint, ServerSpec, VmRequest};
use gsaasd::config::{CloudConfig, Config};
use gsaasd::db::{Backend, Db};
use gsaasd::service::{self, Service};
use support::Store;

const GPUS_PER_HOST: usize = 8;
const CGPUS_PER_VM: usize = 4;
const GPU_MIB: u64 = 98_304;
const CGPU_MIB: u64 = 8_192;
const PROJECTS: usize = 100;

/// What the mixed fleet's launches ask of their GPUs, in turn.
const MIXED_LAUNCHES: [&str; 7] = [
    r#"{}"#,
    r#"{"gpu_model": "A100"}"#,
    r#"{"gpu_model": ["H100", "H200"]}"#,
    r#"{"traits": {"required": ["CUSTOM_NVLINK"]}}"#,
    r#"{"traits": {"forbidden": ["CUSTOM_RACK_R3"]}}"#,
    r#"{"traits": {"preferred": ["CUSTOM_RACK_R1"]}}"#,
    r#"{"min_compute_capability": "8.9"}"#,
];

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

async fn start(config: &Config, sim: &Arc<SimCloud>) -> Service {
    let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
    service::start_with_sim(config.clone(), listener, Some(sim.clone()))
        .await
        .expect("gsaasd starts")
}

/// Every VM's server in the simulated Nova: (server id, host, fixed IP, tap).
async fn create_servers(
    sim: &SimCloud,
    vms: &[(VmId, usize)],
) -> Vec<(String, String, String, String)> {
    let mut servers = Vec::with_capacity(vms.len());
    // A thousand at a time, as many clients would.
    for chunk in vms.chunks(1_000) {
        servers.extend(
            support::join_all(chunk.iter().map(|(vm, host)| create_server(sim, *vm, *host))).await,
        );
    }
    servers
}

async fn create_server(sim: &SimCloud, vm: VmId, host: usize) -> (String, String, String, String) {
    let spec = ServerSpec {
        vm,
        request: VmRequest {
            name: format!("vm-{vm}"),
            image: "cirros-0.6.2".into(),
            flavor: "m1.small".into(),
            networks: vec![],
        },
        user_data: Vec::new(),
        host: HostConstraint::Pinned(HostId::new(host_name(host)).unwrap()),
        tenant: None,
        checked: None,
        first_attempt: false,
    };
    let id = sim.create_server(&spec).await.expect("the simulated Nova creates the server");
    let info = sim.wait_active(&id, Duration::from_secs(60)).await.expect("active");
    (
        id.0.clone(),
        info.host.expect("scheduled").to_string(),
        info.fixed_ip.expect("an address").to_string(),
        info.tap.expect("a tap"),
    )
}

/// Writes the VMs and their cGPUs (see the module docs) in bulk.
async fn seed_vms(
    db: &Db,
    config: &Config,
    vms: &[(VmId, usize)],
    servers: &[(String, String, String, String)],
    gpus: usize,
) {
    let request = serde_json::json!({
        "vm": { "name": "seeded", "image": "cirros-0.6.2", "flavor": "m1.small", "networks": [] },
        "gpus": { "ncgpus": CGPUS_PER_VM, "gpu_memory_mib": CGPU_MIB, "mode": "shared",
                  "locality": "any", "distinct_gpus": false },
        "priority": 0, "preemptible": false, "give_back": true
    })
    .to_string();
    let masked = config.masking.address.to_string();
    let base_port = config.masking.base_port as usize;
    let now = gsaasd::db::now_ms() - 86_400_000;
    for (chunk_no, chunk) in vms.chunks(50_000).enumerate() {
        let mut tx = db.begin().await.unwrap();
        for (rows_no, rows) in chunk.chunks(1_000).enumerate() {
            let first = chunk_no * 50_000 + rows_no * 1_000;
            let mut vm_values = Vec::with_capacity(rows.len());
            let mut cgpu_values = Vec::with_capacity(rows.len() * CGPUS_PER_VM);
            for (i, (vm, _)) in rows.iter().enumerate() {
                let v = first + i;
                let (server, host, ip, tap) = &servers[v];
                let project = format!("p{:03}", v % PROJECTS);
                vm_values.push(format!(
                    "('{vm}', '{project}', '{project}', 'vm-{v}', '{request}', '{policy}', 'ready', \
                     'done', '{server}', '{host}', '{ip}', '{tap}', 1, '{{}}', {created}, {created})",
                    created = now + v as i64,
                    policy = gpgpums::DEFAULT_POLICY,
                ));
                for k in 0..CGPUS_PER_VM {
                    let g = (CGPUS_PER_VM * v + k) % gpus;
                    let gpu = GpuId::on_host(
                        &HostId::new(host_name(g / GPUS_PER_HOST)).unwrap(),
                        (g % GPUS_PER_HOST) as u32,
                    );
                    cgpu_values.push(format!(
                        "('{vm}', {k}, '{gpu}', {CGPU_MIB}, 'shared', '{masked}', {port}, {k}, 'live')",
                        port = base_port + k,
                    ));
                }
            }
            sqlx::query(&format!(
                "INSERT INTO vms (id, project, owner, name, request, policy, state, step, server_id, \
                 host, fixed_ip, tap, routes_on, timings, created_ms, updated_ms) VALUES {}",
                vm_values.join(", ")
            ))
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query(&format!(
                "INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, \
                 seq, state) VALUES {}",
                cgpu_values.join(", ")
            ))
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        // The pool's generation moves with every change of bookings.
        gsaasd::db::bump_generation(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
    }
    // As if each host's agent had applied its table once: agents that restarted empty (the
    // in-process ones) get theirs again in the reconciler's first pass.
    sqlx::query("UPDATE hosts SET routes_generation = 1, applied_generation = 1")
        .execute(&mut *db.conn().await.unwrap())
        .await
        .unwrap();
}

async fn database_mib(db: &Db, config: &Config) -> f64 {
    match db.backend() {
        Backend::Sqlite => {
            let file = config.data_dir.join("gsaas.sqlite");
            let size = |suffix: &str| {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                std::fs::metadata(path).map_or(0, |m| m.len())
            };
            (size("") + size("-wal")) as f64 / (1024.0 * 1024.0)
        }
        Backend::Postgres => {
            let row = sqlx::query("SELECT pg_database_size(current_database())")
                .fetch_one(&mut *db.conn().await.unwrap())
                .await
                .unwrap();
            sqlx::Row::get::<i64, _>(&row, 0) as f64 / (1024.0 * 1024.0)
        }
    }
}

/// Runs the bench's HTTP client on a thread and runtime of its own, as a client in another
/// process would be: as a task of gsaasd's runtime, each response would wait for a worker behind
/// gsaasd's background work (the sagas of the launches before, the agents' pushes), and that
/// wait would be timed as gsaasd's.
async fn as_client<T, F>(work: impl FnOnce(reqwest::Client) -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    let client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(work(reqwest::Client::new()))
    });
    tokio::task::spawn_blocking(move || client.join().expect("the client thread")).await.unwrap()
}

/// p50 and p99 in milliseconds.
fn p50_p99(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.50) * 1e3, percentile(&samples, 0.99) * 1e3)
}

/// `runs` timings of GET `first`, and of the deepest page up to the tenth by following `next`
/// from it (and which page that was).
async fn pages(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    first: &str,
    runs: usize,
) -> ((f64, f64), (usize, f64)) {
    let get = |path: String| {
        let request = http.get(format!("{url}{path}")).bearer_auth(token);
        async move {
            let started = Instant::now();
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let body: serde_json::Value = response.json().await.unwrap();
            (started.elapsed().as_secs_f64(), body)
        }
    };
    let mut samples = Vec::new();
    for _ in 0..runs {
        samples.push(get(first.to_owned()).await.0);
    }
    let (mut path, mut deepest) = (Some(first.to_owned()), (0, 0.0));
    while let Some(page) = path.take().filter(|_| deepest.0 < 10) {
        let (took, body) = get(page).await;
        deepest = (deepest.0 + 1, took * 1e3);
        path = body["next"].as_str().map(str::to_owned);
    }
    (p50_p99(samples), deepest)
}

async fn run(store: Store, hosts: usize, runs: usize, pace: Duration) {
    let gpus = hosts * GPUS_PER_HOST;
    let vm_count = gpus * 10 / CGPUS_PER_VM;
    let (mut config, dir) = support::test_config(store);
    let mixed = std::env::var("GSAAS_SCALE_FLEET").is_ok_and(|f| f == "mixed");
    config.inventory = match mixed {
        true => common::mixed_inventory(hosts, GPUS_PER_HOST, GPU_MIB),
        false => common::inventory(hosts, GPUS_PER_HOST, GPU_MIB),
    };
    // The reconciler's first pass is the one measured; later passes wait.
    config.hosts.reconcile_interval_secs = 3600;
    let CloudConfig::Sim { sim: sim_config } = &mut config.cloud else { unreachable!() };
    sim_config.fixed_ip_range = "10.64.0.0/12".parse().unwrap();
    sim_config.creation_delay_ms = 0;
    sim_config.activation_delay_ms = 0;
    sim_config.deployment_delay_ms = 0;
    sim_config.deletion_delay_ms = 0;
    let sim = Arc::new(SimCloud::new(sim_config.clone(), vec![]));

    let started = Instant::now();
    let first = start(&config, &sim).await;
    let register = started.elapsed();
    first.abort();

    let started = Instant::now();
    let vms: Vec<(VmId, usize)> = (0..vm_count)
        .map(|v| (VmId::new_random(), (CGPUS_PER_VM * v % gpus) / GPUS_PER_HOST))
        .collect();
    let servers = create_servers(&sim, &vms).await;
    let db = Db::connect(&config.database_url()).await.unwrap();
    seed_vms(&db, &config, &vms, &servers, gpus).await;
    if db.backend() == Backend::Postgres {
        // What autovacuum does after a bulk load, done now rather than during the measurements.
        sqlx::query("VACUUM ANALYZE").execute(&mut *db.conn().await.unwrap()).await.unwrap();
    }
    let seeding = started.elapsed();
    drop(servers);

    let before = rss_mib();
    eprintln!("restarting gsaasd on the seeded database");
    let (started, cpu_before) = (Instant::now(), common::process_cpu_seconds());
    let service = start(&config, &sim).await;
    let serving = started.elapsed();
    let app = service.app.clone();
    while app.reconciler_status().passes == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ready = started.elapsed();
    let ready_cpu = common::process_cpu_seconds() - cpu_before;
    let rss = rss_mib();
    let status = app.reconciler_status();
    assert!(status.last_error.is_none(), "first pass: {:?}", status.last_error);

    let url = service.url();
    let member = app.keys.issue("p007", Some("p007"), Role::Member, Duration::from_secs(3600));
    let admin = app.keys.issue("ops", Some("ops"), Role::Admin, Duration::from_secs(3600));
    let launch = serde_json::json!({
        "image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 2,
        "gpu_memory_mib": CGPU_MIB, "mode": "shared"
    });
    // Limits on two models, far above what the runs book: checked, never refusing.
    let limits = mixed.then(|| {
        serde_json::json!({"models": {
            "A100": {"cgpus": 1_000_000}, "H100": {"memory_mib": 1u64 << 40}
        }})
    });
    let bodies: Vec<serde_json::Value> = match mixed {
        false => vec![launch],
        true => (MIXED_LAUNCHES.iter())
            .map(|extra| {
                let mut body = launch.clone();
                let extra: serde_json::Value = serde_json::from_str(extra).unwrap();
                body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                body
            })
            .collect(),
    };
    let (launches, terminations, admin_vms, member_vms, pool) = as_client(move |http| async move {
        if let Some(limits) = &limits {
            let put = http.put(format!("{url}/v1/quotas/p007")).bearer_auth(&admin).json(limits);
            assert_eq!(put.send().await.unwrap().status(), 200);
        }
        let (mut launches, mut terminations, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        let mut due = tokio::time::Instant::now();
        for run in 0..runs {
            tokio::time::sleep_until(due).await;
            due += pace;
            let launch = &bodies[run % bodies.len()];
            let started = Instant::now();
            let response =
                http.post(format!("{url}/v1/vms")).bearer_auth(&member).json(launch).send().await;
            let response = response.unwrap();
            launches.push(started.elapsed().as_secs_f64());
            assert_eq!(response.status(), 202);
            let vm: serde_json::Value = response.json().await.unwrap();
            ids.push(vm["id"].as_str().unwrap().to_owned());
        }
        for id in &ids {
            let started = Instant::now();
            let response = http
                .delete(format!("{url}/v1/vms/{id}"))
                .bearer_auth(&member)
                .send()
                .await
                .unwrap();
            terminations.push(started.elapsed().as_secs_f64());
            assert_eq!(response.status(), 202);
        }
        let page_runs = runs.min(200);
        let admin_vms = pages(&http, &url, &admin, "/v1/vms?limit=100", page_runs).await;
        let member_vms = pages(&http, &url, &member, "/v1/vms?limit=100", page_runs).await;
        let pool = pages(&http, &url, &admin, "/v1/pool", page_runs).await;
        (launches, terminations, admin_vms, member_vms, pool)
    })
    .await;
    let size = database_mib(&db, &config).await;
    let rss_after = rss_mib();
    let (launch50, launch99) = p50_p99(launches);
    let (term50, term99) = p50_p99(terminations);

    let fleet = if mixed { "a mixed fleet of 8 models, constrained launches" } else { "one model" };
    println!(
        "\n{store:?}: {hosts} hosts, {gpus} GPUs, {vm_count} VMs, {} cGPUs booked ({fleet})",
        vm_count * CGPUS_PER_VM
    );
    println!(
        "  seeding: register {:.1} s (gsaasd), servers + bulk rows {:.1} s",
        register.as_secs_f64(),
        seeding.as_secs_f64()
    );
    println!(
        "  start -> ready {:.2} s, {ready_cpu:.2} CPU-s (serving after {:.2} s; first pass: {} tables pushed)",
        ready.as_secs_f64(),
        serving.as_secs_f64(),
        status.tables_pushed
    );
    println!(
        "  RSS when ready {rss:.0} MiB ({:.0} MiB more than before the restart); after the runs {rss_after:.0} MiB",
        rss - before
    );
    let paced = match pace.as_secs_f64() * 1e3 {
        0.0 => "back to back".to_owned(),
        ms => format!("one every {ms} ms"),
    };
    println!(
        "  launch (POST -> 202) p50 {launch50:.2} ms, p99 {launch99:.2} ms ({runs} runs, {paced})"
    );
    println!("  terminate (DELETE -> 202) p50 {term50:.2} ms, p99 {term99:.2} ms");
    for (what, ((p50, p99), (depth, deepest))) in [
        ("GET /v1/vms?limit=100 (admin)", admin_vms),
        ("GET /v1/vms?limit=100 (member)", member_vms),
        ("GET /v1/pool (admin, 100 hosts)", pool),
    ] {
        println!("  {what}: p50 {p50:.1} ms, p99 {p99:.1} ms; page {depth}: {deepest:.1} ms");
    }
    println!("  database {size:.0} MiB");
    service.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    // RUST_LOG=gsaasd=debug shows where each reconciler pass spends its time.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let hosts: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(12_500);
    let stores = match args.get(1).map(String::as_str) {
        Some("sqlite") => vec![Store::Sqlite],
        Some("postgres") => vec![Store::Postgres],
        _ => vec![Store::Sqlite, Store::Postgres],
    };
    let runs: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let pace = Duration::from_millis(args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for store in stores {
        runtime.block_on(run(store, hosts, runs, pace));
    }
}
