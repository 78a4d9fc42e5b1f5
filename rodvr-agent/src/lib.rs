//! RODVR endpoint agent (dissertation section 5.2.1): makes each cGPU of a VM reachable at a
//! masked IP:port that this host reroutes to the real rCUDA server, hides where that server is,
//! and keeps VMs away from GPUs that are not theirs.
//!
//! This crate is the agent on its host: the kernel's firewall ([`nft`]: `nft`, and [`conntrack`] over netlink),
//! GPU discovery over NVML ([`discovery`]), its configuration and credential, its HTTP API
//! ([`server`]), the VMs' metadata server ([`metadata`]), its round trips to GPU hosts
//! ([`rtt`]) and, on a GPU host that runs them, its cGPUs' servers ([`servers`]). The agent's logic is `rodvr-core`'s
//! (shared with `gsaasd`'s in-process agents), the wire contract `rodvr-contract`'s.

pub mod config;
pub mod conntrack;
pub mod credential;
pub mod discovery;
pub mod metadata;
pub mod nft;
pub mod rtt;
pub mod server;
pub mod servers;
