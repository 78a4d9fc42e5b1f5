//! Partitions of GPUs (MIG instances, issue [3/6] part 4): each is a GPU of its own in the pool,
//! a partitioned GPU takes no cGPU whole, a partition takes none while its parent holds cGPUs
//! booked whole, the parent's taint, health and host cover its partitions, and bad partitions
//! are refused as other bad inventory is.

mod common;

use common::*;
use gpgpums::{
    Error, GpuConstraints, GpuId, HostKind, HostState, Locality, Mode, Partition, Placement, Pool,
    Request, VmId,
};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

/// h1: an A100 of 80 GiB (index 0) with two `3g.40gb` partitions (indexes 1 and 2), and a T4
/// of 16 GiB (index 3).
fn partitioned() -> Pool {
    let mut pool = Pool::new();
    let h1 = host("h1");
    pool.add_host(h1.clone(), HostKind::ComputeGpu).unwrap();
    pool.add_gpu(gpgpums::GpuSpec { model: "A100".into(), ..gpu_spec(&h1, 0, 81920) }).unwrap();
    for index in [1, 2] {
        pool.add_gpu(partition_spec(&h1, index, 0, "A100", "3g.40gb", 40960)).unwrap();
    }
    pool.add_gpu(gpgpums::GpuSpec { model: "T4".into(), ..gpu_spec(&h1, 3, 16384) }).unwrap();
    pool
}

fn gpus_of(placement: &Placement) -> Vec<GpuId> {
    placement.cgpus.iter().map(|c| c.gpu.clone()).collect()
}

fn on_models(models: &[&str]) -> GpuConstraints {
    GpuConstraints {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..Default::default()
    }
}

#[test]
fn a_partitioned_gpu_serves_through_its_partitions_only() {
    let mut pool = partitioned();
    // Three exclusive cGPUs: the two partitions and the T4, never the A100 whole.
    let placed = pool.place(vm(1), &Request::exclusive(3), "first-fit").unwrap();
    let gpus = gpus_of(&placed);
    assert_eq!(gpus, [gpu("h1", 1), gpu("h1", 2), gpu("h1", 3)]);
    assert_eq!(placed.cgpus[0].memory_mib, 40960, "an exclusive partition books its own memory");
    pool.release(&vm(1));
    // A fourth unit does not exist, whatever is released: refused as never fitting.
    match pool.place(vm(2), &Request::exclusive(4), "first-fit") {
        Err(Error::InsufficientCapacity(s)) => assert!(s.never_fits, "{s:?}"),
        other => panic!("{other:?}"),
    }
    // The whole A100 by model: no A100 is whole, so it is no model of the pool's (its models
    // are those of the GPUs that take cGPUs).
    let whole = Request::exclusive(1).with_constraints(on_models(&["A100"]));
    match pool.place(vm(3), &whole, "first-fit") {
        Err(Error::InvalidRequest { field: "gpu_model", reason }) => {
            assert!(reason.contains("its models: A100 MIG 3g.40gb, T4"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(pool.models(), ["A100 MIG 3g.40gb", "T4"]);
    // Its partitions by theirs, under every policy.
    let part = Request::shared(2, 20480).with_constraints(on_models(&["A100 MIG 3g.40gb"]));
    for policy in pool.registry().known_names() {
        let placed = pool.place(vm(4), &part, &policy).unwrap();
        assert!(gpus_of(&placed).iter().all(|g| *g == gpu("h1", 1) || *g == gpu("h1", 2)));
        pool.release(&vm(4));
    }
    pool.audit().unwrap();
}

#[test]
fn reports_count_a_partitioned_gpu_through_its_partitions() {
    let pool = partitioned();
    let totals = pool.totals();
    assert_eq!((totals.gpus, totals.memory_mib, totals.idle_gpus), (3, 2 * 40960 + 16384, 3));
    let host = &pool.host_usage()[0];
    assert_eq!((host.gpus, host.memory_mib), (3, 2 * 40960 + 16384));
    let usage = pool.gpu_usage();
    assert_eq!(usage[0].partitions, 2);
    assert_eq!(
        usage[1].partition,
        Some(Partition { parent: gpu("h1", 0), profile: "3g.40gb".into() })
    );
}

#[test]
fn the_parents_taint_health_and_host_cover_its_partitions() {
    let one = || Request::exclusive(1).with_constraints(on_models(&["A100 MIG 3g.40gb"]));
    let mut pool = partitioned();
    pool.set_gpu_taint(&gpu("h1", 0), Some("maintenance".into())).unwrap();
    assert!(pool.place(vm(1), &one(), "least-load-fit").is_err());
    assert!(!pool.could_ever_fit(&one(), None));
    pool.set_gpu_taint(&gpu("h1", 0), None).unwrap();
    pool.place(vm(1), &one(), "least-load-fit").unwrap();
    pool.set_gpu_health(&gpu("h1", 0), Some("XID 79".into())).unwrap();
    assert!(pool.place(vm(2), &one(), "least-load-fit").is_err());
    // What it holds stays.
    assert!(pool.placement(&vm(1)).is_some());
    pool.set_gpu_health(&gpu("h1", 0), None).unwrap();
    pool.set_host_state(&host("h1"), HostState::Drained).unwrap();
    assert!(pool.place(vm(2), &one(), "least-load-fit").is_err());
    pool.set_host_state(&host("h1"), HostState::Schedulable).unwrap();
    pool.place(vm(2), &one(), "least-load-fit").unwrap();
    pool.audit().unwrap();
}

#[test]
fn partitions_wait_for_their_parents_whole_bookings_to_go() {
    let mut pool = Pool::new();
    let h1 = host("h1");
    pool.add_host(h1.clone(), HostKind::ComputeGpu).unwrap();
    pool.add_gpu(gpgpums::GpuSpec { model: "A100".into(), ..gpu_spec(&h1, 0, 81920) }).unwrap();
    pool.place(vm(1), &Request::shared(1, 1024), "best-fit").unwrap();
    // The GPU is partitioned while a cGPU holds it whole.
    pool.add_gpu(partition_spec(&h1, 1, 0, "A100", "7g.80gb", 81920)).unwrap();
    let any = Request::shared(1, 1024);
    assert!(pool.place(vm(2), &any, "best-fit").is_err(), "a partition beside its booked parent");
    assert!(pool.could_ever_fit(&any, None), "the partition takes cGPUs once the parent is free");
    pool.audit().unwrap();
    pool.release(&vm(1));
    let placed = pool.place(vm(2), &any, "best-fit").unwrap();
    assert_eq!(gpus_of(&placed), [gpu("h1", 1)]);
    // And the parent takes none whole while its partition is booked, nor after.
    assert!(pool.place(vm(3), &Request::exclusive(1), "best-fit").is_err());
    pool.audit().unwrap();
}

#[test]
fn restoring_a_parent_and_its_partition_both_booked_is_refused() {
    let mut pool = partitioned();
    let on_part = pool.place(vm(1), &Request::exclusive(1), "first-fit").unwrap();
    assert_eq!(gpus_of(&on_part), [gpu("h1", 1)]);
    let mut whole = on_part.clone();
    whole.vm = vm(2);
    whole.cgpus[0].gpu = gpu("h1", 0);
    whole.cgpus[0].memory_mib = 81920;
    let before = pool.gpu_usage();
    assert!(matches!(pool.restore(whole.clone()), Err(Error::Conflict(_))));
    assert_eq!(pool.gpu_usage(), before, "a refused restore changes nothing");
    // Once the partition is free, the parent's booking from before restores.
    pool.release(&vm(1));
    pool.restore(whole).unwrap();
    assert!(matches!(pool.restore(Placement { vm: vm(3), ..on_part }), Err(Error::Conflict(_))));
    pool.audit().unwrap();
}

#[test]
fn local_requests_count_a_hosts_partitions() {
    let mut pool = partitioned();
    let local = |n| Request::exclusive(n).with_locality(Locality::Local);
    assert!(pool.could_ever_fit(&local(3), None));
    assert!(!pool.could_ever_fit(&local(4), None));
    // Four whole GPUs on one host is refused at once: the host has three to give.
    assert!(matches!(pool.place(vm(1), &local(4), "first-fit"), Err(Error::InvalidRequest { .. })));
    let placed = pool.place(vm(1), &local(3), "first-fit").unwrap();
    assert_eq!(placed.cgpus.len(), 3);
    assert!(placed.cgpus.iter().all(|c| c.mode == Mode::Exclusive));
}

#[test]
fn bad_partitions_are_refused_naming_the_field_and_change_nothing() {
    let h1 = host("h1");
    let h2 = host("h2");
    let cases: Vec<(gpgpums::GpuSpec, &str, &str)> = vec![
        (
            partition_spec(&h1, 5, 0, "A100", "7g.80gb", 81921),
            "memory_mib",
            "bigger than its parent",
        ),
        (
            partition_spec(&h1, 5, 0, "A100", "1g.10gb", 10240),
            "memory_mib",
            "would have 92160 MiB of its 81920",
        ),
        (partition_spec(&h1, 5, 9, "A100", "1g.10gb", 1024), "partition.parent", "not registered"),
        (
            partition_spec(&h1, 5, 1, "A100", "1g.10gb", 1024),
            "partition.parent",
            "a partition itself",
        ),
        (
            partition_spec(&h1, 5, 0, "A100", "1G.10GB", 1024),
            "partition.profile",
            "no partition profile",
        ),
        (partition_spec(&h1, 5, 0, "A100", "", 1024), "partition.profile", "no partition profile"),
        (
            gpgpums::GpuSpec {
                host: h2.clone(),
                id: GpuId::on_host(&h2, 0),
                ..partition_spec(&h1, 0, 0, "A100", "1g.10gb", 1024)
            },
            "partition.parent",
            "is on host h1, not h2",
        ),
    ];
    for (spec, field, reason) in cases {
        let mut pool = partitioned();
        pool.add_host(h2.clone(), HostKind::ComputeGpu).unwrap();
        let before = (pool.gpu_usage(), pool.changes());
        match pool.add_gpu(spec.clone()) {
            Err(Error::InvalidInventory { field: f, reason: r }) => {
                assert_eq!(f, field, "{spec:?}: {r}");
                assert!(r.contains(reason), "{r}");
            }
            other => panic!("{spec:?}: {other:?}"),
        }
        assert_eq!((pool.gpu_usage(), pool.changes()), before);
    }
}

#[test]
fn a_parent_leaves_the_pool_after_its_partitions() {
    let mut pool = partitioned();
    assert!(matches!(pool.remove_gpu(&gpu("h1", 0)), Err(Error::Conflict(_))));
    pool.remove_gpu(&gpu("h1", 1)).unwrap();
    assert_eq!(pool.models(), ["A100 MIG 3g.40gb", "T4"]);
    pool.remove_gpu(&gpu("h1", 2)).unwrap();
    assert_eq!(pool.models(), ["A100", "T4"]);
    // Whole again: it takes a cGPU whole.
    let whole = Request::exclusive(1).with_constraints(on_models(&["A100"]));
    let placed = pool.place(vm(1), &whole, "first-fit").unwrap();
    assert_eq!(gpus_of(&placed), [gpu("h1", 0)]);
    pool.audit().unwrap();
}

#[test]
fn a_cgpu_rehomed_off_a_partition_leaves_its_parent_gpu() {
    let mut pool = partitioned();
    let placed = pool.place(vm(1), &Request::shared(1, 1024), "first-fit").unwrap();
    assert_eq!(gpus_of(&placed), [gpu("h1", 1)]);
    // Its sibling partition shares the GPU that fails or is evacuated: the T4 takes it.
    let moved = pool.rehome(&vm(1), 0, "first-fit", &gpgpums::Rehome::default(), None).unwrap();
    assert_eq!(moved.gpu, gpu("h1", 3));
    pool.audit().unwrap();
}
