//! Which remote-GPU layer a GPU's server speaks, and what each layer can do.
//!
//! GSaaS's masking does not depend on the layer: any layer whose client finds its servers through
//! environment variables and whose server listens on one TCP port fits. So the layer is a
//! property of each GPU's server (its host's agent or the inventory says which), a pool may mix
//! layers, and a VM's cGPUs all speak the one its request named (or the configured default):
//! one client library in the VM serves them all. Placement treats the layer as a hard
//! constraint ([`crate::GpuConstraints::remoting`]), so attach and re-homing, which place with
//! the VM's own constraints, keep to it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A remote-GPU layer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Remoting {
    /// rCUDA (proprietary): `RCUDA_DEVICE_COUNT` and `RCUDA_DEVICE_<j>=<address>@<port>:<gpu>`.
    /// The layer of every GPU registered before layers were told apart.
    #[default]
    Rcuda,
    /// LUPINE, formerly SCUDA (Apache-2.0): `LUPINE_SERVER=<address>:<port>,...`, plain HTTP/2
    /// with neither TLS nor authentication (see `docs/lupine.md`).
    Lupine,
}

impl Remoting {
    pub const ALL: [Remoting; 2] = [Remoting::Rcuda, Remoting::Lupine];

    pub fn as_str(self) -> &'static str {
        match self {
            Remoting::Rcuda => "rcuda",
            Remoting::Lupine => "lupine",
        }
    }

    /// The port its servers listen on when none is configured (one server per GPU: the base
    /// port of a host's servers).
    pub const fn default_port(self) -> u16 {
        match self {
            Remoting::Rcuda => 8308,
            Remoting::Lupine => 14833,
        }
    }

    /// The most cGPUs one VM may have on this layer: LUPINE's client keeps at most 16 servers
    /// and ignores the rest (an older client overran its array), and GSaaS gives each cGPU a
    /// server of its own.
    pub fn max_cgpus_per_vm(self) -> Option<u32> {
        match self {
            Remoting::Rcuda => None,
            Remoting::Lupine => Some(16),
        }
    }

    /// Why a VM on this layer cannot have `ncgpus` cGPUs, if it cannot.
    pub fn ncgpus_problem(self, ncgpus: u64) -> Option<String> {
        let max = self.max_cgpus_per_vm()?;
        (ncgpus > u64::from(max)).then(|| {
            format!(
                "{ncgpus} cGPUs are more than a VM may have on {self}: its client reaches at most \
                 {max} servers"
            )
        })
    }

    /// Why a VM on this layer that holds `held` cGPUs cannot get `more`, if it cannot.
    pub fn attach_problem(self, held: usize, more: u32) -> Option<String> {
        let problem = self.ncgpus_problem(held as u64 + u64::from(more))?;
        Some(format!("the VM holds {held} cGPUs: {problem}"))
    }

    pub fn is_rcuda(&self) -> bool {
        *self == Remoting::Rcuda
    }
}

impl fmt::Display for Remoting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Remoting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Remoting::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| {
            let shown: String = s.chars().take(32).collect();
            format!("{shown:?} is no remote-GPU layer: rcuda or lupine")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ports_and_limits() {
        for r in Remoting::ALL {
            assert_eq!(r.as_str().parse::<Remoting>(), Ok(r));
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
        }
        assert!("RCUDA".parse::<Remoting>().unwrap_err().contains("rcuda or lupine"));
        assert_eq!(Remoting::Lupine.default_port(), 14833);
        assert_eq!(Remoting::Lupine.ncgpus_problem(16), None);
        assert!(Remoting::Lupine.ncgpus_problem(17).unwrap().contains("at most 16"));
        assert_eq!(Remoting::Rcuda.ncgpus_problem(4096), None);
    }
}
