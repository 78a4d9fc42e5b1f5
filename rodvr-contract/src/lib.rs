//! The contract between the controller (`gsaasd`) and the RODVR agents, which both sides depend
//! on so neither can drift from the other: the wire types and their checks ([`protocol`]), the HTTP
//! clients of both directions ([`client`]; every path carries the contract's version, `/v1/`) and
//! the controller's short-lived token, signed by `gsaasd` and verified by each agent ([`auth`]),
//! and the remote-GPU environment a VM is given ([`env`]), which both sides render; the protocol's
//! version and the skew allowed between the two sides ([`version`]); the servers a managed GPU
//! host runs per cGPU ([`servers`]); the refusal and bounds both share ([`limits`]).

pub mod auth;
pub mod client;
pub mod env;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod limits;
pub mod protocol;
pub mod servers;
pub mod version;
