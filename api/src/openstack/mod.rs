//! The OpenStack side of gsaasd: Keystone sessions and tenant-token validation, and credentials
//! read from OpenStack's own configuration (`clouds.yaml`, `OS_*`).
//!
//! Kept apart from [`crate::cloud::nova`] because two users need it: the Nova cloud backend (the
//! service user's token and catalog) and authentication (`auth = keystone`, tenants' tokens). Both
//! share one [`keystone::Keystone`] session, so gsaasd holds one service token, not one per use.
//!
//! The credentials themselves (clouds.yaml, `OS_*`) are read by the `openstack-config` crate, which
//! the `gsaas` CLI shares. Plain HTTP only: reqwest's TLS backends would bring in aws-lc-sys, which
//! the project does not accept; [`AuthSettings::check`] refuses `https` URLs and `cacert` with a
//! clear error instead of failing on the first request.

pub mod keystone;
pub mod time;

pub use keystone::{
    HttpOptions, Keystone, KeystoneError, ServiceToken, TenantIdentity, TokenInfo, TokenValidator,
    ValidationError,
};
pub use openstack_config::{AuthSettings, ConfigError as OpenStackConfigError};
