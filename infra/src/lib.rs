//! The small server infrastructure both daemons (`gsaasd` and `rodvr-agent`) run: an HTTP server
//! with the limits a shared network needs ([`httpd`]), Prometheus text-format helpers
//! ([`metrics`]), owner-only files for secrets and tenants' data ([`files`]) and errors with
//! their sources on one line for logs ([`ErrorChain`]), and the lanes gsaasd runs requests and
//! background work on ([`lanes`]). Nothing here knows GSaaS's domain.

mod error_chain;
pub mod files;
pub mod httpd;
pub mod lanes;
pub mod metrics;
pub mod version;

pub use error_chain::ErrorChain;
