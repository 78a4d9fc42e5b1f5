//! The OpenStack side of gsaasd: Keystone sessions and tenant-token validation, and credentials
//! read from OpenStack's own configuration (`clouds.yaml`, `OS_*`).
//!
//! Kept apart from [`crate::cloud::nova`] because two users need it: the Nova cloud backend (the
//! service user's token and catalog) and authentication (`auth = keystone`, tenants' tokens). Both
//! share one [`keystone::Keystone`] session, so gsaasd holds one service token, not one per use.
//!
//! The credentials themselves (clouds.yaml, `OS_*`) are read by the `openstack-config` crate, which
//! the `gsaas` CLI shares. TLS goes through the system's OpenSSL (reqwest's `native-tls`; its
//! rustls default would compile aws-lc): the session's one HTTP client trusts the system's CAs and
//! the `cacert` bundle, and serves Keystone and every catalog service alike.

pub mod client_budget;
pub mod keystone;
pub mod sign_in;
pub mod time;
pub mod trusts;

pub use keystone::{
    HttpOptions, Keystone, KeystoneError, ServiceToken, TenantIdentity, TokenInfo, TokenValidator,
    ValidationError,
};
pub use openstack_config::{AuthSettings, ConfigError as OpenStackConfigError};
