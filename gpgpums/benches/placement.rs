//! Decision time per request for every policy on pools of 1k, 6,212 (the openb trace's), 10k and
//! 100k GPUs, 70% of whose memory is already booked in fragments, beside the paper's baseline
//! (sort the whole pool per request). The bookings make `frag-gradient`'s mix: cGPUs of 2-16 GiB
//! on GPUs of 16-80 GiB and whole GPUs, 13 kinds by percent of their GPU, of which it weighs the 8
//! most common.
//!
//! One request is one single-cGPU shared VM (4 GiB) placed and then released, so the pool stays at 70%
//! and the time includes the release. Run: `cargo bench -p gpgpums --bench placement`, then
//! `python3 scripts/criterion-summary.py` for the table in BENCHMARKS.md.
//!
//! The group `constrained` does the same on a mixed fleet ([`mixed_gpu`]: 8 models, 20 traits)
//! with requests that cycle through [`constraints`]: none, by model, by trait required, forbidden,
//! preferred or avoided, by compute capability. `constrained_cycling` cycles through all 255 sets
//! of its models instead, as a tenant trying to make the pool build an index per request would.
//!
//! The group `local` places `local` VMs that take 4 cores and 16 GiB of their host, on a pool
//! whose hosts offer 64 cores and 512 GiB and whose bookings are local VMs of 2-16 cores: where
//! `frag-gradient` compares up to 8 hosts by the GPU their CPU would strand.

use std::hint::black_box;
use std::time::Duration;

mod common;

use common::{add_gpu_host, add_gpu_host_of, Rng};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpgpums::{
    CgpuAssignment, GpuAttributes, GpuConstraints, HostId, HostKind, Locality, MajorMinor, Mode,
    Placement, PolicyRegistry, Pool, Request, Resources, Selector, VmHost, VmId,
};
use uuid::Uuid;

const POLICIES: [&str; 7] = [
    "first-fit",
    "least-load-fit",
    "best-fit",
    "fewer-jobs-gpu",
    "fewer-jobs-node",
    "fewer-jobs-node+best-fit",
    "frag-gradient",
];
const GPUS_PER_HOST: usize = 8;
const GPU_SIZES_MIB: [u64; 4] = [16384, 24576, 40960, 81920];
const CGPU_SIZES_MIB: [u64; 4] = [2048, 4096, 8192, 16384];

const MODELS: [(&str, u16); 8] = [
    ("T4", 75),
    ("A10", 86),
    ("L4", 89),
    ("L40S", 89),
    ("A100", 80),
    ("H100", 90),
    ("H200", 90),
    ("B200", 100),
];
const RACKS: u32 = 10;

/// Host `h`'s GPUs on a mixed fleet: each host one model, in one of 10 racks
/// (`CUSTOM_RACK_R<n>`), 9 other custom traits in a pattern by host, NVLink on one host in
/// three: 20 traits in all, besides the compute capability's.
fn mixed_gpu(h: usize) -> (String, GpuAttributes) {
    let (model, cc) = MODELS[h % MODELS.len()];
    let mut traits = vec![format!("CUSTOM_RACK_R{}", h as u32 % RACKS)];
    if h.is_multiple_of(3) {
        traits.push("CUSTOM_NVLINK".to_owned());
    }
    traits.push(format!("CUSTOM_FEATURE_{}", h / 7 % 9));
    let attributes = GpuAttributes {
        compute_capability: Some(MajorMinor::new(cc / 10, cc % 10)),
        traits: traits.into_iter().collect(),
        ..GpuAttributes::default()
    };
    (model.to_owned(), attributes)
}

/// What the `constrained` group's requests ask, in turn.
fn constraints() -> Vec<GpuConstraints> {
    let traits = |t: &[&str]| t.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
    vec![
        GpuConstraints::default(),
        GpuConstraints { models: traits(&["A100"]), ..Default::default() },
        GpuConstraints { models: traits(&["H100", "H200"]), ..Default::default() },
        GpuConstraints { required: traits(&["CUSTOM_NVLINK"]), ..Default::default() },
        GpuConstraints { forbidden: traits(&["CUSTOM_RACK_R3"]), ..Default::default() },
        GpuConstraints { preferred: traits(&["CUSTOM_RACK_R1"]), ..Default::default() },
        GpuConstraints {
            min_compute_capability: Some(MajorMinor::new(8, 9)),
            avoid: traits(&["CUSTOM_NVLINK"]),
            ..Default::default()
        },
        GpuConstraints {
            models: traits(&["L40S"]),
            required: traits(&["CUSTOM_FEATURE_2"]),
            ..Default::default()
        },
    ]
}

/// A pool of `gpus` GPUs with 70% of the memory booked by VMs of 1 to 4 cGPUs on random GPUs
/// (2% of the bookings exclusive); of one model, or `mixed` (see [`mixed_gpu`]).
/// What a host offers local VMs in the group `local`.
const HOST_OFFERS: Resources = Resources { cpu_milli: 160_000, memory_mib: 1024 * 1024 };

/// A pool of `gpus` GPUs, 70% of their memory booked; `local`: every host offers
/// [`HOST_OFFERS`] and the bookings are local VMs with their CPU and memory.
fn fragmented_pool(gpus: usize, selector: Selector, mixed: bool, local: bool) -> Pool {
    let mut rng = Rng(0x5EED_0000 + gpus as u64);
    let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
    let mut specs = Vec::with_capacity(gpus);
    for h in 0..gpus.div_ceil(GPUS_PER_HOST) {
        let sizes: Vec<u64> = (0..GPUS_PER_HOST.min(gpus - h * GPUS_PER_HOST))
            .map(|_| GPU_SIZES_MIB[rng.below(GPU_SIZES_MIB.len())])
            .collect();
        if mixed {
            let (model, attributes) = mixed_gpu(h);
            let gpus: Vec<_> =
                sizes.iter().map(|&mib| (mib, model.clone(), attributes.clone())).collect();
            specs.extend(add_gpu_host_of(&mut pool, h as u32, &gpus));
        } else {
            specs.extend(add_gpu_host(&mut pool, h as u32, &sizes));
        }
    }
    pool.add_host(HostId::new("rg0").unwrap(), HostKind::ComputeRgpu).unwrap();
    if local {
        for spec in specs.iter().filter(|s| s.index == 0) {
            pool.set_host_resources(&spec.host, Some(HOST_OFFERS)).unwrap();
        }
    }
    let total: u64 = specs.iter().map(|s| s.memory_mib).sum();
    let target = total * 7 / 10;
    let mut booked = 0u64;
    let mut vm = 0u128;
    let mut misses = 0;
    while booked < target && misses < 1000 {
        vm += 1;
        let mut cgpus = Vec::new();
        let first = rng.below(specs.len());
        for index in 0..1 + rng.below(4) as u32 {
            let spec = match local {
                // Any GPU of the first one's host.
                true => {
                    let at = first - specs[first].index as usize + rng.below(GPUS_PER_HOST);
                    specs.get(at).filter(|s| s.host == specs[first].host).unwrap_or(&specs[first])
                }
                false => &specs[rng.below(specs.len())],
            };
            let exclusive = rng.below(50) == 0;
            cgpus.push(CgpuAssignment {
                index,
                gpu: spec.id.clone(),
                host: spec.host.clone(),
                memory_mib: if exclusive {
                    spec.memory_mib
                } else {
                    CGPU_SIZES_MIB[rng.below(CGPU_SIZES_MIB.len())]
                },
                mode: if exclusive { Mode::Exclusive } else { Mode::Shared },
                compute_percent: None,
                rcuda: spec.rcuda,
            });
        }
        let memory: u64 = cgpus.iter().map(|c| c.memory_mib).sum();
        let vm_resources = local.then(|| {
            let cores = 2 + rng.below(15) as u64;
            Resources::new(cores * 1000, cores * 4096)
        });
        let vm_host = match local {
            true => VmHost::Pinned(cgpus[0].host.clone()),
            false => VmHost::AnyAgentHost,
        };
        if vm_resources.is_some_and(|need| {
            let (_, taken) = pool.host_resources(&cgpus[0].host).expect("registered");
            !HOST_OFFERS.has_room(&taken, &need)
        }) {
            misses += 1;
            continue;
        }
        let placement = Placement {
            vm: VmId::from_uuid(Uuid::from_u128(vm)),
            policy: "restored".into(),
            vm_host,
            cgpus,
            vm_resources,
        };
        match pool.restore(placement) {
            Ok(()) => {
                booked += memory;
                misses = 0;
            }
            Err(_) => misses += 1,
        }
    }
    pool
}

fn place_and_release(c: &mut Criterion, group_name: &str, selector: Selector, sizes: &[usize]) {
    let mut group = c.benchmark_group(group_name);
    if selector != Selector::Indexed {
        group.sample_size(10);
    }
    let request = Request::shared(1, 4096);
    for &gpus in sizes {
        for policy in POLICIES {
            let pool = fragmented_pool(gpus, selector, false, false);
            bench_one(&mut group, pool, &request, policy, gpus);
        }
    }
    group.finish();
}

/// One benchmark: `request` placed under `policy` on `pool` (of `gpus` GPUs) and released, then
/// the pool's bookkeeping checked.
fn bench_one(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    mut pool: Pool,
    request: &Request,
    policy: &str,
    gpus: usize,
) {
    let mut next_vm = u128::MAX / 2;
    group.bench_with_input(BenchmarkId::new(policy, gpus), &gpus, |b, _| {
        b.iter(|| {
            next_vm += 1;
            let vm = VmId::from_uuid(Uuid::from_u128(next_vm));
            let placement = pool.place(vm, request, policy).expect("the pool has room");
            black_box(&placement);
            pool.release(&vm);
        })
    });
    pool.audit().expect("bookkeeping intact after the benchmark");
}

/// [`place_and_release`] on a mixed fleet, the requests cycling through [`constraints`].
fn place_and_release_constrained(c: &mut Criterion, sizes: &[usize]) {
    let requests: Vec<Request> = constraints()
        .into_iter()
        .map(|constraints| Request::shared(1, 4096).with_constraints(constraints))
        .collect();
    place_and_release_cycling(c, "constrained", &requests, sizes, &POLICIES);
}

/// A tenant cycling through every set of the mixed fleet's models (255 of 8), one request each,
/// as an attacker would to make the pool build an index per request.
fn place_and_release_model_sets(c: &mut Criterion, sizes: &[usize]) {
    let requests: Vec<Request> = (1u32..256)
        .map(|set| {
            let models = (0..MODELS.len()).filter(|b| set & (1 << b) != 0);
            let models = models.map(|b| MODELS[b].0.to_owned()).collect();
            let constraints = GpuConstraints { models, ..GpuConstraints::default() };
            Request::shared(1, 4096).with_constraints(constraints)
        })
        .collect();
    let policies = ["first-fit", "least-load-fit"];
    place_and_release_cycling(c, "constrained_cycling", &requests, sizes, &policies);
}

/// [`place_and_release`] on a mixed fleet, each request the next of `requests`.
fn place_and_release_cycling(
    c: &mut Criterion,
    group_name: &str,
    requests: &[Request],
    sizes: &[usize],
    policies: &[&str],
) {
    let mut group = c.benchmark_group(group_name);
    for &gpus in sizes {
        for &policy in policies {
            let mut pool = fragmented_pool(gpus, Selector::Indexed, true, false);
            let mut next_vm = u128::MAX / 2;
            group.bench_with_input(BenchmarkId::new(policy, gpus), &gpus, |b, _| {
                b.iter(|| {
                    next_vm += 1;
                    let request = &requests[next_vm as usize % requests.len()];
                    let vm = VmId::from_uuid(Uuid::from_u128(next_vm));
                    let placement = pool.place(vm, request, policy).expect("the pool has room");
                    black_box(&placement);
                    pool.release(&vm);
                })
            });
            pool.audit().expect("bookkeeping intact after the benchmark");
        }
    }
    group.finish();
}

/// Local VMs of 4 cores and 16 GiB (see the module docs), for the policy that weighs stranding
/// and for best fit, which does not.
fn place_and_release_local(c: &mut Criterion, sizes: &[usize]) {
    let mut group = c.benchmark_group("local");
    let request = Request::shared(1, 4096)
        .with_locality(Locality::Local)
        .with_vm_resources(Resources::new(4000, 16 * 1024));
    for &gpus in sizes {
        for policy in ["best-fit", "frag-gradient"] {
            let pool = fragmented_pool(gpus, Selector::Indexed, false, true);
            bench_one(&mut group, pool, &request, policy, gpus);
        }
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let sizes = [1_000, 10_000, 100_000];
    place_and_release(c, "indexed", Selector::Indexed, &[1_000, 6_212, 10_000, 100_000]);
    place_and_release_constrained(c, &sizes);
    place_and_release_model_sets(c, &sizes[1..]);
    place_and_release_local(c, &[6_212, 100_000]);
    place_and_release(c, "paper_sort_each_request", Selector::SortEachRequest, &sizes);
}

criterion_group! {
    name = placement;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = benches
}
criterion_main!(placement);
