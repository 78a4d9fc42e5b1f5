//! The one error type of the scheduling core.
//!
//! Callers map it to their own boundary (the REST API turns `InvalidRequest` into 400/422,
//! `InsufficientCapacity` into 507, `Conflict` into 409), so each variant carries what a client needs to
//! fix its request: the field at fault, or what was asked against what could be had.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{Locality, Mode, Request};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request can never be satisfied as written; `field` names the request field at fault.
    #[error("invalid request: {field}: {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    /// The request is valid but the pool cannot hold it now. Nothing was changed.
    #[error("insufficient GPU capacity: {0}")]
    InsufficientCapacity(Shortfall),
    /// An inventory change (host or GPU registration) is malformed; `field` names what is wrong.
    #[error("invalid inventory: {field}: {reason}")]
    InvalidInventory { field: &'static str, reason: String },
    /// The operation contradicts what the pool already holds.
    #[error("conflict: {0}")]
    Conflict(String),
}

impl Error {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidRequest { field, reason: reason.into() }
    }

    pub(crate) fn inventory(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInventory { field, reason: reason.into() }
    }
}

/// What was missing for a request: what was asked, and the best placement the pool could make now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortfall {
    pub requested: u32,
    /// How many of the requested cGPUs the pool could place now (on one host for locality `local`).
    pub placeable: u32,
    pub gpu_memory_mib: Option<u64>,
    pub mode: Mode,
    pub locality: Locality,
    /// Set when the GPUs were there but no host could run the VM.
    pub no_vm_host: bool,
    /// Set when the GPUs may be free but are held for requests waiting in the queue ahead of it.
    #[serde(default)]
    pub held_for_queue: bool,
    /// Set when it could not be placed even were every GPU free (see `Pool::could_ever_fit`):
    /// waiting would not help.
    #[serde(default)]
    pub never_fits: bool,
}

impl Shortfall {
    /// What `request` asked for, against the `placeable` cGPUs the pool could place now.
    pub(crate) fn of(request: &Request, placeable: u32, no_vm_host: bool) -> Self {
        Shortfall {
            requested: request.ncgpus,
            placeable,
            gpu_memory_mib: request.gpu_memory_mib,
            mode: request.mode,
            locality: request.locality,
            no_vm_host,
            held_for_queue: false,
            never_fits: false,
        }
    }

    /// `request` may not take free GPUs now: they are held for requests waiting ahead of it.
    pub fn held_for_queue(request: &Request) -> Self {
        Shortfall { held_for_queue: true, ..Shortfall::of(request, 0, false) }
    }

    /// `request`, of which `placeable` cGPUs could be placed now, could not be placed even on an
    /// empty pool.
    pub fn never_fits(request: &Request, placeable: u32) -> Self {
        Shortfall { never_fits: true, ..Shortfall::of(request, placeable, false) }
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = if self.requested == 1 { "" } else { "s" };
        write!(f, "asked for {} {} cGPU{plural}", self.requested, self.mode)?;
        if let Some(mib) = self.gpu_memory_mib {
            write!(f, " of {mib} MiB")?;
        }
        write!(f, " with locality {}", self.locality)?;
        if self.never_fits {
            let which = match self.locality {
                Locality::Local => "one compute-gpu host's",
                _ => "the pool's",
            };
            write!(
                f,
                ", which {which} schedulable GPUs could not hold even with every GPU free: it can \
                 never fit, so it is not queued"
            )
        } else if self.held_for_queue {
            write!(
                f,
                ", but the free GPUs are held for requests waiting in the queue ahead of it \
                 (with queue: true it waits its turn)"
            )
        } else if self.no_vm_host {
            let which = match self.locality {
                Locality::Remote => "compute-rgpu host",
                _ => "host with a RODVR agent",
            };
            write!(f, ", but no schedulable {which} can run the VM")
        } else if self.locality == Locality::Local {
            write!(f, ", but at most {} fit on one compute-gpu host now", self.placeable)
        } else {
            write!(f, ", but at most {} can be placed now", self.placeable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_cause() {
        let e = Error::invalid("ncgpus", "must be at least 1");
        assert_eq!(e.to_string(), "invalid request: ncgpus: must be at least 1");
        let e = Error::InsufficientCapacity(Shortfall {
            requested: 9,
            placeable: 0,
            gpu_memory_mib: Some(4096),
            mode: Mode::Shared,
            locality: Locality::Any,
            no_vm_host: false,
            held_for_queue: false,
            never_fits: false,
        });
        assert_eq!(
            e.to_string(),
            "insufficient GPU capacity: asked for 9 shared cGPUs of 4096 MiB with locality any, \
             but at most 0 can be placed now"
        );
    }
}
