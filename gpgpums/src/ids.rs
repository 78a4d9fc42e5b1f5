//! Typed identifiers shared by every GSaaS crate.
//!
//! A bare `String` or `Uuid` says nothing about what it names, and mixing up a host name with a GPU id
//! compiles silently. Each kind of thing gets its own type instead. Host and GPU ids are names that come
//! from outside (the cloud's host name, NVML's GPU UUID or an operator's config), so they are validated
//! strings; VM ids are minted by GSaaS and are UUIDs.
//!
//! Names are shared, not copied: every booked cGPU carries its GPU's and host's names, so at a
//! million cGPUs a clone that only counts a reference saves two allocations each (and their memory).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why a string is not a valid host or GPU identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {max} characters long, got {len}")]
    TooLong { max: usize, len: usize },
    #[error("character {ch:?} is not allowed (use letters, digits, '.', '-', '_' or ':')")]
    BadChar { ch: char },
    #[error("is not a UUID")]
    NotUuid,
}

/// The longest name (of a host, a GPU, a project) in bytes; names are ASCII.
pub const MAX_NAME_LEN: usize = 255;

fn check_name(s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty);
    }
    if s.len() > MAX_NAME_LEN {
        return Err(IdError::TooLong { max: MAX_NAME_LEN, len: s.len() });
    }
    match s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))) {
        Some(ch) => Err(IdError::BadChar { ch }),
        None => Ok(()),
    }
}

macro_rules! name_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `s` and wraps it.
            pub fn new(s: impl AsRef<str>) -> Result<Self, IdError> {
                let s = s.as_ref();
                check_name(s)?;
                Ok(Self(s.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_id!(
    /// A host, named as the cloud names it (Nova's hypervisor host name).
    HostId
);
name_id!(
    /// A physical GPU: NVML's UUID when discovered, or an operator-chosen name.
    GpuId
);
name_id!(
    /// A tenant's project (the cloud's project id), which quotas are kept for.
    ProjectId
);
name_id!(
    /// A cohort: projects that lend each other the quota they do not use, named by an operator.
    CohortName
);

impl GpuId {
    /// The conventional id of GPU `index` on `host` when nothing better (an NVML UUID) is known.
    pub fn on_host(host: &HostId, index: u32) -> Self {
        Self(format!("{host}:gpu{index}").into())
    }
}

/// A cGPU-enabled VM, as GSaaS knows it (not the cloud's server id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VmId(Uuid);

impl VmId {
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }

    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for VmId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Uuid::parse_str(s).map(Self).map_err(|_| IdError::NotUuid)
    }
}

/// A place in the queue: a waiting launch or attach. Tickets are numbered in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TicketId(pub u64);

impl fmt::Display for TicketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert_eq!(HostId::new(""), Err(IdError::Empty));
        assert_eq!(HostId::new("a b"), Err(IdError::BadChar { ch: ' ' }));
        assert!(matches!(HostId::new("x".repeat(256)), Err(IdError::TooLong { .. })));
        assert_eq!(HostId::new("compute-gpu0.example").unwrap().as_str(), "compute-gpu0.example");
        let gpu = GpuId::new("GPU-8f1c2b7e-0d1a-4c55-9c33-5b1c2e9f0a11").unwrap();
        assert_eq!(gpu.to_string(), "GPU-8f1c2b7e-0d1a-4c55-9c33-5b1c2e9f0a11");
    }

    #[test]
    fn deserialization_validates() {
        assert!(serde_json::from_str::<HostId>("\"bad/name\"").is_err());
        let h: HostId = serde_json::from_str("\"cg0\"").unwrap();
        assert_eq!(GpuId::on_host(&h, 3).as_str(), "cg0:gpu3");
    }

    #[test]
    fn vm_ids_round_trip() {
        let id = VmId::new_random();
        assert_eq!(id.to_string().parse::<VmId>().unwrap(), id);
        assert_eq!("nope".parse::<VmId>(), Err(IdError::NotUuid));
    }
}
