//! A VM's live remote-GPU environment, from the route table in force: what the metadata server
//! answers a VM, computed apart from the server so that the agent's core can ask it too.

use std::net::Ipv4Addr;

use rodvr_contract::protocol::{GpuDevice, GpuEnv, RouteTable};

/// Why the agent has no environment for a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// No route table is in force yet (the agent just started, or applying failed).
    #[error("no route table is applied yet")]
    NotApplied,
    /// No VM of this host has the caller's address.
    #[error("no VM of this host has this address")]
    Unknown,
    /// More than one VM of this host has the caller's address.
    #[error("more than one VM of this host has this address")]
    Ambiguous,
}

/// The environment of the VM at `ip` in `table`: its routes' masked endpoints, in order, in
/// their layer, and the cGPUs the table says are lost (none for a VM whose cGPUs were all
/// detached).
pub fn environment_of(table: &RouteTable, ip: Ipv4Addr) -> Result<GpuEnv, EnvError> {
    let routes = table.routes.iter().filter(|r| r.vm_ip == ip);
    let idle = table.vms_without_cgpus.iter().filter(|p| p.vm_ip == ip);
    let mut owners = routes
        .clone()
        .map(|r| (&r.vm_tap, r.vm, r.remoting))
        .chain(idle.map(|p| (&p.vm_tap, p.vm, p.remoting)));
    let (tap, vm, remoting) = owners.next().ok_or(EnvError::Unknown)?;
    if owners.any(|(other, _, _)| other != tap) {
        return Err(EnvError::Ambiguous);
    }
    let devices = (0u32..)
        .zip(routes)
        .map(|(j, route)| GpuDevice {
            address: *route.masked.ip(),
            port: route.masked.port(),
            gpu_number: route.gpu_number,
            cgpu: route.index.unwrap_or(j),
        })
        .collect();
    let mut missing: Vec<u32> = table.lost.iter().filter(|l| l.vm == vm).map(|l| l.index).collect();
    missing.sort_unstable();
    Ok(GpuEnv { remoting, devices, missing })
}
