//! Requests that constrain their GPUs (issue [3/6]): models, traits required, forbidden, preferred
//! and avoided, minimum versions. Hard constraints filter, soft ones rank before the policy, a
//! constraint no GPU of the fleet meets is refused at once naming it, and nothing changes on a
//! refusal.

mod common;

use common::*;
use gpgpums::{
    Error, GpuAttributes, GpuConstraints, HostKind, MajorMinor, Pool, Rehome, Request, Selector,
    VmId,
};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Host `name` with one GPU per `(model, compute capability, traits)`, 8 GiB each.
fn add_host_of(pool: &mut Pool, name: &str, gpus: &[(&str, (u16, u16), &[&str])]) {
    let id = host(name);
    pool.add_host(id.clone(), HostKind::ComputeGpu).unwrap();
    for (index, (model, (major, minor), traits)) in gpus.iter().enumerate() {
        let mut spec = gpu_spec(&id, index as u32, 8192);
        spec.model = (*model).to_owned();
        spec.attributes = GpuAttributes {
            compute_capability: Some(MajorMinor::new(*major, *minor)),
            cuda_version: Some(MajorMinor::new(12, 4)),
            traits: traits.iter().map(|t| (*t).to_owned()).collect(),
            ..GpuAttributes::default()
        };
        pool.add_gpu(spec).unwrap();
    }
}

/// h1: T4, A100 with NVLink, H100 with NVLink; h2: A100, H100.
fn fleet(selector: Selector) -> Pool {
    let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
    add_host_of(
        &mut pool,
        "h1",
        &[
            ("T4", (7, 5), &[]),
            ("A100", (8, 0), &["CUSTOM_NVLINK"]),
            ("H100", (9, 0), &["CUSTOM_NVLINK"]),
        ],
    );
    add_host_of(&mut pool, "h2", &[("A100", (8, 0), &[]), ("H100", (9, 0), &[])]);
    pool
}

fn models_of(pool: &Pool, placement: &gpgpums::Placement) -> Vec<String> {
    let usage = pool.gpu_usage();
    placement
        .cgpus
        .iter()
        .map(|c| usage.iter().find(|g| g.id == c.gpu).unwrap().model.clone())
        .collect()
}

const SELECTORS: [Selector; 3] = [Selector::Indexed, Selector::Scan, Selector::SortEachRequest];

#[test]
fn hard_constraints_filter_and_soft_ones_rank_before_the_policy() {
    for selector in SELECTORS {
        let mut pool = fleet(selector);
        let a100 = GpuConstraints { models: strings(&["A100"]), ..Default::default() };
        let placed =
            pool.place(vm(1), &Request::exclusive(2).with_constraints(a100.clone()), "first-fit");
        assert_eq!(models_of(&pool, &placed.unwrap()), ["A100", "A100"], "{selector:?}");
        // Both A100s are taken: a third waits for one, it never lands elsewhere.
        let err = pool.place(vm(2), &Request::exclusive(1).with_constraints(a100), "first-fit");
        let Err(Error::InsufficientCapacity(shortfall)) = err else { panic!("{err:?}") };
        assert!(!shortfall.never_fits, "an A100 comes free when VM 1 ends");
        // Compute capability 8.0 or higher, NVLink avoided: the H100 without it first.
        let newer = GpuConstraints {
            min_compute_capability: Some(MajorMinor::new(8, 0)),
            avoid: strings(&["CUSTOM_NVLINK"]),
            ..Default::default()
        };
        let placed = pool.place(vm(3), &Request::exclusive(1).with_constraints(newer), "first-fit");
        assert_eq!(placed.unwrap().cgpus[0].gpu, gpu("h2", 1), "{selector:?}");
        // NVLink preferred, T4 forbidden by its trait: the one H100 left with NVLink.
        let nvlink = GpuConstraints {
            preferred: strings(&["CUSTOM_NVLINK"]),
            forbidden: strings(&["HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_5"]),
            ..Default::default()
        };
        let placed = pool.place(vm(4), &Request::exclusive(1).with_constraints(nvlink), "best-fit");
        assert_eq!(placed.unwrap().cgpus[0].gpu, gpu("h1", 2), "{selector:?}");
        // A preference decides only among what is left: the T4 when it is all there is.
        let t4_left =
            GpuConstraints { preferred: strings(&["CUSTOM_NVLINK"]), ..Default::default() };
        let placed =
            pool.place(vm(5), &Request::exclusive(1).with_constraints(t4_left), "first-fit");
        assert_eq!(models_of(&pool, &placed.unwrap()), ["T4"], "{selector:?}");
        pool.audit().unwrap();
    }
}

#[test]
fn constraints_no_gpu_of_the_fleet_meets_are_refused_naming_them_and_change_nothing() {
    let mut pool = fleet(Selector::Indexed);
    pool.place(vm(1), &Request::shared(1, 1024), "first-fit").unwrap();
    let before = pool.gpu_usage();
    let changes = pool.changes();
    let cases: [(GpuConstraints, &str, &str); 6] = [
        (
            GpuConstraints { models: strings(&["V100"]), ..Default::default() },
            "gpu_model",
            "no GPU in the pool is a V100; its models: A100, H100, T4",
        ),
        (
            GpuConstraints {
                models: strings(&["T4"]),
                min_compute_capability: Some(MajorMinor::new(8, 0)),
                ..Default::default()
            },
            "min_compute_capability",
            "no GPU of T4 has compute capability 8.0 or higher",
        ),
        (
            GpuConstraints { min_cuda_version: Some(MajorMinor::new(13, 0)), ..Default::default() },
            "min_cuda_version",
            "CUDA 13.0 or higher",
        ),
        (
            GpuConstraints {
                models: strings(&["T4"]),
                required: strings(&["CUSTOM_NVLINK"]),
                ..Default::default()
            },
            "traits.required",
            "no GPU of T4 has every trait of CUSTOM_NVLINK",
        ),
        (
            GpuConstraints { required: strings(&["CUSTOM_NOWHERE"]), ..Default::default() },
            "traits.required",
            "CUSTOM_NOWHERE",
        ),
        (
            GpuConstraints {
                models: strings(&["A100"]),
                forbidden: strings(&["HW_GPU_CUDA_COMPUTE_CAPABILITY_V8_0"]),
                ..Default::default()
            },
            "traits.forbidden",
            "every GPU of A100 that meets the other constraints has a trait of",
        ),
    ];
    for (constraints, field, says) in cases {
        let request = Request::exclusive(1).with_constraints(constraints.clone());
        let err = pool.place(vm(2), &request, "first-fit").unwrap_err();
        let Error::InvalidRequest { field: got, reason } = &err else { panic!("{err:?}") };
        assert_eq!(*got, field, "{constraints:?}: {err}");
        assert!(reason.contains(says), "{constraints:?}: {reason}");
        let err = pool.attach(vm(1), &request, "first-fit", None).unwrap_err();
        assert!(matches!(err, Error::InvalidRequest { .. }), "attach: {err:?}");
    }
    assert_eq!(pool.gpu_usage(), before);
    assert_eq!(pool.changes(), changes);
    // More of a model than the fleet has: it can never fit, so it is not worth a queue.
    let h100s = GpuConstraints { models: strings(&["H100"]), ..Default::default() };
    let err =
        pool.place(vm(3), &Request::exclusive(3).with_constraints(h100s.clone()), "first-fit");
    let Err(Error::InsufficientCapacity(shortfall)) = err else { panic!("{err:?}") };
    assert!(shortfall.never_fits && shortfall.placeable == 2, "{shortfall:?}");
    assert!(!pool.could_ever_fit(&Request::exclusive(3).with_constraints(h100s.clone()), None));
    assert!(pool.could_ever_fit(&Request::exclusive(2).with_constraints(h100s), None));
}

#[test]
fn bad_constraints_are_refused_before_any_pool_is_asked() {
    let cases: [(GpuConstraints, &str); 6] = [
        (
            GpuConstraints { required: strings(&["NVLINK"]), ..Default::default() },
            "traits.required",
        ),
        (
            GpuConstraints { forbidden: strings(&["CUSTOM_lower"]), ..Default::default() },
            "traits.forbidden",
        ),
        (
            GpuConstraints { preferred: strings(&["CUSTOM_"]), ..Default::default() },
            "traits.preferred",
        ),
        (
            GpuConstraints { avoid: strings(&[&"X".repeat(300)]), ..Default::default() },
            "traits.avoid",
        ),
        (
            GpuConstraints {
                required: strings(&["CUSTOM_A"]),
                forbidden: strings(&["CUSTOM_A"]),
                ..Default::default()
            },
            "traits.required",
        ),
        (GpuConstraints { models: strings(&[""]), ..Default::default() }, "gpu_model"),
    ];
    for (constraints, field) in cases {
        let problems = Request::exclusive(1).with_constraints(constraints.clone()).problems();
        assert_eq!(problems.first().map(|p| p.0), Some(field), "{constraints:?}: {problems:?}");
    }
    let fine = GpuConstraints {
        required: strings(&["HW_GPU_CUDA_COMPUTE_CAPABILITY_V9_0", "COMPUTE_ACCELERATORS"]),
        forbidden: strings(&["HW_GPU_CUDA_SDK_V12_4"]),
        preferred: strings(&["CUSTOM_RACK_R12"]),
        avoid: strings(&["HW_GPU_CUDA_SDK_V10_0"]),
        ..Default::default()
    };
    assert_eq!(Request::exclusive(1).with_constraints(fine).problems(), []);
    // The same rules for what a GPU is registered with.
    let mut pool = Pool::new();
    pool.add_host(host("h"), HostKind::ComputeGpu).unwrap();
    let mut spec = gpu_spec(&host("h"), 0, 8192);
    spec.attributes.traits.insert("nvlink".to_owned());
    let err = pool.add_gpu(spec).unwrap_err();
    assert!(matches!(err, Error::InvalidInventory { field: "traits", .. }), "{err:?}");
    assert!(pool.gpu_usage().is_empty());
}

#[test]
fn constrained_requests_past_the_subset_limit_decide_as_the_scan_does() {
    // 70 kinds (a custom trait each, on 70 hosts): a request naming one trait builds a subset of
    // its own, so 70 requests go past MAX_SUBSETS and the least recently used are dropped.
    let build = |selector| {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        for h in 0..70 {
            let name = format!("h{h}");
            let trait_name = format!("CUSTOM_T{h}");
            add_host_of(
                &mut pool,
                &name,
                &[("A100", (8, 0), &[trait_name.as_str()]), ("A100", (8, 0), &[])],
            );
        }
        pool
    };
    let (mut indexed, mut scan) = (build(Selector::Indexed), build(Selector::Scan));
    let mut n = 0;
    for round in 0..3 {
        for h in (0..70).rev() {
            n += 1;
            let constraints = GpuConstraints {
                required: vec![format!("CUSTOM_T{}", (h * 7 + round) % 70)],
                ..Default::default()
            };
            let request =
                Request::shared(1, 1024 * (1 + round as u64)).with_constraints(constraints);
            let a = indexed.place(vm(n), &request, "best-fit");
            let b = scan.place(vm(n), &request, "best-fit");
            assert_eq!(a, b, "request {n}");
            if n % 3 == 0 {
                assert_eq!(indexed.release(&vm(n - 1)), scan.release(&vm(n - 1)));
            }
        }
    }
    indexed.audit().unwrap();
    assert_eq!(indexed.gpu_usage(), scan.gpu_usage());
}

#[test]
fn a_rehomed_cgpu_moves_only_to_a_gpu_its_vm_admits() {
    let mut pool = fleet(Selector::Indexed);
    let h100 = GpuConstraints { models: strings(&["H100"]), ..Default::default() };
    let placed =
        pool.place(vm(1), &Request::exclusive(1).with_constraints(h100.clone()), "first-fit");
    assert_eq!(models_of(&pool, &placed.unwrap()), ["H100"]);
    let to = Rehome { on_host: None, distinct_gpus: false, constraints: &h100, near: None };
    let moved = pool.rehome(&vm(1), 0, "first-fit", &to, None).unwrap();
    let usage = pool.gpu_usage();
    assert_eq!(usage.iter().find(|g| g.id == moved.gpu).unwrap().model, "H100");
    // The H100 it left goes to another VM: no H100 is free now, and it stays where it is,
    // though A100s and a T4 are idle.
    pool.place(vm(2), &Request::exclusive(1).with_constraints(h100.clone()), "first-fit").unwrap();
    let err = pool.rehome(&vm(1), 0, "first-fit", &to, None).unwrap_err();
    assert!(matches!(err, Error::InsufficientCapacity(_)), "{err:?}");
    assert_eq!(pool.placement(&vm(1)).unwrap().cgpus[0].gpu, moved.gpu);
    pool.audit().unwrap();
}

#[test]
fn a_gpu_whose_attributes_change_keeps_its_cgpus_and_is_chosen_by_its_new_kind() {
    for selector in SELECTORS {
        let mut pool = fleet(selector);
        let nvlink = GpuConstraints { required: strings(&["CUSTOM_NVLINK"]), ..Default::default() };
        let request = Request::shared(1, 1024).with_constraints(nvlink.clone());
        // The subsets for NVLink exist before the change, so they must follow it.
        let first = pool.place(vm(1), &request, "first-fit").unwrap();
        assert_eq!(first.cgpus[0].gpu, gpu("h1", 1));
        let t4 = gpu("h1", 0);
        let mut attributes = pool.gpu_usage()[0].attributes.clone();
        attributes.traits.insert("CUSTOM_NVLINK".to_owned());
        pool.set_gpu_attributes(&t4, attributes).unwrap();
        let second = pool.place(vm(2), &request, "first-fit").unwrap();
        assert_eq!(second.cgpus[0].gpu, t4, "{selector:?}: the T4 has NVLink now, first in order");
        // And back: the A100 with NVLink again, the T4 keeping its cGPU.
        let plain =
            GpuAttributes { traits: Default::default(), ..pool.gpu_usage()[0].attributes.clone() };
        pool.set_gpu_attributes(&t4, plain).unwrap();
        let third = pool.place(vm(3), &request, "first-fit").unwrap();
        assert_eq!(third.cgpus[0].gpu, gpu("h1", 1), "{selector:?}");
        assert_eq!(pool.placement(&vm(2)).unwrap().cgpus[0].gpu, t4);
        let mut bad = GpuAttributes::default();
        bad.traits.insert("lower".to_owned());
        assert!(matches!(pool.set_gpu_attributes(&t4, bad), Err(Error::InvalidInventory { .. })));
        pool.audit().unwrap();
    }
}

/// A tenant that cycles through every set of models (255 of 8) cannot make the pool build an
/// index per request: a set gets an index of its own only once merging its kinds' indexes has
/// cost as many index operations as building it, so what builds cost stays within what the
/// requests themselves cost (plus one pass for the kinds' own indexes). Another tenant's set is
/// decided all along, the same as the reference scan would.
#[test]
fn cycling_through_constraint_sets_cannot_force_an_index_build_per_request() {
    const MODELS: [&str; 8] = ["T4", "A10", "L4", "L40S", "A30", "A100", "H100", "H200"];
    let mut pools: Vec<Pool> = [Selector::Indexed, Selector::Scan]
        .into_iter()
        .map(|selector| {
            let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
            for (h, &model) in MODELS.iter().enumerate() {
                add_model_host(&mut pool, &format!("h{h}"), &[(model, 16384); 50]);
            }
            pool
        })
        .collect();
    let gpus = 400;
    let victim = Request::shared(1, 1024).with_constraints(GpuConstraints {
        models: strings(&["A100", "H100", "H200"]),
        ..GpuConstraints::default()
    });
    let mut decisions = 0u64;
    for round in 0..4u128 {
        for set in 1u32..256 {
            let models = (0..8).filter(|b| set & (1 << b) != 0).map(|b| MODELS[b].to_owned());
            let constraints = GpuConstraints { models: models.collect(), ..Default::default() };
            let attacker = Request::shared(1, 1024).with_constraints(constraints);
            let n = round * 1000 + u128::from(set);
            let mut placed = Vec::new();
            for pool in &mut pools {
                let a = pool.place(vm(n), &attacker, "least-load-fit").unwrap();
                let v = pool.place(vm(1_000_000 + n), &victim, "least-load-fit").unwrap();
                placed.push((a.cgpus, v.cgpus));
                pool.release(&vm(n));
                pool.release(&vm(1_000_000 + n));
            }
            assert_eq!(placed[0], placed[1], "indexed and reference disagree at set {set}");
            decisions += 2;
        }
    }
    let stats = pools[0].subset_stats();
    assert!(stats.merged_queries > 0, "{stats:?}");
    assert!(
        stats.built_gpus <= stats.merged_queries + gpus,
        "building cost {} GPU insertions for {} decisions that queried {} times: {stats:?}",
        stats.built_gpus,
        decisions,
        stats.merged_queries
    );
}
