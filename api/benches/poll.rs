//! What one poll of a VM costs: the CPU of `GET /v1/vms/{id}` for a ready VM of N cGPUs, served
//! and read back in this process (gsaasd on SQLite or PostgreSQL, the simulated cloud, the
//! paper's testbed; the client reads only the answer's `state`, as the Table 5.5 bench's does).
//!
//! Table 5.5's client polls its VM every 20 ms through a boot, so a boot's CPU is mostly polls;
//! this measures them without a dev OpenStack, and without its noise: CPU time (user + system,
//! from `/proc/self/stat`, ticks of 10 ms) over many polls in a row, and the wall time of each.
//!
//! Run: `cargo bench -p gsaasd --bench poll` (args: `-- [polls] [sizes,...] [sqlite|postgres|both]
//! [interval ms]`, default `2000 1,75 sqlite 0`). With an interval the client sleeps that long
//! between polls, as Table 5.5's does (20): then every poll also wakes the threads it passes
//! through from sleep. gsaasd runs on a runtime of its own (threads `gsaasd-worker`), the client
//! on the main thread, and each figure is also split by thread (the scheduler's nanoseconds), so
//! what a poll costs gsaasd is told apart from what it costs the client.
#![allow(clippy::print_stdout)]

use gsaas_test_support as support;

mod common;

use std::time::{Duration, Instant};

use support::{shared_launch, Store, TestService};

#[derive(serde::Deserialize)]
struct Polled<'a> {
    #[serde(borrow)]
    state: std::borrow::Cow<'a, str>,
}

async fn measure(
    service: &TestService,
    store: Store,
    polls: usize,
    ncgpus: u32,
    interval: Duration,
) {
    let token = service.member();
    let id = service.launch(&token, &shared_launch(ncgpus, 100)).await;
    service.wait_state(&token, &id, "ready").await;
    // What the process spends with nothing asked of it (timers, background work).
    let cpu = common::process_cpu_seconds();
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("{store:?} idle: CPU {:>6.1} ms/s", (common::process_cpu_seconds() - cpu) / 3.0 * 1e3);
    // The floor: a request that reads nothing (no token, no database).
    let healthz = service.url("/healthz");
    let cpu = common::process_cpu_seconds();
    let threads = common::threads_cpu_seconds();
    for _ in 0..polls {
        let response = service.http.get(&healthz).send().await.expect("polled");
        assert_eq!(response.status(), 200);
        response.bytes().await.expect("an answer");
        if !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
    }
    println!(
        "{store:?} GET /healthz, every {interval:?}: CPU {:>6.1} us/request",
        (common::process_cpu_seconds() - cpu) / polls as f64 * 1e6
    );
    println!(
        "  by thread, ms per 1,000 requests: {}",
        common::threads_cpu_line(&common::threads_cpu_since(&threads), polls as f64 / 1e3)
    );
    let url = service.url(&format!("/v1/vms/{id}"));
    let mut walls = Vec::with_capacity(polls);
    let mut bytes = 0;
    let cpu = common::process_cpu_seconds();
    let threads = common::threads_cpu_seconds();
    let started = Instant::now();
    for _ in 0..polls {
        let t = Instant::now();
        let response = service.http.get(&url).bearer_auth(&token).send().await.expect("polled");
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.expect("an answer");
        let polled: Polled<'_> = serde_json::from_slice(&body).expect("a VM");
        assert_eq!(polled.state, "ready");
        bytes = body.len();
        walls.push(t.elapsed().as_secs_f64());
        if !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = common::process_cpu_seconds() - cpu;
    walls.sort_by(f64::total_cmp);
    println!(
        "{store:?} {ncgpus:>3} cGPUs ({bytes:>6} B), every {interval:?}: CPU {:>6.1} us/poll, \
         wall p50 {:>6.1} us, p99 {:>6.1} us, {:>7.0} polls/s",
        cpu / polls as f64 * 1e6,
        common::percentile(&walls, 0.5) * 1e6,
        common::percentile(&walls, 0.99) * 1e6,
        polls as f64 / wall,
    );
    println!(
        "  by thread, ms per 1,000 polls: {}",
        common::threads_cpu_line(&common::threads_cpu_since(&threads), polls as f64 / 1e3)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let polls = args.first().map_or(2000, |a| a.parse().expect("polls"));
    let sizes: Vec<u32> = args
        .get(1)
        .map_or("1,75", String::as_str)
        .split(',')
        .map(|s| s.parse().expect("a size"))
        .collect();
    let stores = match args.get(2).map_or("sqlite", String::as_str) {
        "sqlite" => vec![Store::Sqlite],
        "postgres" => vec![Store::Postgres],
        "both" => vec![Store::Sqlite, Store::Postgres],
        other => panic!("store {other}: sqlite, postgres or both"),
    };
    let interval =
        Duration::from_millis(args.get(3).map_or(0, |a| a.parse().expect("interval ms")));
    // gsaasd on a runtime of its own, as in its binary (named, so that its threads' CPU is told
    // apart); the client on the main thread alone, as Table 5.5's.
    let server = common::gsaasd_runtime();
    let client =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    for store in stores {
        for &ncgpus in &sizes {
            let service = server.block_on(TestService::start(store));
            client.block_on(measure(&service, store, polls, ncgpus, interval));
            let _in_server = server.enter();
            drop(service);
        }
    }
}
