//! Placement that knows the network: a required group holds the VM and all its GPUs, a preferred
//! one gives way, a round-trip limit keeps the VM's hosts near every GPU, `nearest` keeps cGPUs
//! in the VM's innermost group, and attach and re-homing follow the VM's host.

mod common;

use common::{add_gpu_host, host};
use gpgpums::{
    Error, HostId, HostKind, Locality, NetworkConstraint, Pool, Rehome, Request, Strength,
    Topology, VmId,
};

fn vm(n: u128) -> VmId {
    VmId::from_uuid(uuid::Uuid::from_u128(n))
}

fn at(pairs: &[(&str, &str)]) -> Topology {
    pairs.iter().map(|(l, g)| ((*l).to_owned(), (*g).to_owned())).collect()
}

fn same(level: &str) -> NetworkConstraint {
    NetworkConstraint { same: Some(level.into()), ..NetworkConstraint::NONE }
}

fn names(hosts: &[HostId]) -> Vec<&str> {
    hosts.iter().map(HostId::as_str).collect()
}

/// Two zones of two racks. Rack `a1` has a big GPU host but nowhere for a remote VM; `a2` and
/// `b1` each have a GPU host and a compute-rgpu host; `b2` only a compute-rgpu host.
fn fleet() -> Pool {
    let mut pool = Pool::new();
    for (name, rack, zone, sizes) in [
        ("gpu-a1", "a1", "a", &[8192u64; 8][..]),
        ("gpu-a2", "a2", "a", &[8192; 2][..]),
        ("gpu-b1", "b1", "b", &[8192; 2][..]),
    ] {
        add_gpu_host(&mut pool, name, sizes);
        pool.set_host_topology(&host(name), at(&[("rack", rack), ("zone", zone)])).unwrap();
    }
    for (name, rack, zone) in [("vm-a2", "a2", "a"), ("vm-b1", "b1", "b"), ("vm-b2", "b2", "b")] {
        pool.add_host(host(name), HostKind::ComputeRgpu).unwrap();
        pool.set_host_topology(&host(name), at(&[("rack", rack), ("zone", zone)])).unwrap();
    }
    pool
}

fn hosts_of(pool: &mut Pool, request: &Request, vm_id: VmId) -> Vec<HostId> {
    let gpu_hosts: Vec<HostId> =
        pool.placement(&vm_id).unwrap().cgpus.iter().map(|c| c.host.clone()).collect();
    pool.vm_hosts_for(request, &gpu_hosts).expect("a network request has a host set")
}

#[test]
fn levels_are_ordered_innermost_first_and_unknown_ones_are_refused() {
    let mut pool = fleet();
    assert_eq!(pool.levels(), ["rack", "zone"]);
    let request = Request::exclusive(1).with_locality(Locality::Remote).with_network(same("row"));
    let err = pool.place(vm(1), &request, "first-fit").unwrap_err();
    let Error::InvalidRequest { field, reason } = &err else { panic!("{err:?}") };
    assert_eq!(*field, "network.same");
    assert!(reason.contains("\"row\"") && reason.contains("rack, zone"), "{reason}");
    assert_eq!(pool.changes(), fleet().changes(), "nothing booked");
    let bad = NetworkConstraint { max_rtt_us: Some(0), ..NetworkConstraint::NONE };
    let err = pool.place(vm(1), &Request::exclusive(1).with_network(bad), "first-fit");
    assert!(matches!(err, Err(Error::InvalidRequest { field: "network.max_rtt_us", .. })));
}

#[test]
fn a_required_group_holds_the_vm_and_every_gpu() {
    let mut pool = fleet();
    // First fit's best GPU is in rack a1, which has nowhere for a remote VM: a2 comes next.
    let request = Request::exclusive(2).with_locality(Locality::Remote).with_network(same("rack"));
    let placement = pool.place(vm(1), &request, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str() == "gpu-a2"), "{placement:?}");
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(1))), ["vm-a2"]);
    // Three in one rack: no rack with a VM host has them, and none ever will.
    let three = Request { ncgpus: 3, ..request.clone() };
    match pool.place(vm(2), &three, "first-fit") {
        Err(Error::InsufficientCapacity(s)) => assert!(s.never_fits, "{s:?}"),
        other => panic!("{other:?}"),
    }
    assert!(!pool.could_ever_fit(&three, None));
    // By zone, zone a has 10 GPUs and a VM host: three fit there, from both racks.
    let zone = Request { ncgpus: 3, ..Request::exclusive(3).with_network(same("zone")) }
        .with_locality(Locality::Remote);
    let placement = pool.place(vm(3), &zone, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str().starts_with("gpu-a")));
    assert_eq!(names(&hosts_of(&mut pool, &zone, vm(3))), ["vm-a2"]);
    pool.audit().unwrap();
}

#[test]
fn a_preferred_group_gives_way_when_none_has_room() {
    let mut pool = fleet();
    let preferred = NetworkConstraint { strength: Strength::Preferred, ..same("rack") };
    let request = Request::exclusive(3).with_locality(Locality::Remote).with_network(preferred);
    let placement = pool.place(vm(1), &request, "first-fit").unwrap();
    assert_eq!(placement.cgpus.len(), 3);
    // Its GPUs share no rack with a VM host: any compute-rgpu host will do.
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(1))), ["vm-a2", "vm-b1", "vm-b2"]);
}

#[test]
fn a_round_trip_limit_keeps_the_vm_near_every_gpu_and_unmeasured_pairs_are_far() {
    let mut pool = fleet();
    let rtts =
        |pairs: &[(&str, u32)]| pairs.iter().map(|(h, us)| (host(h), *us)).collect::<Vec<_>>();
    assert_eq!(pool.set_host_rtts(&host("vm-b2"), rtts(&[("gpu-b1", 120), ("gone", 5)])), Ok(1));
    pool.set_host_rtts(&host("vm-b1"), rtts(&[("gpu-b1", 80), ("gpu-a2", 900)])).unwrap();
    pool.set_host_rtts(&host("vm-a2"), rtts(&[("gpu-a2", 60), ("gpu-b1", 900)])).unwrap();
    assert_eq!(pool.rtt_us(&host("vm-b2"), &host("gpu-b1")), Some(120));
    assert_eq!(pool.rtt_us(&host("gpu-b1"), &host("gpu-b1")), Some(0));
    let near = |us| NetworkConstraint { max_rtt_us: Some(us), ..NetworkConstraint::NONE };
    let request = Request::exclusive(2).with_locality(Locality::Remote).with_network(near(150));
    // gpu-a1 comes first but no VM host measured it; gpu-a2 is 60 us from vm-a2.
    let placement = pool.place(vm(1), &request, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str() == "gpu-a2"), "{placement:?}");
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(1))), ["vm-a2"]);
    let placement = pool.place(vm(2), &request, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str() == "gpu-b1"));
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(2))), ["vm-b1", "vm-b2"]);
    // Nothing left within 150 us; within 1 ms, both of vm-a2's and vm-b1's sides still would.
    assert!(matches!(
        pool.place(vm(3), &request, "first-fit"),
        Err(Error::InsufficientCapacity(_))
    ));
    assert!(pool.could_ever_fit(&request, None));
    let four = Request { ncgpus: 4, ..request.clone() };
    assert!(!pool.could_ever_fit(&four, None), "no VM host has four GPUs within 150 us");
    assert!(pool.could_ever_fit(&Request { network: near(1000), ..four }, None));
    pool.audit().unwrap();
}

#[test]
fn nearest_keeps_cgpus_in_the_vms_innermost_group() {
    let mut pool = fleet();
    let nearest = NetworkConstraint { nearest: true, ..NetworkConstraint::NONE };
    let plain = Request::exclusive(2).with_locality(Locality::Remote);
    let request = plain.clone().with_network(nearest);
    // Without it first fit takes gpu-a1, far from every VM host; with it, a rack with a VM host.
    let placement = pool.place(vm(1), &plain, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str() == "gpu-a1"));
    let placement = pool.place(vm(2), &request, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str() == "gpu-a2"), "{placement:?}");
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(2))), ["vm-a2"]);
    // Three: no rack has them with a VM host; zone a does.
    let three = Request { ncgpus: 3, ..request.clone() };
    let placement = pool.place(vm(3), &three, "first-fit").unwrap();
    assert!(placement.cgpus.iter().all(|c| c.host.as_str().starts_with("gpu-")));
    let hosts = hosts_of(&mut pool, &three, vm(3));
    assert!(!hosts.is_empty());
    pool.audit().unwrap();
}

#[test]
fn attach_and_rehoming_follow_the_vms_host() {
    let mut pool = fleet();
    let request = Request::exclusive(1).with_locality(Locality::Remote).with_network(same("rack"));
    pool.place(vm(1), &request, "first-fit").unwrap();
    // The VM runs on vm-b1: its new cGPU goes to rack b1, though a1 and a2 come first.
    let on = host("vm-b1");
    let cgpus = pool.attach(vm(1), &request, "first-fit", Some(&on)).unwrap();
    assert_eq!(cgpus[0].host.as_str(), "gpu-b1");
    assert!(pool.could_ever_attach(&request, Some(&on)));
    let three = Request { ncgpus: 3, ..request.clone() };
    assert!(!pool.could_ever_attach(&three, Some(&on)), "rack b1 has two GPUs in all");
    assert!(matches!(
        pool.attach(vm(1), &three, "first-fit", Some(&on)),
        Err(Error::InsufficientCapacity(s)) if s.never_fits
    ));
    // Re-homing its cGPU on gpu-b1 stays in rack b1.
    let to = Rehome { near: Some((&on, &request.network)), ..Rehome::default() };
    let moved = pool.rehome(&vm(1), cgpus[0].index, "first-fit", &to, None).unwrap();
    assert_eq!(moved.host.as_str(), "gpu-b1");
    assert_ne!(moved.gpu, cgpus[0].gpu);
    // With the GPU it left tainted, no other GPU in rack b1 takes it.
    pool.set_gpu_taint(&cgpus[0].gpu, Some("test".into())).unwrap();
    assert!(pool.rehome(&vm(1), moved.index, "first-fit", &to, None).is_err());
    pool.audit().unwrap();
}

#[test]
fn round_trip_targets_are_the_nearest_gpu_hosts_first_and_bounded() {
    let pool = fleet();
    let names = |targets: Vec<(HostId, gpgpums::RcudaEndpoint)>| {
        targets.into_iter().map(|(h, _)| h.as_str().to_owned()).collect::<Vec<_>>()
    };
    // vm-b1: its rack's GPU host, then the other zone's two (in an order of its own).
    let targets = names(pool.rtt_targets(&host("vm-b1"), 8).unwrap());
    assert_eq!(targets[0], "gpu-b1");
    let mut rest = targets[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["gpu-a1", "gpu-a2"]);
    // vm-a2: its rack's, then its zone's.
    assert_eq!(names(pool.rtt_targets(&host("vm-a2"), 2).unwrap()), ["gpu-a2", "gpu-a1"]);
    // A GPU host measures the others, never itself.
    assert_eq!(names(pool.rtt_targets(&host("gpu-a1"), 8).unwrap()), ["gpu-a2", "gpu-b1"]);
    assert!(pool.rtt_targets(&host("nowhere"), 8).is_none());
    // At the endpoint of a GPU that serves.
    let (_, endpoint) = &pool.rtt_targets(&host("vm-b1"), 1).unwrap()[0];
    assert_eq!(endpoint.port, 8308, "the first GPU's rCUDA endpoint");
    let mut pool = pool;
    pool.set_gpu_health(&gpgpums::GpuId::on_host(&host("gpu-b1"), 0), Some("XID 79".into()))
        .unwrap();
    let (_, endpoint) = &pool.rtt_targets(&host("vm-b1"), 1).unwrap()[0];
    assert_eq!(endpoint.port, 8309, "the first healthy GPU's");
}

/// Among equally near GPU hosts, each host measures a share of its own: with 100 GPU hosts in
/// no group and 64 targets each, the fleet's hosts between them measure nearly every GPU host.
#[test]
fn hosts_measure_different_gpu_hosts_among_equals() {
    let mut pool = Pool::new();
    for g in 0..100 {
        add_gpu_host(&mut pool, &format!("g{g}"), &[8192]);
    }
    for v in 0..20 {
        pool.add_host(host(&format!("v{v}")), HostKind::ComputeRgpu).unwrap();
    }
    let mut measured = std::collections::BTreeSet::new();
    for v in 0..20 {
        let targets = pool.rtt_targets(&host(&format!("v{v}")), 64).unwrap();
        assert_eq!(targets.len(), 64);
        measured.extend(targets.into_iter().map(|(h, _)| h));
    }
    assert!(measured.len() >= 99, "only {} GPU hosts measured", measured.len());
}

#[test]
fn nearest_inner_levels_stay_inside_the_required_group_even_where_levels_do_not_nest() {
    // gpu-x is on switch s1 but in no rack; gpu-y and the VM host are on s1 in rack r1.
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "gpu-x", &[8192; 2]);
    pool.set_host_topology(&host("gpu-x"), at(&[("switch", "s1")])).unwrap();
    for (name, switch) in [("gpu-y", "s1"), ("gpu-z", "s2"), ("gpu-w", "s3")] {
        add_gpu_host(&mut pool, name, &[8192; 2]);
        pool.set_host_topology(&host(name), at(&[("switch", switch), ("rack", "r1")])).unwrap();
    }
    pool.add_host(host("vm-1"), HostKind::ComputeRgpu).unwrap();
    pool.set_host_topology(&host("vm-1"), at(&[("switch", "s1"), ("rack", "r1")])).unwrap();
    assert_eq!(pool.levels(), ["switch", "rack"]);
    let network = NetworkConstraint { nearest: true, ..same("rack") };
    let request = Request::exclusive(1).with_locality(Locality::Remote).with_network(network);
    // First fit's best GPU is gpu-x's: on the VM's switch, but outside every rack.
    let placement = pool.place(vm(1), &request, "first-fit").unwrap();
    assert_eq!(placement.cgpus[0].host.as_str(), "gpu-y", "{placement:?}");
    assert_eq!(names(&hosts_of(&mut pool, &request, vm(1))), ["vm-1"]);
}

/// Hosts that measure nothing get round trips from where they sit: 50 µs in their innermost
/// shared group, 150 µs one level out, 2,000 µs beyond (here: same rack, same zone, neither).
#[test]
fn nominal_round_trips_follow_the_topology() {
    let mut pool = fleet();
    let rtt = |a: &str, b: &str| pool.nominal_rtt_us(&host(a), &host(b));
    assert_eq!(rtt("vm-a2", "gpu-a2"), Some(50));
    assert_eq!(rtt("vm-a2", "gpu-a1"), Some(150));
    assert_eq!(rtt("vm-a2", "gpu-b1"), Some(2_000));
    assert_eq!(rtt("vm-b2", "gpu-b1"), Some(150));
    assert_eq!(rtt("vm-a2", "vm-a2"), Some(0));
    assert_eq!(rtt("vm-a2", "nowhere"), None);
    add_gpu_host(&mut pool, "gpu-x", &[8192]);
    assert_eq!(pool.nominal_rtt_us(&host("vm-a2"), &host("gpu-x")), None, "no topology");
}
