//! Compute shares (issue [1/5], part 4): a shared cGPU may ask for a percent of its GPU's SMs,
//! which only a GPU whose host runs MPS can hold it to. The shares on one GPU never pass 100, a
//! GPU with shares takes no cGPU without one (it would use the SMs unbounded), a request for a
//! share where no GPU can hold it is refused naming `compute_percent`, and a refusal changes
//! nothing. Every selector decides alike.

mod common;

use common::*;
use gpgpums::{
    CgpuAssignment, Error, GpuAttributes, HostKind, Locality, Mode, Placement, Pool, Rehome,
    Request, Selector, VmHost, VmId,
};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

const SELECTORS: [Selector; 3] = [Selector::Indexed, Selector::Scan, Selector::SortEachRequest];

/// A host whose GPUs (80 GiB each) are served by managed servers, under MPS when `mps`.
fn add_managed_host(pool: &mut Pool, name: &str, gpus: u32, mps: bool) {
    let id = host(name);
    pool.add_host(id.clone(), HostKind::ComputeGpu).unwrap();
    for index in 0..gpus {
        let mut spec = gpu_spec(&id, index, 81920);
        spec.attributes = GpuAttributes { managed: true, mps, ..GpuAttributes::default() };
        pool.add_gpu(spec).unwrap();
    }
}

fn share(n: u32, percent: u32) -> Request {
    Request::shared(n, 4096).with_compute_percent(percent)
}

fn field_of(result: Result<impl std::fmt::Debug, Error>) -> &'static str {
    match result {
        Err(Error::InvalidRequest { field, .. }) => field,
        other => panic!("not refused as invalid: {other:?}"),
    }
}

#[test]
fn the_shares_on_one_gpu_never_pass_100_percent() {
    for selector in SELECTORS {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        add_managed_host(&mut pool, "mps1", 1, true);
        let first = pool.place(vm(1), &share(1, 40), "first-fit").unwrap();
        assert_eq!(first.cgpus[0].compute_percent, Some(40));
        pool.place(vm(2), &share(1, 60), "first-fit").unwrap();
        // 100 percent are given: even 1 more waits for a share to end.
        let changes = pool.changes();
        let err = pool.place(vm(3), &share(1, 1), "first-fit");
        let Err(Error::InsufficientCapacity(shortfall)) = err else { panic!("{err:?}") };
        assert!(!shortfall.never_fits, "{selector:?}: a share comes free when a VM ends");
        assert_eq!(pool.changes(), changes, "a refusal changes nothing");
        pool.release(&vm(1));
        pool.place(vm(3), &share(1, 40), "first-fit").unwrap();
        pool.audit().unwrap();
    }
}

#[test]
fn one_request_counts_its_own_shares_on_a_gpu() {
    for selector in SELECTORS {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        add_managed_host(&mut pool, "mps1", 1, true);
        // Memory would take three; their shares take two.
        let err = pool.place(vm(1), &share(3, 40), "best-fit");
        let Err(Error::InsufficientCapacity(shortfall)) = err else { panic!("{err:?}") };
        assert_eq!(shortfall.placeable, 2, "{selector:?}");
        assert!(shortfall.never_fits, "{selector:?}: no release could ever make room");
        pool.audit().unwrap();
        let placed = pool.place(vm(1), &share(2, 50), "best-fit").unwrap();
        assert_eq!(placed.cgpus.len(), 2);
        pool.audit().unwrap();
    }
}

#[test]
fn a_share_goes_only_where_mps_runs_and_is_refused_naming_its_field_where_none_does() {
    for selector in SELECTORS {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        add_managed_host(&mut pool, "plain", 2, false);
        assert_eq!(field_of(pool.place(vm(1), &share(1, 30), "first-fit")), "compute_percent");
        assert!(pool.placements().next().is_none(), "{selector:?}: nothing booked");
        // A host with MPS joins after the plain one: first-fit would take the plain GPU first.
        add_managed_host(&mut pool, "mps1", 1, true);
        let placed = pool.place(vm(1), &share(1, 30), "first-fit").unwrap();
        assert_eq!(placed.cgpus[0].host, host("mps1"), "{selector:?}");
        // Without a share, the plain GPUs come first as before.
        let plain = pool.place(vm(2), &Request::shared(1, 4096), "first-fit").unwrap();
        assert_eq!(plain.cgpus[0].host, host("plain"));
        assert_eq!(plain.cgpus[0].compute_percent, None);
        pool.audit().unwrap();
    }
}

#[test]
fn shares_and_time_slicing_never_meet_on_one_gpu() {
    for selector in SELECTORS {
        let mut pool = Pool::with(gpgpums::PolicyRegistry::builtin(), selector);
        add_managed_host(&mut pool, "mps1", 2, true);
        let plain = pool.place(vm(1), &Request::shared(1, 4096), "first-fit").unwrap();
        let gpu0 = plain.cgpus[0].gpu.clone();
        // A share keeps off the GPU whose cGPU without one would use its SMs unbounded.
        let shared = pool.place(vm(2), &share(1, 30), "first-fit").unwrap();
        assert_ne!(shared.cgpus[0].gpu, gpu0, "{selector:?}");
        // And a cGPU without a share keeps off the GPU with shares.
        let plain = pool.place(vm(3), &Request::shared(1, 4096), "first-fit").unwrap();
        assert_eq!(plain.cgpus[0].gpu, gpu0, "{selector:?}");
        // Both GPUs taken one way or the other: a second share fits only beside the first.
        let more = pool.place(vm(4), &share(1, 70), "first-fit").unwrap();
        assert_eq!(more.cgpus[0].gpu, shared.cgpus[0].gpu);
        assert!(matches!(
            pool.place(vm(5), &share(1, 1), "first-fit"),
            Err(Error::InsufficientCapacity(_))
        ));
        // An exclusive cGPU has a GPU whole, under MPS or not, and asks no share.
        pool.release(&vm(1));
        pool.release(&vm(3));
        let whole = pool.place(vm(6), &Request::exclusive(1), "first-fit").unwrap();
        assert_eq!(whole.cgpus[0].gpu, gpu0);
        assert_eq!(whole.cgpus[0].compute_percent, None);
        pool.audit().unwrap();
    }
}

#[test]
fn bad_shares_are_refused_naming_the_field_and_change_nothing() {
    let mut pool = Pool::new();
    add_managed_host(&mut pool, "mps1", 1, true);
    let changes = pool.changes();
    for bad in [0, 101, 255] {
        assert_eq!(field_of(pool.place(vm(1), &share(1, bad), "first-fit")), "compute_percent");
    }
    let exclusive = Request::exclusive(1).with_compute_percent(50);
    assert_eq!(field_of(pool.place(vm(1), &exclusive, "first-fit")), "compute_percent");
    assert_eq!(pool.changes(), changes);
    // A GPU cannot claim MPS without managed servers: the agent sets neither share nor limit.
    let mut spec = gpu_spec(&host("mps1"), 7, 8192);
    spec.attributes = GpuAttributes { mps: true, ..GpuAttributes::default() };
    let Err(Error::InvalidInventory { field, .. }) = pool.add_gpu(spec) else { panic!() };
    assert_eq!(field, "mps");
}

#[test]
fn attaching_a_share_to_a_local_vm_on_a_host_without_mps_is_refused_naming_the_field() {
    let mut pool = Pool::new();
    add_managed_host(&mut pool, "plain", 2, false);
    add_managed_host(&mut pool, "mps1", 1, true);
    let local = Request::shared(1, 4096).with_locality(Locality::Local);
    let placed = pool.place(vm(1), &local, "first-fit").unwrap();
    assert_eq!(placed.vm_host, VmHost::Pinned(host("plain")));
    let more = local.clone().with_compute_percent(20);
    let on = host("plain");
    assert_eq!(field_of(pool.attach(vm(1), &more, "first-fit", Some(&on))), "compute_percent");
    // On the MPS host, the same attach takes its share.
    let placed = pool.place(vm(2), &share(1, 20).with_locality(Locality::Local), "first-fit");
    assert_eq!(placed.unwrap().vm_host, VmHost::Pinned(host("mps1")));
    let on = host("mps1");
    let attached = pool.attach(vm(2), &more, "first-fit", Some(&on)).unwrap();
    assert_eq!(attached[0].compute_percent, Some(20));
    pool.detach(&vm(2), attached[0].index).unwrap();
    pool.audit().unwrap();
}

#[test]
fn restored_shares_are_checked_and_a_rehomed_cgpu_keeps_its_share() {
    let mut pool = Pool::new();
    add_managed_host(&mut pool, "mps1", 1, true);
    add_managed_host(&mut pool, "mps2", 1, true);
    let cgpu = |index: u32, gpu: &str, percent: u8| CgpuAssignment {
        index,
        gpu: gpgpums::GpuId::on_host(&host(gpu), 0),
        host: host(gpu),
        memory_mib: 4096,
        mode: Mode::Shared,
        compute_percent: Some(percent),
        rcuda: gpu_spec(&host(gpu), 0, 1).rcuda,
    };
    let placement = |n: u128, cgpus: Vec<CgpuAssignment>| Placement {
        vm: vm(n),
        policy: "first-fit".into(),
        vm_host: VmHost::AnyAgentHost,
        cgpus,
        vm_resources: None,
    };
    pool.restore(placement(1, vec![cgpu(0, "mps1", 60)])).unwrap();
    // Stored shares past 100 on one GPU are a conflict, not a silent overbooking.
    let over = placement(2, vec![cgpu(0, "mps1", 30), cgpu(1, "mps1", 30)]);
    assert!(matches!(pool.restore(over), Err(Error::Conflict(_))));
    pool.audit().unwrap();
    let moved = pool.rehome(&vm(1), 0, "first-fit", &Rehome::default(), None).unwrap();
    assert_eq!(moved.host, host("mps2"));
    assert_eq!(moved.compute_percent, Some(60));
    // The share moved with it: mps1 takes 100 percent again.
    pool.place(vm(3), &share(1, 100), "first-fit").unwrap();
    pool.audit().unwrap();
}
