//! Properties over random pools and random sequences of placements, releases and host changes, for
//! every policy: capacity is never exceeded, exclusive GPUs are never shared, placement is all-or-nothing,
//! release restores, results are deterministic, and the indexed pool decides exactly as the reference
//! scan and the paper's sort-per-request do. Pools mix GPU kinds (models, traits, compute
//! capabilities) and requests constrain them: a hard constraint is never broken, and the indexed
//! pool's subsets decide as the scan does. GPUs are partitioned as the runs go (MIG instances,
//! some while their parent is booked whole): a GPU and its partitions are never both booked, a
//! partitioned GPU takes no cGPU whole, and a tainted parent's partitions take none. Hosts sit in
//! racks and zones with measured round trips between some of them, and requests ask for the
//! network: a required group or round-trip limit is never broken, and some host may run the VM.

mod common;

use common::{gpu_spec, host};
use gpgpums::{
    Error, GpuAttributes, GpuConstraints, GpuKind, GpuSpec, HostId, HostKind, HostState, Locality,
    MajorMinor, Mode, NetworkConstraint, Placement, PolicyRegistry, Pool, Remoting, Request,
    Resources, Selector, Strength, Topology, VmId,
};
use proptest::prelude::*;
use uuid::Uuid;

#[derive(Debug, Clone)]
struct PoolShape {
    /// Each GPU's memory and variant (see [`variant_spec`]).
    gpu_hosts: Vec<Vec<(u64, u8)>>,
    rgpu_hosts: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Place {
        vm: u8,
        request: Request,
        policy: usize,
    },
    /// Place and release at once: the pool must be exactly as before.
    Probe {
        request: Request,
        policy: usize,
    },
    Release {
        vm: u8,
    },
    SetState {
        host: usize,
        state: HostState,
    },
    /// Taint (`schedulable: false`) or untaint GPU `index` of a GPU host, if it has one.
    Taint {
        host: usize,
        index: u32,
        schedulable: bool,
    },
    /// A new GPU on an existing compute-gpu host: appended to the pool order or inserted inside it.
    AddGpu {
        host: usize,
        memory_mib: u64,
        variant: u8,
    },
    /// Partitions GPU `index` of a GPU host into `parts` equal partitions, if it is a whole GPU
    /// without partitions: whatever it holds.
    Partition {
        host: usize,
        index: u32,
        parts: u8,
        variant: u8,
    },
}

fn policies() -> Vec<String> {
    PolicyRegistry::builtin().known_names()
}

const MODELS: [&str; 3] = ["T4", "A100", "H100"];
const TRAITS: [&str; 3] = ["CUSTOM_A", "CUSTOM_B", "CUSTOM_C"];

/// A GPU of one of 12 variants: its model, compute capability and custom traits follow the bits.
fn variant_spec(host: &HostId, index: u32, memory_mib: u64, variant: u8) -> GpuSpec {
    // 12 kinds in each layer: a GPU that differs from the one before in its layer alone is
    // another kind.
    let remoting = if variant >= 12 { Remoting::Lupine } else { Remoting::Rcuda };
    let variant = variant % 12;
    let model = MODELS[usize::from(variant % 3)];
    let traits = TRAITS.iter().enumerate().filter(|(i, _)| (variant >> 1) & (1 << i) != 0);
    GpuSpec {
        model: model.into(),
        attributes: GpuAttributes {
            compute_capability: Some(MajorMinor::new(7 + u16::from(variant % 3), 0)),
            traits: traits.map(|(_, t)| (*t).to_owned()).collect(),
            // A pool that mixes layers: a request's layer is a hard constraint like a model.
            remoting,
            // And hosts whose even GPUs run under MPS: they alone take compute shares.
            managed: true,
            mps: index.is_multiple_of(2),
            ..GpuAttributes::default()
        },
        ..gpu_spec(host, index, memory_mib)
    }
}

fn shape() -> impl Strategy<Value = PoolShape> {
    let sizes = prop::sample::select(vec![1024u64, 2048, 4096, 6000, 8192, 16384]);
    let gpu = (sizes, 0u8..24);
    (prop::collection::vec(prop::collection::vec(gpu, 1..5), 1..5), 0usize..3)
        .prop_map(|(gpu_hosts, rgpu_hosts)| PoolShape { gpu_hosts, rgpu_hosts })
}

fn traits() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop::sample::select(TRAITS.to_vec()), 0..2)
        .prop_map(|t| t.into_iter().map(str::to_owned).collect())
}

/// Constraints over [`variant_spec`]'s GPUs: none half the time.
fn constraints() -> impl Strategy<Value = GpuConstraints> {
    let models = prop::collection::vec(prop::sample::select(MODELS.to_vec()), 0..3);
    let capability = prop_oneof![Just(None), (7u16..10).prop_map(|m| Some(MajorMinor::new(m, 0)))];
    let remoting =
        prop_oneof![Just(None), Just(Some(Remoting::Rcuda)), Just(Some(Remoting::Lupine))];
    let some = (models, traits(), traits(), traits(), traits(), capability, remoting).prop_map(
        |(models, required, forbidden, preferred, avoid, min_compute_capability, remoting)| {
            GpuConstraints {
                remoting,
                models: models.into_iter().map(str::to_owned).collect(),
                required,
                forbidden,
                preferred,
                avoid,
                min_compute_capability,
                min_cuda_version: None,
                compute_share: false,
            }
        },
    );
    prop_oneof![Just(GpuConstraints::default()), some]
}

/// Network constraints over [`topology`] and [`rtt`]: none half the time.
fn network() -> impl Strategy<Value = NetworkConstraint> {
    let same =
        prop_oneof![Just(None), Just(Some("rack")), Just(Some("zone")), Just(Some("switch"))];
    let strength = prop_oneof![Just(Strength::Required), Just(Strength::Preferred)];
    let max_rtt = prop_oneof![2 => Just(None), 1 => prop::sample::select(vec![150u32, 300, 1000]).prop_map(Some)];
    let some = (same, strength, max_rtt, any::<bool>()).prop_map(
        |(same, strength, max_rtt_us, nearest)| NetworkConstraint {
            same: same.map(str::to_owned),
            strength: if same.is_some() { strength } else { Strength::Required },
            max_rtt_us,
            nearest,
        },
    );
    prop_oneof![Just(NetworkConstraint::NONE), some]
}

/// Host `i` (in registration order) is in rack `r{i/2}` (but host 3 is in none) of zone
/// `z{i/4}`, and on switch `s{i%3}`, which spans racks: levels need not nest.
fn topology(i: usize) -> Topology {
    let mut topology: Topology = [
        ("rack".to_owned(), format!("r{}", i / 2)),
        ("zone".to_owned(), format!("z{}", i / 4)),
        ("switch".to_owned(), format!("s{}", i % 3)),
    ]
    .into();
    if i == 3 {
        topology.remove("rack");
    }
    topology
}

/// The round trip measured from host `i` to host `j`: none between some pairs.
fn rtt(i: usize, j: usize) -> Option<u32> {
    (!(i + j).is_multiple_of(5)).then(|| 100 * (1 + i.abs_diff(j) as u32))
}

fn request() -> impl Strategy<Value = Request> {
    let memory = prop_oneof![Just(None), (1u64..9000).prop_map(Some), Just(Some(4096))];
    let mode = prop_oneof![Just(Mode::Shared), Just(Mode::Exclusive)];
    let locality = prop_oneof![Just(Locality::Any), Just(Locality::Local), Just(Locality::Remote)];
    let compute = prop_oneof![3 => Just(None), 1 => (0u32..=101).prop_map(Some)];
    // Mostly on local VMs, which alone may give them.
    let vm = prop_oneof![
        1 => Just(None),
        1 => (0u64..6, 0u64..6).prop_map(|(c, m)| Some(Resources::new(c * 1000, m * 1024))),
    ];
    let shape = (0u32..6, memory, mode, locality, any::<bool>());
    (shape, constraints(), network(), compute, vm).prop_map(
        |(
            (ncgpus, gpu_memory_mib, mode, locality, distinct_gpus),
            constraints,
            network,
            compute,
            vm,
        )| {
            let vm_resources = match locality {
                Locality::Local => vm,
                _ => vm.filter(|_| ncgpus == 5),
            };
            Request {
                ncgpus,
                gpu_memory_mib,
                mode,
                locality,
                distinct_gpus,
                constraints,
                network,
                compute_percent: compute,
                vm_resources,
            }
        },
    )
}

fn op(policies: usize) -> impl Strategy<Value = Op> {
    let state = prop_oneof![
        3 => Just(HostState::Schedulable),
        1 => Just(HostState::Drained),
        1 => Just(HostState::Unavailable)
    ];
    prop_oneof![
        6 => (0u8..12, request(), 0..policies).prop_map(|(vm, request, policy)| Op::Place { vm, request, policy }),
        2 => (request(), 0..policies).prop_map(|(request, policy)| Op::Probe { request, policy }),
        3 => (0u8..12).prop_map(|vm| Op::Release { vm }),
        1 => (0usize..6, state).prop_map(|(host, state)| Op::SetState { host, state }),
        1 => (0usize..4, prop::sample::select(vec![2048u64, 8192]), 0u8..24).prop_map(|(host, memory_mib, variant)| Op::AddGpu { host, memory_mib, variant }),
        1 => (0usize..4, 0u32..3, any::<bool>()).prop_map(|(host, index, schedulable)| Op::Taint { host, index, schedulable }),
        1 => (0usize..4, 0u32..4, 1u8..4, 0u8..24).prop_map(|(host, index, parts, variant)| Op::Partition { host, index, parts, variant }),
    ]
}

fn build(shape: &PoolShape, selector: Selector) -> (Pool, Vec<String>) {
    let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
    let mut hosts = Vec::new();
    for (i, gpus) in shape.gpu_hosts.iter().enumerate() {
        let name = format!("cg{i}");
        pool.add_host(host(&name), HostKind::ComputeGpu).unwrap();
        for (index, &(memory_mib, variant)) in gpus.iter().enumerate() {
            pool.add_gpu(variant_spec(&host(&name), index as u32, memory_mib, variant)).unwrap();
        }
        // Every other host offers local VMs 8 cores and 8 GiB: a few VMs fill it.
        if i % 2 == 0 {
            pool.set_host_resources(&host(&name), Some(Resources::new(8000, 8192))).unwrap();
        }
        hosts.push(name);
    }
    for i in 0..shape.rgpu_hosts {
        let name = format!("rg{i}");
        pool.add_host(host(&name), HostKind::ComputeRgpu).unwrap();
        hosts.push(name);
    }
    for (i, from) in hosts.iter().enumerate() {
        pool.set_host_topology(&host(from), topology(i)).unwrap();
        let measured = hosts.iter().enumerate().filter(|&(j, _)| j != i);
        let rtts = measured.filter_map(|(j, to)| Some((host(to), rtt(i, j)?)));
        pool.set_host_rtts(&host(from), rtts).unwrap();
    }
    (pool, hosts)
}

fn vm_id(n: u8) -> VmId {
    VmId::from_uuid(Uuid::from_u128(u128::from(n) + 1))
}

/// What one operation returned, comparable across pools.
#[derive(Debug, PartialEq)]
enum Outcome {
    Placed(Result<Placement, Error>),
    Released(Option<Placement>),
    State,
}

/// Runs `ops`, checking the per-step properties; returns every outcome.
fn run(shape: &PoolShape, ops: &[Op], selector: Selector) -> Result<Vec<Outcome>, TestCaseError> {
    let names = policies();
    let (mut pool, hosts) = build(shape, selector);
    let mut gpus_per_host: Vec<u32> = shape.gpu_hosts.iter().map(|g| g.len() as u32).collect();
    // Per GPU host, by index: each GPU's memory, and whether it may be partitioned (whole, with
    // no partitions yet).
    let mut gpus: Vec<Vec<(u64, bool)>> = shape
        .gpu_hosts
        .iter()
        .map(|g| g.iter().map(|&(memory, _)| (memory, true)).collect())
        .collect();
    let mut outcomes = Vec::with_capacity(ops.len());
    for op in ops {
        let before = (pool.gpu_usage(), pool.host_usage());
        let outcome = match op {
            Op::Place { vm, request, policy } => {
                let result = pool.place(vm_id(*vm), request, &names[*policy]);
                match &result {
                    Ok(placement) => {
                        prop_assert_eq!(placement.cgpus.len(), request.ncgpus as usize);
                        if request.distinct_gpus || request.mode == Mode::Exclusive {
                            let mut gpus: Vec<_> = placement.cgpus.iter().map(|c| &c.gpu).collect();
                            gpus.sort();
                            gpus.dedup();
                            prop_assert_eq!(gpus.len(), placement.cgpus.len(), "GPUs not distinct");
                        }
                        if request.locality == Locality::Local {
                            let first = &placement.cgpus[0].host;
                            prop_assert!(placement.cgpus.iter().all(|c| &c.host == first));
                            prop_assert_eq!(placement.vm_resources, request.vm_resources);
                            let (offers, taken) = pool.host_resources(first).expect("a host");
                            if let Some(offers) = offers {
                                prop_assert!(
                                    offers.has_room(&taken, &Default::default()),
                                    "{first} gave {taken:?} of {offers:?}"
                                );
                            }
                        } else if !request.network.is_empty() {
                            let gpu_hosts: Vec<HostId> =
                                placement.cgpus.iter().map(|c| c.host.clone()).collect();
                            let vm_hosts = pool.vm_hosts_for(request, &gpu_hosts).expect("a set");
                            prop_assert!(!vm_hosts.is_empty(), "no host may run the VM");
                            for vm_host in &vm_hosts {
                                prop_assert!(
                                    pool.meets_network(request, vm_host, &gpu_hosts),
                                    "{vm_host}"
                                );
                            }
                            let at = |h: &HostId| hosts.iter().position(|n| host(n) == *h).unwrap();
                            for (vm_host, gpu_host) in
                                vm_hosts.iter().flat_map(|v| gpu_hosts.iter().map(move |g| (v, g)))
                            {
                                let (v, g) = (at(vm_host), at(gpu_host));
                                if let Some(level) = request.network.required_level() {
                                    prop_assert_eq!(
                                        topology(v).get(level).cloned(),
                                        topology(g).get(level).cloned()
                                    );
                                }
                                if let Some(max) = request.network.max_rtt_us {
                                    let measured = if v == g { Some(0) } else { rtt(v, g) };
                                    prop_assert!(
                                        measured.is_some_and(|us| us <= max),
                                        "{vm_host} -> {gpu_host}: {measured:?} > {max}"
                                    );
                                }
                            }
                        }
                        let usage = pool.gpu_usage();
                        for cgpu in &placement.cgpus {
                            let gpu = usage.iter().find(|g| g.id == cgpu.gpu).expect("its GPU");
                            prop_assert_eq!(gpu.partitions, 0, "a partitioned GPU booked whole");
                            if let Some(partition) = &gpu.partition {
                                let parent = usage
                                    .iter()
                                    .find(|g| g.id == partition.parent)
                                    .expect("parent");
                                prop_assert!(parent.taint.is_none() && parent.health.is_none());
                            }
                            let kind = GpuKind::of(&gpu.model, &gpu.attributes);
                            prop_assert!(
                                request.constraints.admits(&kind),
                                "{:?} placed on {:?}",
                                request.constraints,
                                kind
                            );
                        }
                    }
                    Err(_) => {
                        prop_assert_eq!(
                            &(pool.gpu_usage(), pool.host_usage()),
                            &before,
                            "failure changed the pool"
                        )
                    }
                }
                Outcome::Placed(result)
            }
            Op::Probe { request, policy } => {
                let probe = VmId::from_uuid(Uuid::from_u128(u128::MAX));
                let result = pool.place(probe, request, &names[*policy]);
                if result.is_ok() {
                    prop_assert!(pool.release(&probe).is_some());
                }
                prop_assert_eq!(
                    &(pool.gpu_usage(), pool.host_usage()),
                    &before,
                    "place+release changed the pool"
                );
                Outcome::Placed(result)
            }
            Op::Release { vm } => Outcome::Released(pool.release(&vm_id(*vm))),
            Op::SetState { host: h, state } => {
                if let Some(name) = hosts.get(*h) {
                    pool.set_host_state(&host(name), *state).unwrap();
                }
                Outcome::State
            }
            Op::Taint { host: h, index, schedulable } => {
                if gpus_per_host.get(*h).is_some_and(|count| index < count) {
                    let id = gpgpums::GpuId::on_host(&host(&hosts[*h]), *index);
                    let taint = (!*schedulable).then(|| "test".to_owned());
                    pool.set_gpu_taint(&id, taint.clone()).unwrap();
                    let usage = pool.gpu_usage();
                    let gpu = usage.iter().find(|g| g.id == id).expect("the GPU");
                    prop_assert_eq!(&gpu.taint, &taint);
                }
                Outcome::State
            }
            Op::AddGpu { host: h, memory_mib, variant } => {
                if let Some(count) = gpus_per_host.get_mut(*h) {
                    let spec = variant_spec(&host(&hosts[*h]), *count, *memory_mib, *variant);
                    pool.add_gpu(spec).unwrap();
                    *count += 1;
                    gpus[*h].push((*memory_mib, true));
                }
                Outcome::State
            }
            Op::Partition { host: h, index, parts, variant } => {
                let parent = gpus.get(*h).and_then(|g| g.get(*index as usize)).copied();
                if let Some((memory, true)) = parent {
                    let name = host(&hosts[*h]);
                    for _ in 0..*parts {
                        let count = &mut gpus_per_host[*h];
                        let mut spec =
                            variant_spec(&name, *count, memory / u64::from(*parts), *variant);
                        spec.partition = Some(gpgpums::Partition {
                            parent: gpgpums::GpuId::on_host(&name, *index),
                            profile: format!("{parts}g.{}gb", memory / 1024),
                        });
                        pool.add_gpu(spec).unwrap();
                        *count += 1;
                        gpus[*h].push((memory, false));
                    }
                    gpus[*h][*index as usize].1 = false;
                }
                Outcome::State
            }
        };
        pool.audit().map_err(TestCaseError::fail)?;
        outcomes.push(outcome);
    }
    for vm in 0..12 {
        pool.release(&vm_id(vm));
    }
    prop_assert!(pool
        .gpu_usage()
        .iter()
        .all(|g| g.allocated_mib == 0 && g.cgpus == 0 && g.jobs == 0));
    prop_assert!(pool.host_usage().iter().all(|h| h.vms == 0));
    Ok(outcomes)
}

proptest! {

    #[test]
    fn indexed_pool_is_safe_deterministic_and_agrees_with_the_reference(
        shape in shape(),
        ops in prop::collection::vec(op(policies().len()), 1..60),
    ) {
        let indexed = run(&shape, &ops, Selector::Indexed)?;
        let again = run(&shape, &ops, Selector::Indexed)?;
        prop_assert_eq!(&indexed, &again, "not deterministic");
        let scan = run(&shape, &ops, Selector::Scan)?;
        prop_assert_eq!(&indexed, &scan, "indexed and reference scan disagree");
        let sort = run(&shape, &ops, Selector::SortEachRequest)?;
        prop_assert_eq!(&scan, &sort, "reference scan and per-request sort disagree");
    }

    /// One policy per run, so each policy's own index is exercised over a long history.
    #[test]
    fn every_policy_alone_agrees_with_the_reference(
        shape in shape(),
        policy in 0..policies().len(),
        requests in prop::collection::vec((0u8..12, request(), any::<bool>()), 1..80),
    ) {
        let ops: Vec<Op> = requests
            .into_iter()
            .map(|(vm, request, release)| if release { Op::Release { vm } } else { Op::Place { vm, request, policy } })
            .collect();
        let indexed = run(&shape, &ops, Selector::Indexed)?;
        let scan = run(&shape, &ops, Selector::Scan)?;
        prop_assert_eq!(indexed, scan);
    }
}
