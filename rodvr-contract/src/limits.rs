//! What every part of the contract's checks shares: the error naming a refused entry, and the
//! bounds more than one kind of entry is held to. A module of its own so that the wire types'
//! modules ([`crate::protocol`], [`crate::servers`]) both lean on it and not on each other.

/// A table entry the agent refuses, named by its position and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry}: {reason}")]
pub struct InvalidEntry {
    /// Where the problem is, e.g. `routes[3].masked`.
    pub entry: String,
    pub reason: String,
}

/// The longest reason a GPU report may give for a GPU being unhealthy.
pub const MAX_HEALTH_LEN: usize = 256;

/// The most memory one GPU may report: 16 TiB.
pub const MAX_GPU_MEMORY_MIB: u64 = gpgpums::MAX_GPU_MEMORY_MIB;
