//! How far a VM's GPUs are from it under each policy, with and without asking for the network:
//! replays a synthetic trace on a 3-level fleet (zones of racks of switches) through the real
//! pool in virtual time and prints, per policy and network request, the mean and 95th
//! percentile round-trip time from each placed cGPU's VM host to its GPU host, the share of
//! requests placed, and the time per decision.
//!
//! The fleet: 2 zones x 4 racks x 4 switches; each switch has 2 compute-gpu hosts of 4 GPUs
//! (8 GiB) and 2 compute-rgpu hosts, where the VMs run (locality `remote`). Round trips follow
//! the topology (same host 0, same switch 50 us, same rack 150 us, same zone 500 us, across
//! zones 2 ms, each pair +-10% fixed jitter) and every VM host has measured every GPU host, as
//! the agents report. The cloud puts each VM on a host drawn uniformly from those the pool
//! allows (all compute-rgpu hosts without a network request), as Nova would among equals.
//!
//! The trace: Poisson arrivals, 1-4 shared cGPUs of one of the dissertation's Table 4.1
//! applications' memory, exponential run times; a request that does not fit is refused (no
//! queue, so every variant sees the same arrivals).
//!
//! `cargo run --release -p gpgpums --example network -- [--requests N] [--load L] [--seed S]`

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

mod trace;

use gpgpums::seeded::SplitMix64;
use gpgpums::{
    GpuId, GpuSpec, HostId, HostKind, Locality, NetworkConstraint, Pool, RcudaEndpoint, Request,
    Strength, Topology, VmId,
};
use trace::{args_or_exit, Args, APPS, POLICIES};

const ZONES: u32 = 2;
const RACKS_PER_ZONE: u32 = 4;
const SWITCHES_PER_RACK: u32 = 4;
const GPU_HOSTS_PER_SWITCH: u32 = 2;
const VM_HOSTS_PER_SWITCH: u32 = 2;
const GPUS_PER_HOST: u32 = 4;
const GPU_MIB: u64 = 8192;
const MEAN_RUN_S: f64 = 600.0;

struct Fleet {
    pool: Pool,
    gpu_hosts: Vec<HostId>,
    vm_hosts: Vec<HostId>,
}

/// The round trip between two hosts: the pool's nominal one for where they sit
/// ([`Pool::nominal_rtt_us`]: 50 µs on one switch, 150 in one rack, 500 in one zone, 2,000
/// beyond), with a fixed jitter per pair.
fn rtt_us(pool: &Pool, a: &HostId, b: &HostId, pair: u64) -> u32 {
    let base = f64::from(pool.nominal_rtt_us(a, b).expect("hosts with a topology"));
    let jitter = SplitMix64::new(pair).unit() * 0.2 - 0.1;
    (base * (1.0 + jitter)) as u32
}

fn fleet() -> Fleet {
    let mut pool = Pool::new();
    let (mut gpu_hosts, mut vm_hosts) = (Vec::new(), Vec::new());
    for switch in 0..ZONES * RACKS_PER_ZONE * SWITCHES_PER_RACK {
        let rack = switch / SWITCHES_PER_RACK;
        let zone = rack / RACKS_PER_ZONE;
        let topology: Topology = [
            ("zone".to_owned(), format!("z{zone}")),
            ("rack".to_owned(), format!("r{rack}")),
            ("switch".to_owned(), format!("s{switch}")),
        ]
        .into();
        for k in 0..GPU_HOSTS_PER_SWITCH {
            let id = HostId::new(format!("gpu-{switch}-{k}")).expect("a host name");
            pool.add_host(id.clone(), HostKind::ComputeGpu).expect("a new host");
            for index in 0..GPUS_PER_HOST {
                pool.add_gpu(GpuSpec {
                    id: GpuId::on_host(&id, index),
                    host: id.clone(),
                    index,
                    model: "Quadro M4000".into(),
                    memory_mib: GPU_MIB,
                    rcuda: RcudaEndpoint {
                        address: std::net::Ipv4Addr::new(10, 0, (switch % 256) as u8, k as u8)
                            .into(),
                        port: 8308,
                        gpu_number: index,
                    },
                    attributes: Default::default(),
                    partition: None,
                })
                .expect("a new GPU");
            }
            pool.set_host_topology(&id, topology.clone()).expect("a topology");
            gpu_hosts.push(id);
        }
        for k in 0..VM_HOSTS_PER_SWITCH {
            let id = HostId::new(format!("vm-{switch}-{k}")).expect("a host name");
            pool.add_host(id.clone(), HostKind::ComputeRgpu).expect("a new host");
            pool.set_host_topology(&id, topology.clone()).expect("a topology");
            vm_hosts.push(id);
        }
    }
    for (v, vm_host) in vm_hosts.iter().enumerate() {
        let measured: Vec<(HostId, u32)> = gpu_hosts
            .iter()
            .enumerate()
            .map(|(g, gpu_host)| {
                (gpu_host.clone(), rtt_us(&pool, vm_host, gpu_host, (v as u64) << 32 | g as u64))
            })
            .collect();
        pool.set_host_rtts(vm_host, measured).expect("a registered host");
    }
    Fleet { pool, gpu_hosts, vm_hosts }
}

struct Job {
    arrive_ms: u64,
    run_ms: u64,
    request: Request,
}

fn trace(args: &Args) -> Vec<Job> {
    let mut rng = SplitMix64::new(args.seed);
    let gpus = ZONES * RACKS_PER_ZONE * SWITCHES_PER_RACK * GPU_HOSTS_PER_SWITCH * GPUS_PER_HOST;
    let capacity = f64::from(gpus) * GPU_MIB as f64;
    let mean_mib = APPS.iter().map(|(_, mib)| *mib).sum::<u64>() as f64 / APPS.len() as f64;
    let rate_per_s = args.load * capacity / (MEAN_RUN_S * 2.5 * mean_mib);
    let mut now = 0.0;
    (0..args.requests)
        .map(|_| {
            now += -rng.unit().ln() / rate_per_s;
            let ncgpus = 1 + rng.below(4) as u32;
            let (_, mib) = APPS[rng.below(APPS.len() as u64) as usize];
            Job {
                arrive_ms: (now * 1000.0) as u64,
                run_ms: (-rng.unit().ln() * MEAN_RUN_S * 1000.0) as u64 + 1,
                request: Request::shared(ncgpus, mib).with_locality(Locality::Remote),
            }
        })
        .collect()
}

struct Outcome {
    rtts: Vec<u32>,
    placed: usize,
    decision_us: f64,
}

fn replay(jobs: &[Job], policy: &str, network: &NetworkConstraint, seed: u64) -> Outcome {
    let Fleet { mut pool, gpu_hosts, vm_hosts } = fleet();
    let place_of = |host: &HostId, list: &[HostId]| list.iter().position(|id| id == host);
    let mut rng = SplitMix64::new(seed);
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let (mut rtts, mut placed, mut spent) = (Vec::new(), 0, 0.0);
    for (j, job) in jobs.iter().enumerate() {
        while let Some(&Reverse((end, k))) = ends.peek() {
            if end > job.arrive_ms {
                break;
            }
            ends.pop();
            pool.release(&VmId::from_uuid(uuid::Uuid::from_u128(k as u128 + 1)));
        }
        let vm = VmId::from_uuid(uuid::Uuid::from_u128(j as u128 + 1));
        let request = job.request.clone().with_network(network.clone());
        let started = Instant::now();
        let Ok(placement) = pool.place(vm, &request, policy) else {
            spent += started.elapsed().as_secs_f64();
            continue;
        };
        let gpu_of: Vec<HostId> = placement.cgpus.iter().map(|c| c.host.clone()).collect();
        let allowed = pool.vm_hosts_for(&request, &gpu_of);
        spent += started.elapsed().as_secs_f64();
        let allowed = allowed.unwrap_or_else(|| vm_hosts.clone());
        assert!(!allowed.is_empty(), "a placement with nowhere to run its VM");
        let vm_host = &allowed[rng.below(allowed.len() as u64) as usize];
        let v = place_of(vm_host, &vm_hosts).expect("a VM host");
        for host in &gpu_of {
            let g = place_of(host, &gpu_hosts).expect("a GPU host");
            rtts.push(rtt_us(&pool, vm_host, host, (v as u64) << 32 | g as u64));
        }
        placed += 1;
        ends.push(Reverse((job.arrive_ms + job.run_ms, j)));
    }
    pool.audit().expect("a sound pool");
    Outcome { rtts, placed, decision_us: spent * 1e6 / jobs.len() as f64 }
}

fn main() {
    let args = args_or_exit(Args::new(20_000, 0.8, 42), false);
    let jobs = trace(&args);
    let variants: [(&str, NetworkConstraint); 5] = [
        ("none", NetworkConstraint::NONE),
        ("nearest", NetworkConstraint { nearest: true, ..NetworkConstraint::NONE }),
        (
            "same rack, preferred",
            NetworkConstraint {
                same: Some("rack".into()),
                strength: Strength::Preferred,
                ..NetworkConstraint::NONE
            },
        ),
        (
            "same switch, required",
            NetworkConstraint { same: Some("switch".into()), ..NetworkConstraint::NONE },
        ),
        (
            "round trip <= 200 us",
            NetworkConstraint { max_rtt_us: Some(200), ..NetworkConstraint::NONE },
        ),
    ];
    println!(
        "{} requests, load {}, seed {}: {} zones x {} racks x {} switches, {} GPU hosts of {} GPUs, {} VM hosts",
        args.requests,
        args.load,
        args.seed,
        ZONES,
        RACKS_PER_ZONE,
        SWITCHES_PER_RACK,
        ZONES * RACKS_PER_ZONE * SWITCHES_PER_RACK * GPU_HOSTS_PER_SWITCH,
        GPUS_PER_HOST,
        ZONES * RACKS_PER_ZONE * SWITCHES_PER_RACK * VM_HOSTS_PER_SWITCH,
    );
    println!(
        "| policy | network | mean RTT (us) | p95 RTT (us) | placed | us per decision |\n|---|---|---|---|---|---|"
    );
    for policy in POLICIES {
        for (name, network) in &variants {
            let mut outcome = replay(&jobs, policy, network, args.seed);
            outcome.rtts.sort_unstable();
            let n = outcome.rtts.len().max(1);
            let mean = outcome.rtts.iter().map(|&us| f64::from(us)).sum::<f64>() / n as f64;
            let p95 = outcome.rtts.get(n * 95 / 100).copied().unwrap_or(0);
            println!(
                "| {policy} | {name} | {mean:.0} | {p95} | {:.1}% | {:.1} |",
                100.0 * outcome.placed as f64 / jobs.len() as f64,
                outcome.decision_us
            );
        }
    }
}
