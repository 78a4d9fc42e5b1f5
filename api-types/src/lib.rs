//! The REST API's types, in one crate that `gsaasd` and the `gsaas` CLI share: what a request
//! carries, what a view shows and what a problem document says. The service converts its records
//! to these (`gsaasd::http::views`), derives the OpenAPI document from them, and the CLI reads
//! answers into them instead of walking untyped JSON, so a renamed field breaks the build of
//! both, not a user's terminal.
//!
//! Requests refuse unknown fields (a typo is an error, not a silent default); views accept them,
//! so an older CLI reads a newer service's answers. One exception: a quota view's `limits` is
//! [`QuotaLimits`], the `PUT` request's own type, so a limit added later breaks an older CLI's
//! `quota show`; splitting it would copy the type.

pub mod auth;
pub mod cohorts;
pub mod health;
pub mod hosts;
pub mod pool;
pub mod problem;
pub mod queue;
pub mod quotas;
pub mod tasks;
pub mod usage;
pub mod vms;

pub use auth::*;
pub use cohorts::*;
pub use health::*;
pub use hosts::*;
pub use pool::*;
pub use problem::*;
pub use queue::*;
pub use quotas::*;
pub use tasks::*;
pub use usage::*;
pub use vms::*;

/// A `major.minor` version (a compute capability, a CUDA version), as requests write it.
pub use gpgpums::MajorMinor;
