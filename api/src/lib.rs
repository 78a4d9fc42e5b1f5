//! gsaasd, the GSaaS REST service (dissertation section 5.2.1): from a request for a VM with cGPUs
//! to a ready VM whose cGPUs are reachable at masked endpoints.
//!
//! Layers, outside in: [`http`] (thin handlers, the OpenAPI document) -> [`app`] (launch and
//! terminate, the saga, hosts, the reconciler) -> [`db`] (crate `gsaas-datastore`: SQLite or PostgreSQL). Every side effect
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
pub mod error;
pub mod http;
pub mod metrics;
pub mod notifier;
pub mod policy;
pub mod secret_url;
pub mod service;

/// The clouds (crate `gsaas-clouds`): the `Cloud` trait, Nova and the simulated cloud.
pub use gsaas_clouds::cloud;
/// Keystone (crate `gsaas-clouds`).
pub use gsaas_clouds::openstack;
/// The datastore (crate `gsaas-datastore`): SQLite or PostgreSQL, its `Db` and the rows it returns.
pub use gsaas_datastore as db;
/// The records the datastore keeps (crate `gsaas-datastore`).
pub use gsaas_datastore::model;
/// The lanes requests and background work run on (crate `gsaas-infra`).
pub use gsaas_infra::lanes;
