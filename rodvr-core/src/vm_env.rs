//! A VM's live rCUDA environment, from the route table in force: what the metadata server
//! answers a VM, computed apart from the server so that the agent's core can ask it too.

use std::net::Ipv4Addr;

use rodvr_contract::protocol::{RcudaDevice, RcudaEnv, RouteTable};

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

/// The rCUDA environment of the VM at `ip` in `table`: its routes' masked endpoints, in order
/// (none for a VM whose cGPUs were all detached).
pub fn environment_of(table: &RouteTable, ip: Ipv4Addr) -> Result<RcudaEnv, EnvError> {
    let routes = table.routes.iter().filter(|r| r.vm_ip == ip);
    let idle = table.vms_without_cgpus.iter().filter(|p| p.vm_ip == ip);
    let mut taps = routes.clone().map(|r| &r.vm_tap).chain(idle.map(|p| &p.vm_tap));
    let tap = taps.next().ok_or(EnvError::Unknown)?;
    if taps.any(|other| other != tap) {
        return Err(EnvError::Ambiguous);
    }
    let devices = routes
        .map(|route| RcudaDevice {
            address: *route.masked.ip(),
            port: route.masked.port(),
            gpu_number: route.gpu_number,
        })
        .collect();
    Ok(RcudaEnv { devices })
}
