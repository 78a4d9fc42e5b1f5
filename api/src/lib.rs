//! gsaasd, the GSaaS REST service (dissertation section 5.2.1): from a request for a VM with cGPUs
//! to a ready VM whose cGPUs are reachable at masked endpoints.
//!
//! Layers, outside in: [`http`] (thin handlers, the OpenAPI document) -> [`app`] (launch and
//! terminate, the saga, hosts, the reconciler) -> [`db`] (SQLite or PostgreSQL). Every side effect
//! sits behind a trait with a real and a simulated implementation: [`cloud`] (crate `gsaas-clouds`;
//! the simulated Nova is the embedded default) and [`agents`] (real `rodvr-agent`s over HTTP, or in-process ones).
//! [`error::Error`] is the one error type, mapped to HTTP in one place.

pub mod agents;
pub mod app;
pub mod auth;
pub mod caller;
pub mod cloudinit;
pub mod config;
pub mod dashboard;
pub mod db;
pub mod error;
pub mod http;
pub mod lanes;
pub mod metrics;
pub mod model;
pub mod notifier;
pub mod policy;
pub mod service;

/// The clouds (crate `gsaas-clouds`): the `Cloud` trait, Nova and the simulated cloud.
pub use gsaas_clouds::cloud;
/// Keystone (crate `gsaas-clouds`).
pub use gsaas_clouds::openstack;
