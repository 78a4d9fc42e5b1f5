//! Each policy, locality, mode and error on hand-built pools whose right answer is known.

mod common;

use common::{add_gpu_host, gpu, gpu_spec, host, paper_testbed};
use gpgpums::{
    Error, GpuId, HostKind, HostState, Locality, Mode, PolicyRegistry, Pool, Request, Selector,
    VmHost, VmId, DEFAULT_POLICY,
};

fn place(pool: &mut Pool, request: &Request, policy: &str) -> Result<Vec<GpuId>, Error> {
    let placement = pool.place(VmId::new_random(), request, policy)?;
    pool.audit().unwrap();
    Ok(placement.cgpus.into_iter().map(|c| c.gpu).collect())
}

/// The paper's MonteCarloMultiGPU case, one single-cGPU VM at a time; returns each VM's GPU index.
fn montecarlo_one_vm_at_a_time(policy: &str) -> (Vec<u32>, Error, Pool) {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    let mut chosen = Vec::new();
    for _ in 0..8 {
        let gpus = place(&mut pool, &Request::shared(1, 4096), policy).unwrap();
        chosen.push(gpus[0].as_str().rsplit("gpu").next().unwrap().parse().unwrap());
    }
    let before = pool.gpu_usage();
    let err = place(&mut pool, &Request::shared(1, 4096), policy).unwrap_err();
    assert_eq!(pool.gpu_usage(), before, "a failed placement changed the pool");
    (chosen, err, pool)
}

#[test]
fn montecarlo_first_fit_fills_one_gpu_after_another() {
    let (chosen, err, _) = montecarlo_one_vm_at_a_time("first-fit");
    assert_eq!(chosen, [0, 0, 1, 1, 2, 2, 3, 3]);
    let Error::InsufficientCapacity(shortfall) = err else { panic!("{err:?}") };
    assert_eq!((shortfall.requested, shortfall.placeable), (1, 0));
}

#[test]
fn montecarlo_least_load_fit_spreads_then_doubles_up() {
    let (chosen, err, pool) = montecarlo_one_vm_at_a_time("least-load-fit");
    assert_eq!(chosen, [0, 1, 2, 3, 0, 1, 2, 3]);
    assert!(matches!(err, Error::InsufficientCapacity(_)));
    assert!(pool.gpu_usage().iter().all(|g| g.allocated_mib == 8192 && g.jobs == 2));
}

#[test]
fn montecarlo_one_vm_with_eight_cgpus() {
    for (policy, expected) in
        [("first-fit", [0, 0, 1, 1, 2, 2, 3, 3]), ("least-load-fit", [0, 1, 2, 3, 0, 1, 2, 3])]
    {
        let mut pool = Pool::new();
        paper_testbed(&mut pool);
        let gpus = place(&mut pool, &Request::shared(8, 4096), policy).unwrap();
        let expected: Vec<GpuId> = expected.iter().map(|&i| gpu("compute-gpu", i)).collect();
        assert_eq!(gpus, expected, "{policy}");
        assert!(pool.host_usage()[0].vms == 1);
    }
}

#[test]
fn a_multi_cgpu_request_is_all_or_nothing() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    place(&mut pool, &Request::shared(3, 4096), "first-fit").unwrap();
    let before = pool.gpu_usage();
    let changes = pool.changes();
    let err = place(&mut pool, &Request::shared(6, 4096), "first-fit").unwrap_err();
    assert_eq!(pool.changes(), changes, "a failed placement counts as no change");
    let Error::InsufficientCapacity(shortfall) = err else { panic!("{err:?}") };
    assert_eq!((shortfall.requested, shortfall.placeable), (6, 5));
    assert_eq!(pool.gpu_usage(), before);
    assert_eq!(pool.host_usage()[0].vms, 1);
}

/// GPU0 8 GiB with 6 GiB booked, GPU1 16 GiB with 4 GiB booked, GPU2 8 GiB idle.
fn uneven_pool() -> Pool {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192, 16384, 8192]);
    place(&mut pool, &Request::shared(1, 6144), "first-fit").unwrap();
    place(&mut pool, &Request::shared(1, 4096), "least-load-fit").unwrap();
    let used: Vec<u64> = pool.gpu_usage().iter().map(|g| g.allocated_mib).collect();
    assert_eq!(used, [6144, 4096, 0]);
    pool
}

#[test]
fn best_fit_packs_the_fullest_gpu_that_fits() {
    let mut pool = uneven_pool();
    assert_eq!(place(&mut pool, &Request::shared(1, 2048), "best-fit").unwrap(), [gpu("cg", 0)]);
    // GPU0 is full now; of GPU1 (12 GiB free) and GPU2 (8 GiB free) best fit takes GPU2.
    assert_eq!(place(&mut pool, &Request::shared(1, 3000), "best-fit").unwrap(), [gpu("cg", 2)]);
}

#[test]
fn least_load_fit_takes_the_emptiest_gpu() {
    let mut pool = uneven_pool();
    assert_eq!(
        place(&mut pool, &Request::shared(1, 1024), "least-load-fit").unwrap(),
        [gpu("cg", 1)]
    );
}

#[test]
fn first_fit_takes_the_first_that_fits_in_pool_order() {
    let mut pool = uneven_pool();
    assert_eq!(place(&mut pool, &Request::shared(1, 2048), "first-fit").unwrap(), [gpu("cg", 0)]);
    assert_eq!(place(&mut pool, &Request::shared(1, 2048), "first-fit").unwrap(), [gpu("cg", 1)]);
}

#[test]
fn fewer_jobs_gpu_prefers_fewest_cgpus_then_most_free() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192, 8192, 16384]);
    // Best fit books both 1 GiB cGPUs on GPU0; the 7 GiB one no longer fits there and goes to GPU1.
    place(&mut pool, &Request::shared(2, 1024), "best-fit").unwrap();
    place(&mut pool, &Request::shared(1, 7168), "first-fit").unwrap();
    let cgpus: Vec<u32> = pool.gpu_usage().iter().map(|g| g.cgpus).collect();
    assert_eq!(cgpus, [2, 1, 0], "setup");
    // GPU2 has the fewest cGPUs.
    assert_eq!(
        place(&mut pool, &Request::shared(1, 512), "fewer-jobs-gpu").unwrap(),
        [gpu("cg", 2)]
    );
    // Now GPU1 and GPU2 have one cGPU each: the tie goes to the one with more free memory (GPU2).
    assert_eq!(
        place(&mut pool, &Request::shared(1, 512), "fewer-jobs-gpu").unwrap(),
        [gpu("cg", 2)]
    );
    // GPU2 has two, GPU1 one, GPU0 two: GPU1, though it has the least free memory.
    assert_eq!(
        place(&mut pool, &Request::shared(1, 512), "fewer-jobs-gpu").unwrap(),
        [gpu("cg", 1)]
    );
}

#[test]
fn fewer_jobs_node_prefers_quiet_hosts_and_then_the_inner_policy() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "busy", &[8192, 8192]);
    add_gpu_host(&mut pool, "quiet", &[8192, 4096]);
    place(&mut pool, &Request::shared(1, 4096), "first-fit").unwrap();
    // "busy" has a VM; "quiet" has none, so its GPUs win even where best fit alone would pick busy:0.
    let chosen = place(&mut pool, &Request::shared(1, 2048), "fewer-jobs-node+best-fit").unwrap();
    assert_eq!(chosen, [gpu("quiet", 1)]);
    // Both hosts now have one VM: best fit among all, busy:0 (4 GiB free) vs quiet:1 (2 GiB free).
    let chosen = place(&mut pool, &Request::shared(1, 2048), "fewer-jobs-node+best-fit").unwrap();
    assert_eq!(chosen, [gpu("quiet", 1)]);
    // quiet has 2 VMs now; busy wins again.
    let chosen = place(&mut pool, &Request::shared(1, 1024), "fewer-jobs-node").unwrap();
    assert_eq!(chosen, [gpu("busy", 1)], "bare layer wraps least-load-fit");
    let placement =
        pool.place(VmId::new_random(), &Request::shared(1, 1024), "fewer-jobs-node").unwrap();
    assert_eq!(placement.policy, "fewer-jobs-node+least-load-fit");
}

#[test]
fn exclusive_cgpus_take_whole_idle_gpus_and_are_never_shared() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192, 16384, 8192]);
    place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap();
    let placement = pool.place(VmId::new_random(), &Request::exclusive(1), "first-fit").unwrap();
    assert_eq!(placement.cgpus[0].gpu, gpu("cg", 1), "GPU0 is in use, so not idle");
    assert_eq!(placement.cgpus[0].memory_mib, 16384);
    assert_eq!(placement.cgpus[0].mode, Mode::Exclusive);
    // A shared cGPU may not join the exclusive GPU even though it is the largest.
    assert_eq!(
        place(&mut pool, &Request::shared(1, 8192), "least-load-fit").unwrap(),
        [gpu("cg", 2)]
    );
    let err = place(&mut pool, &Request::exclusive(1), "first-fit").unwrap_err();
    assert!(matches!(err, Error::InsufficientCapacity(_)), "{err:?}");
    pool.audit().unwrap();
}

#[test]
fn exclusive_with_memory_needs_a_gpu_that_large() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192, 16384]);
    let request = Request { gpu_memory_mib: Some(12000), ..Request::exclusive(1) };
    assert_eq!(place(&mut pool, &request, "first-fit").unwrap(), [gpu("cg", 1)]);
    assert!(matches!(place(&mut pool, &request, "first-fit"), Err(Error::InsufficientCapacity(_))));
}

#[test]
fn distinct_gpus_keeps_a_vms_cgpus_apart() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    let request = Request::shared(2, 4096).with_distinct_gpus();
    assert_eq!(
        place(&mut pool, &request, "first-fit").unwrap(),
        [gpu("compute-gpu", 0), gpu("compute-gpu", 1)]
    );
    // Five distinct GPUs do not exist even though memory for five cGPUs does.
    let err =
        place(&mut pool, &Request::shared(5, 1024).with_distinct_gpus(), "first-fit").unwrap_err();
    let Error::InsufficientCapacity(shortfall) = err else { panic!("{err:?}") };
    assert_eq!(shortfall.placeable, 4);
    assert!(shortfall.never_fits, "no release can bring a fifth GPU: {shortfall:?}");
}

#[test]
fn local_puts_every_cgpu_and_the_vm_on_one_host() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "small", &[8192, 8192]);
    add_gpu_host(&mut pool, "big", &[8192, 8192, 8192]);
    let request = Request::exclusive(3).with_locality(Locality::Local);
    let placement = pool.place(VmId::new_random(), &request, "first-fit").unwrap();
    assert_eq!(placement.vm_host, VmHost::Pinned(host("big")));
    assert!(placement.cgpus.iter().all(|c| c.host == host("big")));
    pool.audit().unwrap();
    // Shared: two 4 GiB cGPUs fit on small:0 under first fit.
    let request = Request::shared(2, 4096).with_locality(Locality::Local);
    let placement = pool.place(VmId::new_random(), &request, "first-fit").unwrap();
    assert_eq!(placement.vm_host, VmHost::Pinned(host("small")));
    let err = pool
        .place(
            VmId::new_random(),
            &Request::exclusive(2).with_locality(Locality::Local),
            "first-fit",
        )
        .unwrap_err();
    let Error::InsufficientCapacity(shortfall) = err else { panic!("{err:?}") };
    assert_eq!(shortfall.placeable, 1, "small:1 is the only idle GPU");
    assert!(shortfall.to_string().contains("at most 1 fit on one compute-gpu host"));
    pool.audit().unwrap();
}

#[test]
fn local_tries_the_next_host_when_the_first_choice_is_too_small() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[16384]);
    add_gpu_host(&mut pool, "b", &[8192, 8192]);
    // Least load prefers a:0 (16 GiB) but two distinct cGPUs need two GPUs: host b.
    let request = Request::shared(2, 4096).with_locality(Locality::Local).with_distinct_gpus();
    let placement = pool.place(VmId::new_random(), &request, "least-load-fit").unwrap();
    assert_eq!(placement.vm_host, VmHost::Pinned(host("b")));
    pool.audit().unwrap();
}

#[test]
fn remote_and_any_need_a_host_for_the_vm() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192]);
    let remote = Request::exclusive(1).with_locality(Locality::Remote);
    let err = place(&mut pool, &remote, "first-fit").unwrap_err();
    assert!(matches!(err, Error::InvalidRequest { field: "locality", .. }), "{err:?}");
    pool.add_host(host("rg"), HostKind::ComputeRgpu).unwrap();
    pool.set_host_state(&host("rg"), HostState::Drained).unwrap();
    let err = place(&mut pool, &remote, "first-fit").unwrap_err();
    let Error::InsufficientCapacity(shortfall) = err else { panic!("{err:?}") };
    assert!(shortfall.no_vm_host);
    pool.set_host_state(&host("rg"), HostState::Schedulable).unwrap();
    let placement = pool.place(VmId::new_random(), &remote, "first-fit").unwrap();
    assert_eq!(placement.vm_host, VmHost::AnyRgpuHost);
    let placement = pool.place(VmId::new_random(), &Request::shared(1, 10), "first-fit");
    assert!(matches!(placement, Err(Error::InsufficientCapacity(_))), "the one GPU is exclusive");
}

#[test]
fn drained_and_unavailable_hosts_take_no_new_cgpus() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192]);
    add_gpu_host(&mut pool, "b", &[8192]);
    let vm = VmId::new_random();
    pool.place(vm, &Request::shared(1, 1024), "first-fit").unwrap();
    pool.set_host_state(&host("a"), HostState::Drained).unwrap();
    pool.set_host_state(&host("b"), HostState::Unavailable).unwrap();
    assert!(matches!(
        place(&mut pool, &Request::shared(1, 1024), "first-fit"),
        Err(Error::InsufficientCapacity(_))
    ));
    // Existing cGPUs stay, and can be released.
    assert_eq!(pool.gpu_usage()[0].cgpus, 1);
    assert!(pool.release(&vm).is_some());
    pool.set_host_state(&host("b"), HostState::Schedulable).unwrap();
    assert_eq!(
        place(&mut pool, &Request::shared(1, 1024), "least-load-fit").unwrap(),
        [gpu("b", 0)]
    );
}

#[test]
fn a_tainted_gpu_keeps_its_cgpus_and_takes_no_new_ones() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192, 8192]);
    let vm = VmId::new_random();
    assert_eq!(place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap(), [gpu("a", 0)]);
    pool.place(vm, &Request::shared(1, 1024), "first-fit").unwrap();
    pool.set_gpu_taint(&gpu("a", 0), Some("XID 79".into())).unwrap();
    pool.audit().unwrap();
    for policy in ["first-fit", "best-fit", "least-load-fit", "fewer-jobs-gpu", "fewer-jobs-node"] {
        assert_eq!(
            place(&mut pool, &Request::shared(1, 1024), policy).unwrap(),
            [gpu("a", 1)],
            "{policy}"
        );
    }
    let usage = pool.gpu_usage();
    assert_eq!((usage[0].cgpus, usage[0].taint.as_deref()), (2, Some("XID 79")));
    // Exclusive and local requests skip it too; releasing from it still works.
    assert!(matches!(
        place(&mut pool, &Request::exclusive(2), "first-fit"),
        Err(Error::InsufficientCapacity(_))
    ));
    assert!(pool.release(&vm).is_some());
    pool.set_gpu_taint(&gpu("a", 0), None).unwrap();
    let placed = place(&mut pool, &Request::shared(1, 1024), "least-load-fit").unwrap();
    assert_eq!(placed, [gpu("a", 0)], "untainted, the emptiest GPU again");
    assert!(pool.set_gpu_taint(&gpu("a", 9), None).is_err());
}

#[test]
fn release_restores_exactly_and_is_idempotent() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    place(&mut pool, &Request::shared(3, 3000), "least-load-fit").unwrap();
    let gpus_before = pool.gpu_usage();
    let hosts_before = pool.host_usage();
    let vm = VmId::new_random();
    let placement = pool.place(vm, &Request::shared(5, 2048), "fewer-jobs-gpu").unwrap();
    assert_eq!(pool.release(&vm), Some(placement));
    assert_eq!(pool.gpu_usage(), gpus_before);
    assert_eq!(pool.host_usage(), hosts_before);
    assert_eq!(pool.release(&vm), None);
    assert_eq!(pool.release(&VmId::new_random()), None);
    assert_eq!(pool.gpu_usage(), gpus_before);
}

#[test]
fn a_vm_cannot_be_placed_twice() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    let vm = VmId::new_random();
    pool.place(vm, &Request::exclusive(1), DEFAULT_POLICY).unwrap();
    assert!(matches!(
        pool.place(vm, &Request::exclusive(1), DEFAULT_POLICY),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn restore_replays_stored_placements_and_rejects_what_no_longer_fits() {
    let mut original = Pool::new();
    paper_testbed(&mut original);
    let a = original.place(VmId::new_random(), &Request::shared(3, 4096), "first-fit").unwrap();
    let b = original.place(VmId::new_random(), &Request::exclusive(1), "first-fit").unwrap();
    let mut replica = Pool::new();
    paper_testbed(&mut replica);
    replica.restore(b.clone()).unwrap();
    replica.restore(a.clone()).unwrap();
    replica.restore(a.clone()).unwrap();
    assert_eq!(replica.gpu_usage(), original.gpu_usage());
    assert_eq!(replica.host_usage(), original.host_usage());
    replica.audit().unwrap();
    // A placement on a GPU that is already exclusive does not fit: rejected, nothing changed.
    let mut clash = b;
    clash.vm = VmId::new_random();
    let before = replica.gpu_usage();
    assert!(matches!(replica.restore(clash), Err(Error::Conflict(_))));
    let mut too_big = a;
    too_big.vm = VmId::new_random();
    assert!(matches!(replica.restore(too_big), Err(Error::Conflict(_))));
    assert_eq!(replica.gpu_usage(), before);
    replica.audit().unwrap();
}

/// A pool prepared after its placements were restored (a service's start) decides as one whose
/// indexes were kept while they were restored, and as the reference that scans every GPU.
#[test]
fn preparing_after_a_restore_decides_as_indexes_kept_all_along() {
    let testbed = |pool: &mut Pool| {
        paper_testbed(pool);
        add_gpu_host(pool, "compute-gpu2", &[16384, 8192]);
        add_gpu_host(pool, "compute-gpu3", &[8192, 8192, 8192]);
    };
    let mut original = Pool::new();
    testbed(&mut original);
    let mut stored = Vec::new();
    for (request, policy) in [
        (Request::shared(3, 4096), "first-fit"),
        (Request::exclusive(1), "best-fit"),
        (Request::shared(2, 2048), "fewer-jobs-node+best-fit"),
    ] {
        stored.push(original.place(VmId::new_random(), &request, policy).unwrap());
    }
    let replica = |selector: Selector, prepare_before: bool, prepare_after: bool| {
        let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
        testbed(&mut pool);
        if prepare_before {
            pool.prepare("fewer-jobs-node+best-fit").unwrap();
        }
        for placement in &stored {
            pool.restore(placement.clone()).unwrap();
        }
        if prepare_after {
            pool.prepare("fewer-jobs-node+best-fit").unwrap();
        }
        pool.audit().unwrap();
        pool
    };
    let mut pools = [
        replica(Selector::Indexed, true, false),
        replica(Selector::Indexed, false, true),
        replica(Selector::Scan, false, false),
    ];
    let unknown = pools[0].prepare("no-such-policy");
    assert!(matches!(unknown, Err(Error::InvalidRequest { field: "policy", .. })));
    let vms: Vec<VmId> = (0..12).map(|_| VmId::new_random()).collect();
    let policies = ["fewer-jobs-node+best-fit", "fewer-jobs-node+first-fit", "best-fit"];
    let decisions: Vec<Vec<_>> = pools
        .iter_mut()
        .map(|pool| {
            let decided = vms
                .iter()
                .zip(policies.iter().cycle())
                .map(|(vm, policy)| pool.place(*vm, &Request::shared(1, 1024), policy).unwrap())
                .collect();
            pool.audit().unwrap();
            decided
        })
        .collect();
    assert_eq!(decisions[0], decisions[2]);
    assert_eq!(decisions[1], decisions[2]);
}

#[test]
fn invalid_requests_name_the_field_and_change_nothing() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap();
    let before = pool.gpu_usage();
    let cases: Vec<(Request, &str, &str)> = vec![
        (Request::exclusive(0), "first-fit", "ncgpus"),
        (Request::exclusive(100_000), "first-fit", "ncgpus"),
        (Request { gpu_memory_mib: None, ..Request::shared(1, 1) }, "first-fit", "gpu_memory_mib"),
        (Request::shared(1, 0), "first-fit", "gpu_memory_mib"),
        (Request::shared(1, 8193), "first-fit", "gpu_memory_mib"),
        (
            Request { gpu_memory_mib: Some(9000), ..Request::exclusive(1) },
            "first-fit",
            "gpu_memory_mib",
        ),
        (Request::exclusive(1), "worst-fit", "policy"),
        (Request::exclusive(5).with_locality(Locality::Local), "first-fit", "ncgpus"),
        (
            Request::shared(5, 1024).with_locality(Locality::Local).with_distinct_gpus(),
            "first-fit",
            "ncgpus",
        ),
        (Request::shared(9, 4096).with_locality(Locality::Local), "first-fit", "ncgpus"),
    ];
    for (request, policy, expected_field) in cases {
        match pool.place(VmId::new_random(), &request, policy) {
            Err(Error::InvalidRequest { field, reason }) => {
                assert_eq!(field, expected_field, "{request:?}: {reason}");
                assert!(!reason.is_empty());
            }
            other => panic!(
                "{request:?} under {policy}: expected invalid {expected_field}, got {other:?}"
            ),
        }
        assert_eq!(pool.gpu_usage(), before);
    }
    pool.audit().unwrap();
}

#[test]
fn an_empty_pool_reports_no_capacity() {
    let mut pool = Pool::new();
    pool.add_host(host("rg"), HostKind::ComputeRgpu).unwrap();
    let err = place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap_err();
    assert!(matches!(err, Error::InsufficientCapacity(_)), "{err:?}");
}

#[test]
fn inventory_is_checked_and_ordered_by_host_then_index() {
    let mut pool = Pool::new();
    pool.add_host(host("rg"), HostKind::ComputeRgpu).unwrap();
    pool.add_host(host("cg"), HostKind::ComputeGpu).unwrap();
    pool.add_host(host("cg"), HostKind::ComputeGpu).unwrap();
    assert!(matches!(pool.add_host(host("cg"), HostKind::Compute), Err(Error::Conflict(_))));
    let cg = host("cg");
    let err = pool.add_gpu(gpu_spec(&host("rg"), 0, 8192)).unwrap_err();
    assert!(matches!(err, Error::InvalidInventory { field: "host", .. }), "{err:?}");
    let err = pool.add_gpu(gpu_spec(&host("nowhere"), 0, 8192)).unwrap_err();
    assert!(matches!(err, Error::InvalidInventory { field: "host", .. }), "{err:?}");
    let err = pool.add_gpu(gpu_spec(&cg, 0, 0)).unwrap_err();
    assert!(matches!(err, Error::InvalidInventory { field: "memory_mib", .. }), "{err:?}");
    // Registered out of order, placed in pool order.
    pool.add_gpu(gpu_spec(&cg, 2, 8192)).unwrap();
    place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap();
    pool.add_gpu(gpu_spec(&cg, 0, 8192)).unwrap();
    pool.add_gpu(gpu_spec(&cg, 0, 8192)).unwrap();
    let mut clash = gpu_spec(&cg, 0, 8192);
    clash.id = GpuId::new("other").unwrap();
    let err = pool.add_gpu(clash).unwrap_err();
    assert!(matches!(err, Error::InvalidInventory { field: "index", .. }), "{err:?}");
    assert_eq!(place(&mut pool, &Request::shared(1, 1024), "first-fit").unwrap(), [gpu("cg", 0)]);
    let indexes: Vec<u32> = pool.gpu_usage().iter().map(|g| g.index).collect();
    assert_eq!(indexes, [0, 2]);
    assert!(matches!(pool.remove_gpu(&gpu("cg", 2)), Err(Error::Conflict(_))));
    pool.audit().unwrap();
}

#[test]
fn removing_an_idle_gpu_takes_it_out_of_scheduling() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg", &[8192, 8192]);
    place(&mut pool, &Request::exclusive(1), "first-fit").unwrap();
    pool.remove_gpu(&gpu("cg", 1)).unwrap();
    assert!(matches!(
        place(&mut pool, &Request::exclusive(1), "first-fit"),
        Err(Error::InsufficientCapacity(_))
    ));
    pool.audit().unwrap();
}

/// What could fit on an empty pool: today's schedulable, untainted, healthy GPUs, with the
/// request's locality and distinct-GPU rules; whatever is booked now does not count.
#[test]
fn could_ever_fit_counts_the_gpus_that_take_new_cgpus_as_if_empty() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192, 8192]);
    add_gpu_host(&mut pool, "b", &[16384]);
    let fits = |pool: &mut Pool, request: Request| pool.could_ever_fit(&request, None);
    assert!(fits(&mut pool, Request::exclusive(3)));
    assert!(!fits(&mut pool, Request::exclusive(4)));
    assert!(fits(&mut pool, Request::exclusive(2).with_locality(Locality::Local)));
    assert!(!fits(&mut pool, Request::exclusive(3).with_locality(Locality::Local)));
    // Shared: 16 of 2,048 MiB on host a and b alike, but only 3 on distinct GPUs.
    assert!(fits(&mut pool, Request::shared(16, 2048)));
    assert!(!fits(&mut pool, Request::shared(17, 2048).with_locality(Locality::Local)));
    assert!(!fits(&mut pool, Request::shared(4, 2048).with_distinct_gpus()));
    assert!(!fits(&mut pool, Request::shared(2, 10_000)));
    assert!(
        !fits(&mut pool, Request::exclusive(1).with_locality(Locality::Remote)),
        "no rgpu host"
    );
    // Bookings do not count; taints, health and drains do.
    place(&mut pool, &Request::exclusive(3), "first-fit").unwrap();
    assert!(fits(&mut pool, Request::exclusive(3)));
    pool.set_gpu_taint(&gpu("a", 0), Some("XID 79".into())).unwrap();
    assert!(!fits(&mut pool, Request::exclusive(3)));
    pool.set_gpu_taint(&gpu("a", 0), None).unwrap();
    pool.set_gpu_health(&gpu("b", 0), Some("ECC".into())).unwrap();
    assert!(!fits(&mut pool, Request::exclusive(3)));
    pool.set_gpu_health(&gpu("b", 0), None).unwrap();
    pool.set_host_state(&host("a"), HostState::Drained).unwrap();
    assert!(!fits(&mut pool, Request::exclusive(2)));
    assert!(fits(&mut pool, Request::exclusive(1)));
    assert!(pool.could_ever_fit(&Request::exclusive(1), Some(&host("b"))));
    assert!(!pool.could_ever_fit(&Request::exclusive(1), Some(&host("a"))));
}

/// `frag-gradient` keeps room for the kinds of cGPU the pool runs where best fit strands it: with
/// half GPUs common, a fifth goes to an idle GPU rather than cut the room of a half on a GPU that
/// has one (best fit's choice), and the pool's fragmentation counts what best fit lost.
#[test]
fn frag_gradient_keeps_room_for_the_common_kind_and_the_gauge_counts_what_is_lost() {
    for selector in [Selector::Indexed, Selector::Scan, Selector::SortEachRequest] {
        let build = || {
            let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
            add_gpu_host(&mut pool, "cg", &[10_000, 10_000, 10_000, 10_000]);
            assert_eq!(pool.fragmentation().mix_cgpus, 0);
            assert_eq!(pool.fragmentation().fragmented_gpus, 0.0, "no mix, no fragment");
            // GPU0 full of halves, GPU1 a half left, GPU2 6,000 left, GPU3 idle.
            for (memory, policy) in [
                (5000, "best-fit"),
                (5000, "best-fit"),
                (5000, "least-load-fit"),
                (4000, "least-load-fit"),
            ] {
                place(&mut pool, &Request::shared(1, memory), policy).unwrap();
            }
            pool
        };
        let (mut packed, mut graded) = (build(), build());
        let before = packed.fragmentation();
        assert_eq!(before.mix_cgpus, 4);
        assert_eq!(before.fragmented_gpus, 0.0, "every free GPU fits a half and a 40%");
        assert!((before.free_gpus - 2.1).abs() < 1e-9, "{before:?}");
        let fifth = Request::shared(1, 2000);
        assert_eq!(place(&mut packed, &fifth, "best-fit").unwrap()[0], gpu("cg", 1));
        assert_eq!(place(&mut graded, &fifth, "frag-gradient").unwrap()[0], gpu("cg", 3));
        // Best fit left GPU1 3,000: too small for the halves and the 40% (4 of the 5 cGPUs).
        let lost = packed.fragmentation();
        assert!((lost.fragmented_gpus - 0.3 * 4.0 / 5.0).abs() < 1e-9, "{lost:?}");
        assert_eq!(graded.fragmentation().fragmented_gpus, 0.0);
        // What no GPU takes is never a fragment: a drained host's GPUs count nowhere.
        packed.set_host_state(&host("cg"), HostState::Drained).unwrap();
        assert_eq!(packed.fragmentation().free_gpus, 0.0);
    }
}
