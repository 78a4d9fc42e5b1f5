//! Progressive attach and detach of cGPUs on a VM that already holds some (dissertation 5.2.2).

mod common;

use common::*;
use gpgpums::{Error, Locality, Pool, Request, Selector, VmId, MAX_CGPUS_PER_VM};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

fn indexes(pool: &Pool, id: VmId) -> Vec<u32> {
    pool.placement(&id).map(|p| p.cgpus.iter().map(|c| c.index).collect()).unwrap_or_default()
}

#[test]
fn one_vm_grows_to_eight_4gib_cgpus_on_the_paper_testbed_and_shrinks_back() {
    let mut pool = Pool::new();
    paper_testbed(&mut pool);
    let id = vm(1);
    let four_gib = Request::shared(1, 4096);
    let first = pool.place(id, &four_gib, "least-load-fit").unwrap();
    let mut gpus = vec![first.cgpus[0].gpu.clone()];
    for _ in 1..8 {
        let added = pool.attach(id, &four_gib, "least-load-fit", None).unwrap();
        assert_eq!(added.len(), 1);
        gpus.push(added[0].gpu.clone());
        pool.audit().unwrap();
    }
    // Least-load-fit spreads the first four over the four GPUs, then doubles them up.
    let distinct: std::collections::HashSet<_> = gpus[..4].iter().collect();
    assert_eq!(distinct.len(), 4, "{gpus:?}");
    let second: std::collections::HashSet<_> = gpus[4..].iter().collect();
    assert_eq!(second, distinct);
    assert_eq!(indexes(&pool, id), (0..8).collect::<Vec<_>>());

    let changes = pool.changes();
    let usage = pool.gpu_usage();
    let ninth = pool.attach(id, &four_gib, "least-load-fit", None).unwrap_err();
    assert!(matches!(ninth, Error::InsufficientCapacity(_)), "{ninth}");
    assert_eq!(pool.changes(), changes);
    assert_eq!(pool.gpu_usage(), usage);
    assert_eq!(indexes(&pool, id).len(), 8);

    for index in (1..8).rev() {
        assert_eq!(pool.detach(&id, index).unwrap().index, index);
        pool.audit().unwrap();
    }
    assert_eq!(indexes(&pool, id), vec![0]);
    let used: u64 = pool.gpu_usage().iter().map(|g| g.allocated_mib).sum();
    assert_eq!(used, 4096);
}

#[test]
fn live_cgpus_keep_their_index_and_new_ones_take_the_lowest_free_one_last_in_order() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "h", &[8192; 4]);
    let id = vm(1);
    pool.place(id, &Request::exclusive(3), "first-fit").unwrap();
    pool.detach(&id, 1).unwrap();
    assert_eq!(indexes(&pool, id), vec![0, 2]);
    let added = pool.attach(id, &Request::exclusive(2), "first-fit", None).unwrap();
    assert_eq!(added.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1, 3]);
    // Attach order: the live ones first, as they were.
    assert_eq!(indexes(&pool, id), vec![0, 2, 1, 3]);
    assert!(pool.detach(&id, 7).is_none());
    pool.audit().unwrap();
}

#[test]
fn detaching_every_cgpu_leaves_no_placement_and_a_later_attach_starts_one() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "h", &[8192; 2]);
    let id = vm(1);
    pool.place(id, &Request::exclusive(1), "first-fit").unwrap();
    pool.detach(&id, 0).unwrap();
    assert!(pool.placement(&id).is_none());
    pool.audit().unwrap();
    let added = pool.attach(id, &Request::exclusive(2), "first-fit", None).unwrap();
    assert_eq!(added.iter().map(|c| c.index).collect::<Vec<_>>(), vec![0, 1]);
    pool.audit().unwrap();
}

#[test]
fn a_local_vm_grows_only_on_its_host() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192; 2]);
    add_gpu_host(&mut pool, "b", &[8192; 2]);
    let id = vm(1);
    let local = Request::exclusive(1).with_locality(Locality::Local);
    let placed = pool.place(id, &local, "first-fit").unwrap();
    let home = placed.cgpus[0].host.clone();
    pool.attach(id, &local, "first-fit", Some(&home)).unwrap();
    let changes = pool.changes();
    let err = pool.attach(id, &local, "first-fit", Some(&home)).unwrap_err();
    assert!(matches!(err, Error::InsufficientCapacity(_)), "{err}");
    assert_eq!(pool.changes(), changes);
    // Capacity elsewhere is untouched; the VM's cGPUs are all at home.
    assert!(pool.placement(&id).unwrap().cgpus.iter().all(|c| c.host == home));
    pool.audit().unwrap();
}

#[test]
fn distinct_gpus_keeps_new_cgpus_off_the_gpus_the_vm_already_uses() {
    for selector in [Selector::Indexed, Selector::Scan] {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        add_gpu_host(&mut pool, "h", &[8192; 3]);
        let id = vm(1);
        let shared = Request::shared(1, 1024);
        let first = pool.place(id, &shared, "best-fit").unwrap();
        // Best-fit would pack onto the same GPU; distinct GPUs forbid it.
        let added =
            pool.attach(id, &shared.clone().with_distinct_gpus(), "best-fit", None).unwrap();
        assert_ne!(added[0].gpu, first.cgpus[0].gpu);
        let two = Request::shared(2, 1024).with_distinct_gpus();
        let err = pool.attach(id, &two, "best-fit", None).unwrap_err();
        assert!(matches!(err, Error::InsufficientCapacity(_)), "{err}");
        pool.audit().unwrap();
    }
}

#[test]
fn an_attach_past_the_per_vm_limit_names_ncgpus_and_changes_nothing() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "h", &[1 << 30]);
    let id = vm(1);
    pool.place(id, &Request::shared(MAX_CGPUS_PER_VM - 1, 1), "first-fit").unwrap();
    let changes = pool.changes();
    for bad in [Request::shared(2, 1), Request::shared(0, 1)] {
        match pool.attach(id, &bad, "first-fit", None) {
            Err(Error::InvalidRequest { field: "ncgpus", .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(pool.changes(), changes);
    pool.attach(id, &Request::shared(1, 1), "first-fit", None).unwrap();
    pool.audit().unwrap();
}
