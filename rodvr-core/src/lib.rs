//! The RODVR agent's core (dissertation section 5.2.1) with no host attached: a route table
//! rendered as nftables transactions ([`render`], pure), where they go ([`firewall`]: the
//! [`firewall::Firewall`] trait, the in-memory firewall with the kernel's semantics, and the
//! dataplane that diffs or replaces), the routes to the host's own servers it resolves itself
//! ([`own_routes`]), the ledger of applied generations ([`state`]), the VMs'
//! rCUDA environments ([`vm_env`]) and the [`agent::Agent`] that ties them together.
//!
//! The agent binary (`rodvr-agent`) adds the host: `nft`, conntrack, NVML, its HTTP servers.
//! `gsaasd` runs this core in-process over the memory firewall, so it links neither nftables
//! nor NVML.

pub mod agent;
pub mod firewall;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod metrics;
pub mod own_routes;
pub mod render;
pub mod servers;
pub mod state;
pub mod vm_env;
