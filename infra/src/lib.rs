//! The small server infrastructure both daemons (`gsaasd` and `rodvr-agent`) run: an HTTP server
//! with the limits a shared network needs ([`httpd`]), Prometheus text-format helpers
//! ([`metrics`]) and owner-only files for secrets and tenants' data ([`files`]). Nothing here
//! knows GSaaS's domain.

pub mod files;
pub mod httpd;
pub mod metrics;
pub mod version;
