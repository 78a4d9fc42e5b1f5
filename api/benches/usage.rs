//! Usage reports at a cloud's scale (issue [6/6]: a month's report for 10,000 projects over
//! 1,000,000 cGPU lifetimes in <= 1 s, one project's in <= 50 ms), on SQLite and PostgreSQL.
//!
//! Seeded straight into the usage tables (the triggers' tables: what a month of launches,
//! attaches, detaches and terminations leaves), in multi-row inserts: 1,000,000 cGPU spans of
//! 500,000 VMs (2 cGPUs each) in 10,000 projects, on 4 GPU models, one in five exclusive; they
//! start from two days before the month to its end and last 10 minutes to 5 days, so many cross
//! the period's edges, and one in twenty still counts. Before them, 200,000 spans of the month
//! before (history a report must skip). On PostgreSQL, `VACUUM ANALYZE` after seeding, as
//! autovacuum would.
//!
//! Measured through gsaasd's HTTP API as an admin and as a tenant (one client, one connection,
//! sequential), each `runs` times, p50 and p99:
//! - `GET /v1/usage?start=&end=` for the month: every project's report (JSON);
//! - the same as CSV;
//! - `GET /v1/usage/{project}` for the month: one project's, with its VMs' lines;
//! - `/metrics` before the reconciler's roll-up (every ended span read), the roll-up itself (as
//!   after a month with no pass), one with nothing to roll up, and `/metrics` after.
//!
//! Run: `cargo bench -p gsaasd --bench usage` (args: `-- [sqlite|postgres|both] [runs]`; both
//! stores, 5 runs by default; the PostgreSQL store starts a throwaway server as the tests do, so
//! run as root).
#![allow(clippy::print_stdout)]

use gsaas_test_support as support;

mod common;

use std::time::{Duration, Instant};

use common::percentile;
use gsaasd::auth::Role;
use gsaasd::db::{Backend, Db};
use support::{Store, TestService};

const PROJECTS: usize = 10_000;
const SPANS: usize = 1_000_000;
const HISTORY: usize = 200_000;
const MODELS: [&str; 4] =
    ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "Tesla V100"];
const DAY_MS: i64 = 86_400_000;
/// The month reported: 2026-10-01 to 2026-10-31 (UTC).
const MONTH_START_MS: i64 = 1_790_812_800_000;
const MONTH_MS: i64 = 31 * DAY_MS;

/// A small deterministic mix (SplitMix64).
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Span `i`'s row values: (project, vm, idx, model, mode, memory, start, end).
fn span(i: usize, history: bool) -> String {
    let h = mix(i as u64 + if history { 1 << 40 } else { 0 });
    let project = format!("p{:05}", i % PROJECTS);
    let vm = format!("vm-{}{}", if history { "h" } else { "" }, i / 2);
    let model = MODELS[(h % 4) as usize];
    let exclusive = (h >> 8).is_multiple_of(5);
    let (mode, memory) = if exclusive { ("exclusive", 81_920) } else { ("shared", 8_192) };
    let base = if history { MONTH_START_MS - MONTH_MS } else { MONTH_START_MS - 2 * DAY_MS };
    let span_of = if history { MONTH_MS } else { MONTH_MS + 2 * DAY_MS };
    let start = base + ((h >> 16) % span_of as u64) as i64;
    let length = 600_000 + ((h >> 24) % (5 * DAY_MS as u64)) as i64;
    let end = if !history && (h >> 40).is_multiple_of(20) {
        "NULL".to_owned()
    } else {
        (start + length).to_string()
    };
    format!(
        "('{project}', '{vm}', {idx}, 'gpu-{g}', '{model}', '{mode}', {memory}, {start}, {end})",
        idx = i % 2,
        g = h % 1000
    )
}

async fn seed(db: &Db) -> Duration {
    let started = Instant::now();
    for (history, count) in [(true, HISTORY), (false, SPANS)] {
        for chunk in (0..count).collect::<Vec<_>>().chunks(50_000) {
            let mut tx = db.begin().await.unwrap();
            for rows in chunk.chunks(1_000) {
                let values: Vec<String> = rows.iter().map(|&i| span(i, history)).collect();
                sqlx::query(&format!(
                    "INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, \
                     start_ms, end_ms) VALUES {}",
                    values.join(", ")
                ))
                .execute(&mut *tx)
                .await
                .unwrap();
                // Each VM's own span: from its first cGPU's start to its last's end.
                let vms: Vec<String> = rows
                    .iter()
                    .filter(|&&i| i % 2 == 0)
                    .map(|&i| {
                        let h = mix(i as u64 + if history { 1 << 40 } else { 0 });
                        let base = if history {
                            MONTH_START_MS - MONTH_MS
                        } else {
                            MONTH_START_MS - 2 * DAY_MS
                        };
                        let span_of = if history { MONTH_MS } else { MONTH_MS + 2 * DAY_MS };
                        let start = base + ((h >> 16) % span_of as u64) as i64;
                        format!(
                            "('p{:05}', 'vm-{}{}', 'train-{}', {start}, {})",
                            i % PROJECTS,
                            if history { "h" } else { "" },
                            i / 2,
                            i / 2,
                            start + 5 * DAY_MS
                        )
                    })
                    .collect();
                sqlx::query(&format!(
                    "INSERT INTO vm_usage (project, vm, name, start_ms, end_ms) VALUES {}",
                    vms.join(", ")
                ))
                .execute(&mut *tx)
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
    if db.backend() == Backend::Postgres {
        let mut conn = db.conn().await.unwrap();
        sqlx::query("VACUUM ANALYZE").execute(&mut *conn).await.unwrap();
    }
    started.elapsed()
}

/// `runs` GETs of `path`, each timed to its whole body: p50, p99 (ms) and the body's size.
async fn timed(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    accept: &str,
    runs: usize,
) -> (f64, f64, usize) {
    let mut times = Vec::with_capacity(runs);
    let mut size = 0;
    for _ in 0..runs {
        let started = Instant::now();
        let response =
            http.get(url).bearer_auth(token).header("accept", accept).send().await.unwrap();
        assert_eq!(response.status(), 200, "{url}");
        size = response.bytes().await.unwrap().len();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    (percentile(&times, 0.5), percentile(&times, 0.99), size)
}

async fn run(store: Store, runs: usize) {
    let t = TestService::start(store).await;
    let db = t.service().app.db.clone();
    let seeded = seed(&db).await;
    println!("{store:?}: seeded {SPANS} spans of the month and {HISTORY} before in {seeded:.1?}");
    let (admin, tenant) = (t.admin(), t.token("p04242", Role::Member));
    let http = reqwest::Client::new();
    let month = "start=2026-10-01&end=2026-11-01";

    let url = t.url(&format!("/v1/usage?{month}"));
    let (p50, p99, size) = timed(&http, &url, &admin, "application/json", runs).await;
    println!(
        "{store:?}: month, every project (JSON): p50 {p50:.0} ms, p99 {p99:.0} ms, {} KiB",
        size / 1024
    );
    let (p50, p99, size) = timed(&http, &url, &admin, "text/csv", runs).await;
    println!(
        "{store:?}: month, every project (CSV): p50 {p50:.0} ms, p99 {p99:.0} ms, {} KiB",
        size / 1024
    );
    let url = t.url(&format!("/v1/usage/p04242?{month}"));
    let (p50, p99, size) = timed(&http, &url, &tenant, "application/json", runs * 20).await;
    println!(
        "{store:?}: month, one project with its VMs: p50 {p50:.1} ms, p99 {p99:.1} ms, {size} B"
    );
    let url = t.url(&format!("/v1/usage?{month}&step=86400"));
    let (p50, p99, _) = timed(&http, &url, &tenant, "application/json", runs * 20).await;
    println!("{store:?}: month, one project, a series by day: p50 {p50:.1} ms, p99 {p99:.1} ms");

    let url = t.url("/metrics");
    let (before, _, _) = timed(&http, &url, &admin, "text/plain", 1).await;
    let started = Instant::now();
    let rolled = db.roll_up_usage().await.unwrap();
    let roll_up = started.elapsed();
    let (p50, p99, size) = timed(&http, &url, &admin, "text/plain", runs).await;
    let started = Instant::now();
    db.roll_up_usage().await.unwrap();
    let idle = started.elapsed();
    println!(
        "{store:?}: /metrics with no span rolled up {before:.0} ms; the roll-up of {rolled} \
         spans {roll_up:.1?} (one with nothing to roll {idle:.1?}); then p50 {p50:.0} ms, \
         p99 {p99:.0} ms, {} KiB",
        size / 1024
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let stores = match args.first().map(String::as_str) {
        Some("sqlite") => vec![Store::Sqlite],
        Some("postgres") => vec![Store::Postgres],
        _ => vec![Store::Sqlite, Store::Postgres],
    };
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for store in stores {
        runtime.block_on(run(store, runs));
    }
}
