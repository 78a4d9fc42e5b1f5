//! The dissertation's Table 5.5 on a real Nova: the boot time of one VM with 0, 25, 50 and 75 cGPUs,
//! split into Equation 5.1's stages, against the OpenStack of `scripts/openstack-dev.sh` (Keystone,
//! Placement, Glance, Nova 34 with the fake virt driver; Neutron is a stand-in).
//!
//! gsaasd runs in this process as in the e2e test (`gsaas-test-support`'s `openstack` module):
//! Keystone mode, the Nova backend as the service user, in-process agents on the paper's testbed
//! (gpu-host-1: 4 x Quadro M4000 of 8 GiB; rgpu-host-1). Each run: project alpha's member POSTs a VM (the paper's
//! flavor is 1 vCPU / 768 MB; here `gsaas.tiny`, which the fake driver does not boot anyway) of N
//! shared cGPUs of 100 MiB, locality local (in gpu-host-1's availability zone), polls it every 20
//! ms until `ready`, reads gsaasd's `timings`, terminates it and waits for `deleted`. gsaasd polls
//! Nova and Neutron every 20 ms too.
//!
//! The 0 column is a VM without GSaaS (gsaasd refuses 0 cGPUs), booted as a tenant's plain
//! `openstack server create --wait` would and as gsaasd boots its VMs: flavor and image lookups and
//! `POST /servers` as tenant alpha, in gpu-host-1's availability zone (creation); then, as admin
//! (a tenant does not see the host), poll the server every 20 ms until ACTIVE with its host, then
//! its port (activation); poll until the port is ACTIVE (deployment). (Until 2026-11-25 the 0
//! column booted as admin, pinned with `host`: Nova's compute builds an admin's server 15-25 ms
//! faster than a tenant's, which the comparison then charged to GSaaS.)
//!
//! Boot time = `timings.total` (request received -> VM ready). GSaaS management = GPU selection +
//! RODVR configuration; it runs beside VM deployment, so it adds to the boot time only where it is
//! longer. Overhead = boot time against the 0 column's, of the means (with two standard errors of
//! the difference) and of the medians. CPU per boot = this process's user + system time over one
//! run (boot, termination, and both sides' polls), in ticks of 10 ms; and, summed over the runs,
//! what each thread used (by name: `gsaasd-worker`, SQLite's `sqlx-sqlite-worker`s, the
//! `gsaasd-writer` lane, the client's main thread), from the scheduler's nanoseconds.
//!
//! Run: `scripts/openstack-dev.sh start` (prints the clouds.yaml path), then
//! `GSAAS_OPENSTACK_CLOUDS=<that path> cargo bench -p gsaasd --bench table55`
//! (args: `-- [runs] [sizes,...] [poll|wait]`, default `20 0,25,50,75 poll`; one warm-up run per
//! size is dropped). `wait`: the client follows its VM with the API's long poll
//! (`GET /v1/vms/{id}?wait=60`, answered when the VM settles) instead of polling every 20 ms;
//! the plain boot polls Nova as before.
#![allow(clippy::print_stdout)]

use gsaas_test_support as support;

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use support::openstack::{client, inventory, Admin, Gsaasd, Login, FLAVOR, GPU_HOST, IMAGE};

const POLL: Duration = Duration::from_millis(20);
const STAGES: [&str; 7] = [
    "check",
    "vm_creation",
    "vm_activation",
    "vm_deployment",
    "gpu_selection",
    "rodvr_configuration",
    "total",
];

/// One boot: (stage, seconds) for each stage measured.
type Run = Vec<(&'static str, f64)>;

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn stdev(xs: &[f64]) -> f64 {
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len().max(2) - 1) as f64).sqrt()
}

/// A VM without cGPUs, straight through Nova, as the tenant would boot it and as gsaasd does for
/// it: the stages gsaasd measures, in seconds.
async fn plain_boot(admin: &Admin, tenant: &Admin, image: &str) -> Run {
    let nova = tenant.login.endpoint("compute");
    let glance = tenant.login.endpoint("image");
    let started = Instant::now();
    let (status, flavor) =
        tenant.call(Method::GET, &format!("{nova}/flavors/{FLAVOR}"), None).await;
    assert_eq!(status, 200, "{flavor}");
    let (status, found) =
        tenant.call(Method::GET, &format!("{glance}/v2/images?name={image}"), None).await;
    assert_eq!(status, 200, "{found}");
    let image_id = found["images"][0]["id"].as_str().expect("the image").to_owned();
    // A tenant may not name a host: its server goes to the GPU host's zone, as gsaasd's do.
    let body = json!({ "server": {
        "name": "table55-plain", "imageRef": image_id, "flavorRef": flavor["flavor"]["id"],
        "networks": "none", "availability_zone": format!("gsaas-{GPU_HOST}"),
    }});
    let (status, created) =
        tenant.call(Method::POST, &format!("{nova}/servers"), Some(&body)).await;
    assert_eq!(status, 202, "{created}");
    let id = created["server"]["id"].as_str().expect("a server id").to_owned();
    let creation = started.elapsed().as_secs_f64();
    let nova = admin.login.endpoint("compute");

    let activating = Instant::now();
    loop {
        let (status, server) = admin.server(&id).await;
        assert_eq!(status, 200, "{server}");
        assert_ne!(server["status"], "ERROR", "{server}");
        if server["status"] == "ACTIVE" && server["OS-EXT-SRV-ATTR:host"].is_string() {
            break;
        }
        assert!(activating.elapsed() < Duration::from_secs(60), "not ACTIVE: {server}");
        tokio::time::sleep(POLL).await;
    }
    let ports = admin.ports(&id).await;
    assert!(!ports.is_empty(), "the server has no port");
    let activation = activating.elapsed().as_secs_f64();

    let deploying = Instant::now();
    loop {
        let (status, server) = admin.server(&id).await;
        assert_eq!((status, &server["status"]), (200, &json!("ACTIVE")), "{server}");
        if admin.ports(&id).await.iter().all(|p| p["status"] == "ACTIVE") {
            break;
        }
        assert!(deploying.elapsed() < Duration::from_secs(60), "port never ACTIVE");
        tokio::time::sleep(POLL).await;
    }
    let deployment = deploying.elapsed().as_secs_f64();
    let total = started.elapsed().as_secs_f64();

    let (status, body) = admin.call(Method::DELETE, &format!("{nova}/servers/{id}"), None).await;
    assert_eq!(status, 204, "{body}");
    let deleting = Instant::now();
    while admin.server(&id).await.0 != 404 {
        assert!(deleting.elapsed() < Duration::from_secs(60), "server {id} not deleted");
        tokio::time::sleep(POLL).await;
    }
    vec![
        ("vm_creation", creation),
        ("vm_activation", activation),
        ("vm_deployment", deployment),
        ("total", total),
    ]
}

/// How the client follows its VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// `GET /v1/vms/{id}` every 20 ms.
    Poll,
    /// `GET /v1/vms/{id}?wait=60`.
    Wait,
}

/// One VM of `n` cGPUs through gsaasd: its `timings`.
async fn gsaas_boot(gsaasd: &Gsaasd, token: &str, n: u32, follow: Follow) -> Run {
    let body = json!({
        "name": format!("table55-{n}"), "image": IMAGE, "flavor": FLAVOR, "ncgpus": n,
        "gpu_memory_mib": 100, "mode": "shared", "locality": "local",
    });
    let id = gsaasd.launch(token, &body).await;
    let until = |states: &'static [&'static str]| {
        let id = id.clone();
        async move {
            match follow {
                Follow::Poll => gsaasd.until(&id, token, states).await,
                Follow::Wait => gsaasd.until_settled(&id, token, states).await,
            }
        }
    };
    let vm = until(&["ready", "error"]).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    let timings = &vm["timings"];
    let stages = STAGES
        .iter()
        .map(|&stage| (stage, timings[stage].as_f64().unwrap_or_else(|| panic!("{stage}: {vm}"))))
        .collect();
    let (status, answer) = gsaasd.call(Method::DELETE, &format!("/v1/vms/{id}"), token, None).await;
    assert_eq!(status, 202, "{answer}");
    let vm = until(&["deleted", "error"]).await;
    assert_eq!(vm["state"], "deleted", "{vm}");
    stages
}

/// (this process's, the client's) CPU so far, in seconds: the client runs on the main thread
/// alone, so its share is the calling thread's.
fn own_cpu_seconds() -> (f64, f64) {
    (common::process_cpu_seconds(), common::cpu_seconds("/proc/thread-self/stat"))
}

fn value(run: &Run, stage: &str) -> Option<f64> {
    run.iter().find(|(s, _)| *s == stage).map(|(_, v)| *v)
}

async fn bench(gsaasd: &Gsaasd, runs: usize, sizes: &[u32], follow: Follow) {
    let admin = Admin::new().await;
    let alpha = Login::new(&client(), "alpha").await;
    let tenant = Admin { http: client(), login: Login::new(&client(), "alpha").await };

    // Sizes are interleaved run by run, so that drift of the shared machine (and of Nova's own
    // periodic work) spreads over every column instead of biasing one.
    let mut table: Vec<(u32, Vec<Run>)> = sizes.iter().map(|&n| (n, Vec::new())).collect();
    // This process's CPU per boot and the client's share of it, in ms, by size (as `table`).
    let mut cpu: Vec<Vec<(f64, f64)>> = vec![Vec::new(); sizes.len()];
    // What each of the process's threads (by name) used over the measured runs, by size.
    let mut threads: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); sizes.len()];
    for i in 0..=runs {
        for (((n, samples), cpu), threads) in table.iter_mut().zip(&mut cpu).zip(&mut threads) {
            let n = *n;
            let cpu_before = own_cpu_seconds();
            let threads_before = common::threads_cpu_seconds();
            let run = if n == 0 {
                plain_boot(&admin, &tenant, IMAGE).await
            } else {
                gsaas_boot(gsaasd, &alpha.token, n, follow).await
            };
            // Run 0 of each size warms up (connections, caches) and is dropped.
            if i > 0 {
                let total = value(&run, "total").unwrap_or(f64::NAN);
                let (process, client) = own_cpu_seconds();
                let used = ((process - cpu_before.0) * 1e3, (client - cpu_before.1) * 1e3);
                eprintln!(
                    "run {i}, {n} cGPUs: boot time {total:.4} s, this process's CPU {:.0} ms \
                     (the client's {:.0} ms)",
                    used.0, used.1
                );
                cpu.push(used);
                samples.push(run);
                for (name, s) in common::threads_cpu_since(&threads_before) {
                    *threads.entry(name).or_default() += s;
                }
            }
        }
    }

    println!(
        "\nTable 5.5 on Nova 34 (fake driver), mean of {runs} runs, seconds (sd in brackets); \
         the client follows its VM by {}\n",
        match follow {
            Follow::Poll => "polling every 20 ms",
            Follow::Wait => "long poll (?wait=60)",
        }
    );
    let header: Vec<String> = sizes.iter().map(|n| format!("{n} cGPUs")).collect();
    println!("| stage | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(sizes.len()));
    let row = |label: &str, pick: &dyn Fn(&Run) -> Option<f64>| {
        let cells: Vec<String> = table
            .iter()
            .map(|(_, samples)| {
                let xs: Vec<f64> = samples.iter().filter_map(pick).collect();
                if xs.is_empty() {
                    "-".to_owned()
                } else {
                    // Sub-millisecond stages (GPU selection) keep their digits.
                    let digits = if mean(&xs) < 0.001 { 6 } else { 4 };
                    format!("{:.digits$} ({:.digits$})", mean(&xs), stdev(&xs))
                }
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    for stage in STAGES {
        row(stage, &|r| value(r, stage));
    }
    row("GSaaS management (gpu_selection + rodvr_configuration)", &|r| {
        Some(value(r, "gpu_selection")? + value(r, "rodvr_configuration")?)
    });
    let totals = |samples: &[Run]| -> Vec<f64> {
        let mut xs: Vec<f64> = samples.iter().filter_map(|r| value(r, "total")).collect();
        xs.sort_by(f64::total_cmp);
        xs
    };
    let median = |xs: &[f64]| xs[xs.len() / 2];
    let cells: Vec<String> =
        table.iter().map(|(_, samples)| format!("{:.4}", median(&totals(samples)))).collect();
    println!("| total, median | {} |", cells.join(" | "));
    // The process's CPU per boot (gsaasd and the bench's client; ticks of 10 ms), and gsaasd's
    // alone (all but the client's thread).
    for (label, pick) in [
        (
            "this process's CPU per boot, ms: median (mean)",
            &(|(p, _): (f64, f64)| p) as &dyn Fn(_) -> f64,
        ),
        ("of which gsaasd's (all but the client's thread)", &|(p, c): (f64, f64)| p - c),
    ] {
        let cells: Vec<String> = cpu
            .iter()
            .map(|runs| {
                let mut xs: Vec<f64> = runs.iter().copied().map(pick).collect();
                xs.sort_by(f64::total_cmp);
                format!("{:.0} ({:.0})", median(&xs), mean(&xs))
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    }
    // Where the CPU went, by thread (the scheduler's nanoseconds; threads that ended in a run
    // are missing).
    for ((n, _), used) in table.iter().zip(&threads) {
        println!(
            "{n} cGPUs, CPU per boot by thread, ms: {}",
            common::threads_cpu_line(used, runs as f64)
        );
    }
    let Some((_, base)) = table.iter().find(|(n, _)| *n == 0) else { return };
    let base = totals(base);
    // The standard error of a mean of these samples.
    let error = |xs: &[f64]| stdev(xs) / (xs.len() as f64).sqrt();
    for (label, pick) in [("mean", &mean as &dyn Fn(&[f64]) -> f64), ("median", &median)] {
        let cells: Vec<String> = table
            .iter()
            .map(|(_, samples)| {
                let ours = totals(samples);
                let (mine, theirs) = (pick(&ours), pick(&base));
                let difference = format!(
                    "{:+.1}% ({:+.0} ms",
                    (mine / theirs - 1.0) * 100.0,
                    (mine - theirs) * 1e3
                );
                if label == "mean" {
                    // Two standard errors of the difference of two independent means.
                    let two = 2.0 * error(&ours).hypot(error(&base)) * 1e3;
                    format!("{difference}, 2 SE {two:.0} ms)")
                } else {
                    format!("{difference})")
                }
            })
            .collect();
        println!("| boot time vs 0 cGPUs, {label} | {} |", cells.join(" | "));
    }
    let cells: Vec<String> =
        table.iter().map(|(_, samples)| format!("{:.1}", error(&totals(samples)) * 1e3)).collect();
    println!("| total, standard error of the mean, ms | {} |", cells.join(" | "));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runs: usize = args.first().map(|a| a.parse().expect("runs: a number")).unwrap_or(20);
    let sizes: Vec<u32> = args
        .get(1)
        .map(|a| a.split(',').map(|n| n.parse().expect("sizes: numbers")).collect())
        .unwrap_or_else(|| vec![0, 25, 50, 75]);
    let follow = match args.get(2).map_or("poll", String::as_str) {
        "poll" => Follow::Poll,
        "wait" => Follow::Wait,
        other => panic!("{other}: poll or wait"),
    };
    assert!(runs > 0, "runs must be at least 1");
    // gsaasd on a runtime of its own, as in its binary; the bench's client on the main thread
    // alone, so that the CPU of each is known.
    let server = common::gsaasd_runtime();
    let gsaasd = server.block_on(Gsaasd::start_polling(inventory(4), POLL.as_millis() as u64));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bench(&gsaasd, runs, &sizes, follow));
    let _in_server = server.enter();
    drop(gsaasd);
}
