//! Test fixtures (feature `fixtures`): a route written from short literals, the one every test
//! and bench of the contract's two sides builds its tables from.

use gpgpums::ids::VmId;

use crate::protocol::Route;

/// VM number `vm` at `ip` on `tap`, reaching `masked` (`ip:port`) rerouted to `target`
/// (`ip:port`), as its GPU number 0. Panics on a malformed literal.
pub fn route(vm: u128, tap: &str, ip: &str, masked: &str, target: &str) -> Route {
    Route {
        vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
        vm_ip: ip.parse().expect("a VM address"),
        vm_tap: tap.into(),
        masked: masked.parse().expect("a masked endpoint"),
        target: target.parse().expect("a target endpoint"),
        gpu_number: 0,
        index: None,
        remoting: gpgpums::Remoting::Rcuda,
    }
}
