//! RODVR endpoint agent (dissertation section 5.2.1): makes each cGPU of a VM reachable at a
//! masked IP:port that this host reroutes to the real rCUDA server, hides where that server is,
//! and keeps VMs away from GPUs that are not theirs.
//!
//! The crate is a library first so the controller (`gsaasd`) shares the wire types
//! ([`protocol`]), the client ([`client`]) and the renderer plus in-memory firewall
//! ([`render`], [`firewall`]) with the agent binary; nothing here needs root except
//! [`firewall::NftFirewall`].

pub mod agent;
pub mod auth;
pub mod client;
pub mod config;
pub mod credential;
pub mod discovery;
pub mod files;
pub mod firewall;
pub mod httpd;
pub mod metadata;
pub mod metrics;
pub mod protocol;
pub mod render;
pub mod server;
pub mod state;
pub mod vm_env;
