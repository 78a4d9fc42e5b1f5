//! Routes to this host's own cGPU servers that the agent resolves itself.
//!
//! gsaasd routes a cGPU on a managed GPU to the port its server answered; a new server's port is
//! known only once the GPU host's agent answers the table. Where the VM runs on that same host,
//! waiting for gsaasd to record the port and push the table again costs a second round and a
//! commit on every attach. So such a cGPU comes lost, with where its VM reaches it
//! ([`LostCgpu::here`]), and the agent routes it to its server as soon as that accepts, in the
//! same table: the table *in force* is the ledger's with these routes resolved. Never a route to
//! a port where the cGPU's own server does not accept: an unresolved one stays lost.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use gpgpums::VmId;
use rodvr_contract::protocol::{Route, RouteTable, ServerStatus};

/// Each cGPU server's port, for those that accept now.
pub type LivePorts = HashMap<(VmId, u32), u16>;

/// The live ports of `statuses`.
pub fn live_ports<'a>(statuses: impl IntoIterator<Item = &'a ServerStatus>) -> LivePorts {
    statuses.into_iter().filter_map(|s| Some((s.key(), s.live_port()?))).collect()
}

/// `table` with each of its lost cGPUs served here whose server accepts (`ports`, on
/// `address`) routed there, and the cGPUs so routed; `table` itself when none is.
pub fn resolve<'t>(
    table: &'t RouteTable,
    address: Option<Ipv4Addr>,
    ports: &LivePorts,
) -> (Cow<'t, RouteTable>, HashSet<(VmId, u32)>) {
    let mut routed = HashSet::new();
    let Some(address) = address else { return (Cow::Borrowed(table), routed) };
    let due = |l: &&rodvr_contract::protocol::LostCgpu| {
        l.here.is_some() && ports.contains_key(&(l.vm, l.index))
    };
    if !table.lost.iter().any(|l| due(&l)) {
        return (Cow::Borrowed(table), routed);
    }
    // Each VM's tap, address and layer, from its listing; and its place in the table.
    let mut ports_of_vms: HashMap<VmId, (usize, Ipv4Addr, &str, gpgpums::Remoting)> =
        HashMap::new();
    let listed = table.routes.iter().map(|r| (r.vm, r.vm_ip, r.vm_tap.as_str(), r.remoting));
    let idle =
        table.vms_without_cgpus.iter().map(|p| (p.vm, p.vm_ip, p.vm_tap.as_str(), p.remoting));
    for (place, (vm, ip, tap, remoting)) in listed.chain(idle).enumerate() {
        ports_of_vms.entry(vm).or_insert((place, ip, tap, remoting));
    }
    let mut resolved = table.clone();
    let mut lost = Vec::with_capacity(table.lost.len());
    for cgpu in &table.lost {
        let found =
            cgpu.here.zip(ports.get(&(cgpu.vm, cgpu.index))).zip(ports_of_vms.get(&cgpu.vm));
        let Some(((here, port), (_, vm_ip, vm_tap, remoting))) = found else {
            lost.push(*cgpu);
            continue;
        };
        resolved.routes.push(Route {
            vm: cgpu.vm,
            vm_ip: *vm_ip,
            vm_tap: (*vm_tap).to_owned(),
            masked: here.masked,
            target: SocketAddrV4::new(address, *port),
            gpu_number: here.gpu_number,
            index: Some(cgpu.index),
            remoting: *remoting,
        });
        routed.insert((cgpu.vm, cgpu.index));
    }
    resolved.lost = lost;
    // A VM's routes stay together, in index order, where its listing was.
    resolved.routes.sort_by_key(|r| (ports_of_vms.get(&r.vm).map_or(usize::MAX, |p| p.0), r.index));
    let with_routes: HashSet<VmId> = resolved.routes.iter().map(|r| r.vm).collect();
    resolved.vms_without_cgpus.retain(|p| !with_routes.contains(&p.vm));
    (Cow::Owned(resolved), routed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rodvr_contract::protocol::{LostCgpu, ServedHere, VmPort};

    fn vm(n: u128) -> VmId {
        VmId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn table() -> RouteTable {
        let here = |port| {
            Some(ServedHere {
                masked: SocketAddrV4::new([100, 127, 0, 1].into(), port),
                gpu_number: 0,
            })
        };
        RouteTable {
            generation: 4,
            routes: vec![Route {
                vm: vm(1),
                vm_ip: [10, 0, 0, 2].into(),
                vm_tap: "tap1".into(),
                masked: "100.127.0.1:9000".parse().unwrap(),
                target: "10.1.0.2:8308".parse().unwrap(),
                gpu_number: 0,
                index: Some(0),
                remoting: Default::default(),
            }],
            metadata: None,
            vms_without_cgpus: vec![VmPort {
                vm: vm(2),
                vm_ip: [10, 0, 0, 3].into(),
                vm_tap: "tap2".into(),
                remoting: Default::default(),
            }],
            lost: vec![
                LostCgpu { vm: vm(1), index: 1, here: here(9001) },
                LostCgpu { vm: vm(2), index: 0, here: here(9000) },
                LostCgpu::new(vm(2), 1),
            ],
            servers: vec![],
        }
    }

    #[test]
    fn only_cgpus_whose_own_server_accepts_are_routed() {
        let table = table();
        let address = Some(Ipv4Addr::new(10, 1, 0, 9));
        // No server accepts yet, or the host runs none: the table as it came.
        let (none, routed) = resolve(&table, address, &LivePorts::new());
        assert!(matches!(none, Cow::Borrowed(_)) && routed.is_empty());
        let ports: LivePorts =
            [((vm(1), 1), 20001), ((vm(2), 0), 20002), ((vm(2), 1), 20003)].into();
        assert!(matches!(resolve(&table, None, &ports).0, Cow::Borrowed(_)));

        let (resolved, routed) = resolve(&table, address, &ports);
        assert_eq!(routed, [(vm(1), 1), (vm(2), 0)].into());
        let routes: Vec<(VmId, Option<u32>, String)> =
            resolved.routes.iter().map(|r| (r.vm, r.index, r.target.to_string())).collect();
        assert_eq!(
            routes,
            [
                (vm(1), Some(0), "10.1.0.2:8308".to_owned()),
                (vm(1), Some(1), "10.1.0.9:20001".to_owned()),
                (vm(2), Some(0), "10.1.0.9:20002".to_owned()),
            ]
        );
        assert_eq!(resolved.routes[2].vm_tap, "tap2");
        // A lost cGPU without `here` stays lost though a server of that key accepts.
        assert_eq!(resolved.lost, [LostCgpu::new(vm(2), 1)]);
        assert!(resolved.vms_without_cgpus.is_empty(), "VM 2 has a route now");
        resolved.validate(None).unwrap();
    }
}
