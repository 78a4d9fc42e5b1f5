//! Fencing bookings and re-homing cGPUs (issue [4/5]): capacity never freed while a route may
//! still be live, a re-homed cGPU keeping its index, all-or-nothing refusals.

mod common;

use common::*;
use gpgpums::seeded::SplitMix64;
use gpgpums::{Error, HostState, Mode, Pool, Rehome, Request, Selector, VmId};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

fn allocated(pool: &Pool) -> u64 {
    pool.gpu_usage().iter().map(|g| g.allocated_mib).sum()
}

#[test]
fn a_fence_keeps_the_capacity_of_a_vm_s_cgpus_until_it_is_released() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "h", &[8192; 2]);
    let (id, fence) = (vm(1), vm(100));
    pool.place(id, &Request::exclusive(2), "first-fit").unwrap();
    let moved = pool.fence(&id, &[0, 1], fence).unwrap();
    assert_eq!(moved.len(), 2);
    pool.audit().unwrap();
    assert!(pool.placement(&id).is_none(), "the VM holds nothing any more");
    assert_eq!(allocated(&pool), 2 * 8192, "the fence holds the capacity");
    let refused = pool.place(vm(2), &Request::exclusive(1), "first-fit").unwrap_err();
    assert!(matches!(refused, Error::InsufficientCapacity(_)), "{refused}");
    pool.release(&fence).unwrap();
    pool.audit().unwrap();
    assert_eq!(allocated(&pool), 0);
    pool.place(vm(2), &Request::exclusive(2), "first-fit").unwrap();
}

#[test]
fn fencing_part_of_a_vm_keeps_the_rest_and_refusals_change_nothing() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "h", &[8192; 4]);
    let (id, fence) = (vm(1), vm(100));
    pool.place(id, &Request::shared(3, 1024), "first-fit").unwrap();
    pool.fence(&id, &[1], fence).unwrap();
    let held: Vec<u32> = pool.placement(&id).unwrap().cgpus.iter().map(|c| c.index).collect();
    assert_eq!(held, vec![0, 2]);
    pool.audit().unwrap();

    let (changes, usage) = (pool.changes(), pool.gpu_usage());
    // An index the VM does not hold, or that the fence already holds, moves nothing at all.
    assert!(matches!(pool.fence(&id, &[0, 7], fence), Err(Error::Conflict(_))));
    pool.fence(&id, &[0], vm(101)).unwrap();
    let usage_after = pool.gpu_usage();
    // One holder's cGPUs may move to another holder.
    pool.fence(&vm(101), &[0], fence).unwrap();
    pool.fence(&id, &[2], vm(102)).unwrap();
    assert!(pool.placement(&id).is_none());
    assert!(matches!(pool.fence(&id, &[2], fence), Err(Error::Conflict(_))));
    assert_ne!(pool.changes(), changes);
    assert_eq!(usage_after.iter().map(|g| g.allocated_mib).sum::<u64>(), 3 * 1024);
    assert_eq!(usage.iter().map(|g| g.allocated_mib).sum::<u64>(), 3 * 1024);
    pool.audit().unwrap();
}

#[test]
fn a_rehomed_cgpu_keeps_its_index_leaves_its_gpu_and_its_old_booking_waits_in_a_fence() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192; 2]);
    add_gpu_host(&mut pool, "b", &[8192; 2]);
    let (id, fence) = (vm(1), vm(100));
    let placed = pool.place(id, &Request::shared(2, 2048), "first-fit").unwrap();
    let leaving = placed.cgpus[1].gpu.clone();
    pool.set_gpu_taint(&leaving, Some("XID 79".into())).unwrap();
    let moved = pool.rehome(&id, 1, "first-fit", &Rehome::default(), Some(fence)).unwrap();
    assert_eq!(moved.index, 1);
    assert_ne!(moved.gpu, leaving);
    assert_eq!(moved.memory_mib, 2048);
    assert_eq!(moved.mode, Mode::Shared);
    let now = &pool.placement(&id).unwrap().cgpus;
    assert_eq!(now.iter().map(|c| c.index).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(now[1], moved);
    let fenced = &pool.placement(&fence).unwrap().cgpus;
    assert_eq!(fenced.len(), 1);
    assert_eq!(fenced[0].gpu, leaving);
    pool.audit().unwrap();
    assert_eq!(allocated(&pool), 3 * 2048, "the old booking is kept until the fence goes");
    pool.release(&fence).unwrap();
    assert_eq!(allocated(&pool), 2 * 2048);
    pool.audit().unwrap();
}

#[test]
fn an_untainted_gpu_is_left_too_and_with_no_fence_its_capacity_is_free_at_once() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192; 2]);
    let id = vm(1);
    let placed = pool.place(id, &Request::exclusive(1), "first-fit").unwrap();
    let before = placed.cgpus[0].gpu.clone();
    let moved = pool.rehome(&id, 0, "first-fit", &Rehome::default(), None).unwrap();
    assert_ne!(moved.gpu, before, "evacuating a healthy GPU still leaves it");
    assert_eq!(moved.memory_mib, 8192);
    pool.audit().unwrap();
    // The GPU left is free again: an exclusive cGPU takes it.
    let other = pool.place(vm(2), &Request::exclusive(1), "first-fit").unwrap();
    assert_eq!(other.cgpus[0].gpu, before);
}

#[test]
fn a_rehomed_cgpu_keeps_its_gpu_number_at_the_rcuda_server() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192]);
    let b = host("b");
    pool.add_host(b.clone(), gpgpums::HostKind::ComputeGpu).unwrap();
    // Host b's two GPUs sit behind one rCUDA server, as its devices 0 and 1.
    for index in 0..2 {
        let mut spec = gpu_spec(&b, index, 8192);
        spec.rcuda.port = 9000;
        spec.rcuda.gpu_number = index;
        pool.add_gpu(spec).unwrap();
    }
    let id = vm(1);
    pool.place(id, &Request::exclusive(1), "first-fit").unwrap();
    assert_eq!(pool.placement(&id).unwrap().cgpus[0].gpu, gpu("a", 0));
    let moved = pool.rehome(&id, 0, "first-fit", &Rehome::default(), None).unwrap();
    assert_eq!(moved.gpu, gpu("b", 0), "device 0 like before, not device 1");
    // GPU a taken: only b's device 1 is free, and it is not the cGPU's device number.
    pool.place(vm(2), &Request::exclusive(1), "first-fit").unwrap();
    let usage = pool.gpu_usage();
    assert!(matches!(
        pool.rehome(&id, 0, "first-fit", &Rehome::default(), None),
        Err(Error::InsufficientCapacity(_))
    ));
    assert_eq!(pool.gpu_usage(), usage);
    pool.release(&vm(2)).unwrap();
    let back = pool.rehome(&id, 0, "first-fit", &Rehome::default(), None).unwrap();
    assert_eq!(back.gpu, gpu("a", 0));
    pool.audit().unwrap();
}

#[test]
fn rehoming_to_nowhere_changes_nothing() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192; 2]);
    add_gpu_host(&mut pool, "b", &[8192]);
    let id = vm(1);
    pool.place(id, &Request::exclusive(2), "first-fit").unwrap();
    pool.place(vm(2), &Request::exclusive(1), "first-fit").unwrap();
    let (changes, usage) = (pool.changes(), pool.gpu_usage());
    let refused = pool.rehome(&id, 0, "first-fit", &Rehome::default(), Some(vm(100))).unwrap_err();
    assert!(matches!(refused, Error::InsufficientCapacity(_)), "{refused}");
    assert_eq!(pool.changes(), changes);
    assert_eq!(pool.gpu_usage(), usage);
    assert!(pool.placement(&vm(100)).is_none());
    // A host that is down takes nothing either.
    pool.release(&vm(2)).unwrap();
    pool.set_host_state(&host("b"), HostState::Unavailable).unwrap();
    let refused = pool.rehome(&id, 0, "first-fit", &Rehome::default(), None).unwrap_err();
    assert!(matches!(refused, Error::InsufficientCapacity(_)), "{refused}");
    pool.audit().unwrap();
}

#[test]
fn a_local_vm_s_cgpu_stays_on_its_host_and_distinct_gpus_stay_distinct() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "a", &[8192; 3]);
    add_gpu_host(&mut pool, "b", &[8192; 3]);
    let id = vm(1);
    let placed =
        pool.place(id, &Request::shared(2, 1024).with_distinct_gpus(), "first-fit").unwrap();
    let (first, second) = (placed.cgpus[0].gpu.clone(), placed.cgpus[1].gpu.clone());
    let on_a = host("a");
    let to = Rehome { on_host: Some(&on_a), distinct_gpus: true, ..Rehome::default() };
    let moved = pool.rehome(&id, 0, "first-fit", &to, None).unwrap();
    assert_eq!(moved.host, on_a);
    assert!(moved.gpu != first && moved.gpu != second, "{moved:?}");
    // With a's third GPU taken, a distinct re-home of cGPU 1 has nowhere to go on a.
    pool.place(vm(2), &Request::exclusive(1), "first-fit").unwrap();
    let usage = pool.gpu_usage();
    assert!(matches!(
        pool.rehome(&id, 1, "first-fit", &to, None),
        Err(Error::InsufficientCapacity(_))
    ));
    assert_eq!(pool.gpu_usage(), usage);
    pool.audit().unwrap();
}

/// Random places, re-homes, fences and releases: the books always add up, and the indexed pool
/// decides exactly as the scanning reference does.
#[test]
fn random_moves_keep_the_books_and_the_selectors_agree() {
    for seed in 0..40u64 {
        let mut rng = SplitMix64::new(seed);
        let mut pools = [
            Pool::with(Default::default(), Selector::Indexed),
            Pool::with(Default::default(), Selector::Scan),
        ];
        for pool in &mut pools {
            add_gpu_host(pool, "a", &[8192, 4096, 8192]);
            add_gpu_host(pool, "b", &[8192, 8192]);
        }
        let mut vms: Vec<VmId> = Vec::new();
        let mut holders = 0u128;
        for step in 0..150u128 {
            let op = rng.below(5);
            let outcomes: [String; 2] = if op < 2 || vms.is_empty() {
                let id = vm(step);
                let request = if rng.below(3) == 0 {
                    Request::exclusive(1 + rng.below(2) as u32)
                } else {
                    Request::shared(1 + rng.below(3) as u32, 512 * (1 + rng.below(8)))
                };
                let out = pools
                    .each_mut()
                    .map(|p| format!("{:?}", p.place(id, &request, "least-load-fit")));
                if out[0].starts_with("Ok") {
                    vms.push(id);
                }
                out
            } else {
                let id = vms[rng.below(vms.len() as u64) as usize];
                let index = rng.below(3) as u32;
                holders += 1;
                let holder = vm(1_000_000 + holders);
                match op {
                    2 => {
                        let fenced = (rng.below(2) == 0).then_some(holder);
                        let to = Rehome::default();
                        pools
                            .each_mut()
                            .map(|p| format!("{:?}", p.rehome(&id, index, "best-fit", &to, fenced)))
                    }
                    3 => pools.each_mut().map(|p| format!("{:?}", p.fence(&id, &[index], holder))),
                    _ => {
                        let gone = if rng.below(2) == 0 {
                            id
                        } else {
                            vm(1_000_000 + rng.below(holders as u64) as u128)
                        };
                        pools.each_mut().map(|p| format!("{:?}", p.release(&gone)))
                    }
                }
            };
            assert_eq!(outcomes[0], outcomes[1], "seed {seed} step {step}");
            for pool in &pools {
                pool.audit().unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            }
        }
    }
}
