//! What build a daemon is: its version and the commit it was built from (`--version`; the
//! agent reports it to gsaasd).

/// The workspace's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit built (see `build.rs`): 12 hex digits, or `unknown`.
pub const COMMIT: &str = env!("GSAAS_BUILD_COMMIT");

/// `VERSION (commit COMMIT)`, as `--version` prints it.
pub const LONG: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("GSAAS_BUILD_COMMIT"), ")");
