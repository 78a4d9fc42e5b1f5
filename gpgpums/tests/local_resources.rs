//! A `local` VM's CPU and memory on its GPU host (issue [2/5], `pool/stranding.rs`): a host
//! that offers too little takes no local VM whatever its GPUs, a refusal changes nothing, a
//! release gives back exactly what was booked, a restore books what runs even past a shrunken
//! offer, and `frag-gradient` keeps a host's cores for its GPUs where another policy strands
//! them. Every selector decides alike.

mod common;

use common::*;
use gpgpums::{
    Error, Locality, Placement, PolicyRegistry, Pool, Request, Resources, Selector, VmHost, VmId,
};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

const SELECTORS: [Selector; 3] = [Selector::Indexed, Selector::Scan, Selector::SortEachRequest];

fn cores(n: u64) -> Resources {
    Resources::new(n * 1000, n * 4096)
}

fn local(request: Request, needs: Resources) -> Request {
    request.with_locality(Locality::Local).with_vm_resources(needs)
}

fn pinned_host(placement: &Placement) -> &str {
    match &placement.vm_host {
        VmHost::Pinned(host) => host.as_str(),
        other => panic!("not pinned: {other:?}"),
    }
}

#[test]
fn a_local_vm_goes_only_where_its_cpu_and_memory_fit_and_gives_them_back() {
    for selector in SELECTORS {
        let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
        add_gpu_host(&mut pool, "small", &[16384; 2]);
        add_gpu_host(&mut pool, "big", &[16384; 2]);
        pool.set_host_resources(&host("small"), Some(cores(4))).unwrap();
        pool.set_host_resources(&host("big"), Some(cores(32))).unwrap();

        // First fit would take the small host's first GPU; 8 cores do not fit there.
        let request = local(Request::exclusive(1), cores(8));
        let placed = pool.place(vm(1), &request, "first-fit").unwrap();
        assert_eq!(pinned_host(&placed), "big", "{selector:?}");
        assert_eq!(placed.vm_resources, Some(cores(8)));
        assert_eq!(pool.host_resources(&host("big")), Some((Some(cores(32)), cores(8))));

        // Memory binds as CPU does.
        let heavy = local(Request::exclusive(1), Resources::new(1000, 200 * 1024));
        let Err(Error::InsufficientCapacity(shortfall)) = pool.place(vm(2), &heavy, "first-fit")
        else {
            panic!("{selector:?}: 200 GiB of memory fits no host")
        };
        assert!(shortfall.never_fits, "no host offers that much, ever");

        // 25 more cores fit the big host only once the first VM leaves; the refusal changes nothing.
        let later = local(Request::exclusive(1), cores(25));
        let changes = pool.changes();
        let Err(Error::InsufficientCapacity(shortfall)) = pool.place(vm(3), &later, "first-fit")
        else {
            panic!("{selector:?}: 8 + 25 cores are more than 32")
        };
        assert!(!shortfall.never_fits, "a release makes room");
        assert_eq!(pool.changes(), changes, "a refusal changes nothing");
        pool.release(&vm(1)).unwrap();
        assert_eq!(pool.host_resources(&host("big")), Some((Some(cores(32)), cores(0))));
        assert_eq!(pinned_host(&pool.place(vm(3), &later, "first-fit").unwrap()), "big");

        // A host that offers nothing known binds by its GPUs only.
        pool.set_host_resources(&host("small"), None).unwrap();
        assert_eq!(pinned_host(&pool.place(vm(4), &later, "first-fit").unwrap()), "small");
        pool.audit().unwrap();
    }
}

#[test]
fn a_vm_s_cpu_and_memory_are_only_a_local_vm_s_and_only_known_hosts_offer() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "gpu1", &[16384]);
    let anywhere = Request::exclusive(1).with_vm_resources(cores(2));
    let Err(Error::InvalidRequest { field, .. }) = pool.place(vm(1), &anywhere, "best-fit") else {
        panic!("a VM placed anywhere does not run on its GPUs' host")
    };
    assert_eq!(field, "vm_resources");
    assert!(pool.set_host_resources(&host("nowhere"), Some(cores(2))).is_err());
    assert_eq!(pool.changes(), 2, "nothing changed past the host and its GPU");
}

#[test]
fn detaching_a_local_vm_s_last_cgpu_gives_its_host_s_cpu_back() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "gpu1", &[16384; 2]);
    pool.set_host_resources(&host("gpu1"), Some(cores(8))).unwrap();
    let placed = pool.place(vm(1), &local(Request::exclusive(2), cores(6)), "best-fit").unwrap();
    pool.detach(&vm(1), placed.cgpus[0].index).unwrap();
    assert_eq!(pool.host_resources(&host("gpu1")).unwrap().1, cores(6), "one cGPU left");
    pool.detach(&vm(1), placed.cgpus[1].index).unwrap();
    assert_eq!(pool.host_resources(&host("gpu1")).unwrap().1, cores(0));
    pool.audit().unwrap();
    // Its first cGPU back (an attach, or a give-back) books them again, as a restart would.
    let again = local(Request::exclusive(1), cores(6));
    pool.attach(vm(1), &again, "best-fit", Some(&host("gpu1"))).unwrap();
    assert_eq!(pool.host_resources(&host("gpu1")).unwrap().1, cores(6));
    assert_eq!(pool.placement(&vm(1)).unwrap().vm_resources, Some(cores(6)));
    // A second attach while it holds one books nothing more.
    pool.attach(vm(1), &again, "best-fit", Some(&host("gpu1"))).unwrap();
    assert_eq!(pool.host_resources(&host("gpu1")).unwrap().1, cores(6));
    pool.audit().unwrap();
    pool.release(&vm(1)).unwrap();
    assert_eq!(pool.host_resources(&host("gpu1")).unwrap().1, cores(0));
}

#[test]
fn a_restore_books_what_runs_even_past_what_the_host_offers_now() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "gpu1", &[16384; 2]);
    pool.set_host_resources(&host("gpu1"), Some(cores(8))).unwrap();
    let placed = pool.place(vm(1), &local(Request::exclusive(1), cores(6)), "best-fit").unwrap();

    let mut restarted = Pool::new();
    add_gpu_host(&mut restarted, "gpu1", &[16384; 2]);
    restarted.set_host_resources(&host("gpu1"), Some(cores(4))).unwrap();
    restarted.restore(placed.clone()).unwrap();
    restarted.restore(placed).unwrap();
    assert_eq!(restarted.host_resources(&host("gpu1")), Some((Some(cores(4)), cores(6))));
    let one_core = local(Request::exclusive(1), cores(1));
    assert!(matches!(
        restarted.place(vm(2), &one_core, "best-fit"),
        Err(Error::InsufficientCapacity(_))
    ));
    restarted.set_host_resources(&host("gpu1"), Some(cores(8))).unwrap();
    restarted.place(vm(2), &one_core, "best-fit").unwrap();
    restarted.audit().unwrap();
}

/// Two hosts alike but for their cores; the local VM so far took 4 cores a GPU. A VM of 8 cores
/// and half a GPU on the host of 8 cores would leave 1.5 free GPUs there with no core to feed
/// them; on the host of 64 it strands nothing. Best fit takes the first of the two in pool
/// order; frag-gradient the other.
#[test]
fn frag_gradient_keeps_a_host_s_cores_for_its_gpus() {
    for selector in SELECTORS {
        let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
        add_gpu_host(&mut pool, "busy", &[16384; 2]);
        add_gpu_host(&mut pool, "lean", &[16384; 2]);
        add_gpu_host(&mut pool, "rich", &[16384; 2]);
        pool.set_host_resources(&host("busy"), Some(cores(64))).unwrap();
        pool.set_host_resources(&host("lean"), Some(cores(8))).unwrap();
        pool.set_host_resources(&host("rich"), Some(cores(64))).unwrap();
        let mix = pool.place(vm(1), &local(Request::exclusive(2), cores(8)), "first-fit").unwrap();
        assert_eq!(pinned_host(&mix), "busy", "{selector:?}");

        let heavy = local(Request::shared(1, 8192), cores(8));
        let best_fit = pool.place(vm(2), &heavy, "best-fit").unwrap();
        assert_eq!(pinned_host(&best_fit), "lean", "{selector:?}: best fit strands the GPUs");
        pool.release(&vm(2));
        let gradient = pool.place(vm(3), &heavy, "frag-gradient").unwrap();
        assert_eq!(pinned_host(&gradient), "rich", "{selector:?}: frag-gradient does not");
        pool.audit().unwrap();
    }
}

/// Past 8 hosts without room the placement stops asking the index host by host and passes once
/// over the hosts with room: it finds the same hosts, in the same order, with every selector,
/// and frag-gradient still compares them by what they strand.
#[test]
fn hosts_without_room_are_passed_over_in_one_scan_that_finds_what_the_index_would() {
    for selector in SELECTORS {
        let mut pool = Pool::with(PolicyRegistry::builtin(), selector);
        for h in 0..13 {
            add_gpu_host(&mut pool, &format!("h{h}"), &[16384]);
            let offers = match h {
                0..=9 => cores(1),
                10 => cores(8),
                _ => cores(64),
            };
            pool.set_host_resources(&host(&format!("h{h}")), Some(offers)).unwrap();
        }
        // The mix: 4 cores a GPU, on the last host.
        let gpu = gpgpums::GpuId::on_host(&host("h12"), 0);
        let mix = Placement {
            vm: vm(1),
            policy: String::new(),
            vm_host: VmHost::Pinned(host("h12")),
            cgpus: vec![gpgpums::CgpuAssignment {
                index: 0,
                gpu,
                host: host("h12"),
                memory_mib: 16384,
                mode: gpgpums::Mode::Exclusive,
                compute_percent: None,
                rcuda: gpu_spec(&host("h12"), 0, 16384).rcuda,
            }],
            vm_resources: Some(cores(4)),
        };
        pool.restore(mix).unwrap();
        let heavy = local(Request::shared(1, 8192), cores(8));
        let best_fit = pool.place(vm(2), &heavy, "best-fit").unwrap();
        assert_eq!(pinned_host(&best_fit), "h10", "{selector:?}: the first host with room");
        pool.release(&vm(2));
        let gradient = pool.place(vm(3), &heavy, "frag-gradient").unwrap();
        assert_eq!(pinned_host(&gradient), "h11", "{selector:?}: h10 would strand its GPU");
        pool.audit().unwrap();
    }
}
