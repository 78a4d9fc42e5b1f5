//! The simulated cloud's VM networks: what a simulated VM's port is, and the two ways to give
//! one (an address pool, or a network namespace per VM in [`super::sim_netns`]). Apart from
//! [`super::sim`], which picks one of them by its configuration.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use gpgpums::{HostId, VmId};
use uuid::Uuid;

use super::{CloudError, ServerId};
pub use rodvr_contract::protocol::Ipv4Cidr;

/// The first and last offsets in `range` a VM may get: .1 is the gateway, the last is broadcast.
/// A range of /31 or /32 has none (`first > last`).
fn vm_offsets(range: Ipv4Cidr) -> (u32, u32) {
    let size = 1u64 << (32 - u32::from(range.prefix_len()));
    (2, u32::try_from(size.saturating_sub(2)).unwrap_or(u32::MAX))
}

/// A VM's port as its host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPort {
    pub fixed_ip: Ipv4Addr,
    /// `tap` + the port id's first 11 characters, as Neutron names it.
    pub tap: String,
}

impl VmPort {
    /// A port with a fresh Neutron-style port id.
    pub fn new(fixed_ip: Ipv4Addr) -> Self {
        let port_id = Uuid::new_v4().to_string();
        Self { fixed_ip, tap: format!("tap{}", &port_id[..11]) }
    }
}

/// Gives simulated VMs their network. See the module docs.
#[async_trait]
pub trait SimVmNetwork: Send + Sync + fmt::Debug {
    /// Binds the server's port on `host`; called as the server becomes ACTIVE. An error puts the
    /// server in ERROR with the error as its fault.
    async fn attach(
        &self,
        server: &ServerId,
        vm: VmId,
        host: &HostId,
    ) -> Result<VmPort, CloudError>;

    /// Releases a port `attach` returned; called when the server is deleted. An error fails the
    /// delete and leaves the server in ERROR with the port still bound.
    async fn detach(
        &self,
        server: &ServerId,
        host: &HostId,
        port: &VmPort,
    ) -> Result<(), CloudError>;
}

/// The default VM network: addresses from one subnet, lowest freed address reused first.
#[derive(Debug)]
pub struct SimAddressPool {
    range: Ipv4Cidr,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    /// The next never-used offset into the range.
    next: u32,
    freed: BTreeSet<u32>,
}

impl SimAddressPool {
    pub fn new(range: Ipv4Cidr) -> Self {
        let (first, _) = vm_offsets(range);
        Self { range, state: Mutex::new(PoolState { next: first, freed: BTreeSet::new() }) }
    }

    pub fn allocate(&self) -> Result<Ipv4Addr, CloudError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, last) = vm_offsets(self.range);
        let offset = match state.freed.pop_first() {
            Some(offset) => offset,
            None if state.next <= last => {
                state.next += 1;
                state.next - 1
            }
            None => {
                return Err(CloudError::unavailable(format!(
                    "no free fixed IP address left in {}",
                    self.range
                )))
            }
        };
        Ok(Ipv4Addr::from(u32::from(self.range.network()) + offset))
    }

    /// Returns `address` to the pool; an address the pool did not hand out is ignored.
    pub fn release(&self, address: Ipv4Addr) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (first, _) = vm_offsets(self.range);
        let offset = u32::from(address).wrapping_sub(u32::from(self.range.network()));
        if (first..state.next).contains(&offset) {
            state.freed.insert(offset);
        }
    }
}

#[async_trait]
impl SimVmNetwork for SimAddressPool {
    async fn attach(&self, _: &ServerId, _: VmId, _: &HostId) -> Result<VmPort, CloudError> {
        self.allocate().map(VmPort::new)
    }

    async fn detach(&self, _: &ServerId, _: &HostId, port: &VmPort) -> Result<(), CloudError> {
        self.release(port.fixed_ip);
        Ok(())
    }
}
