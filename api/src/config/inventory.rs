//! The inventory in gsaasd's configuration (`[[hosts.inventory]]`): hosts and their GPUs (whole,
//! partitioned, or stated in groups), for a fleet without agents, and the checks each entry
//! passes before anything of it is believed.

use super::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryHost {
    pub name: HostId,
    pub kind: HostKind,
    #[serde(default)]
    pub gpus: Vec<InventoryGpu>,
    /// The host's address on the GPU network, where its GPU servers listen.
    #[serde(default)]
    pub gpu_network_address: Option<Ipv4Addr>,
    /// The remote-GPU layer its GPU servers speak (`rcuda`, `lupine`).
    #[serde(default)]
    pub remoting: gpgpums::Remoting,
    /// The first GPU's server port (one server per GPU, on `server_base_port + index`); the
    /// layer's own when left out (rCUDA 8308, LUPINE 14833).
    #[serde(default)]
    pub server_base_port: Option<u16>,
    /// Where it sits in the network: its group at each of the operator's levels
    /// (`{ zone = "z1", rack = "r12" }`).
    #[serde(default)]
    pub topology: gpgpums::Topology,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryGpu {
    pub model: String,
    pub memory_mib: u64,
    /// How many such GPUs, indexed after the ones before.
    #[serde(default = "one")]
    pub count: u32,
    /// Set by an operator to take these GPUs out of service (why); they take no new cGPUs.
    #[serde(default)]
    pub unhealthy: Option<String>,
    /// Compute capability (`"8.0"`).
    #[serde(default)]
    pub compute_capability: Option<gpgpums::MajorMinor>,
    /// The CUDA version their driver supports (`"12.4"`).
    #[serde(default)]
    pub cuda_version: Option<gpgpums::MajorMinor>,
    /// Only with `count = 1`: a UUID names one GPU.
    #[serde(default)]
    pub uuid: Option<String>,
    /// os-traits names or the operator's own (`CUSTOM_` and A-Z, 0-9, _).
    #[serde(default)]
    pub traits: std::collections::BTreeSet<String>,
    /// Each of these GPUs is partitioned so (MIG instances): it then serves through its
    /// partitions only. They are indexed after every whole GPU of the host.
    #[serde(default)]
    pub partitions: Vec<InventoryPartition>,
}

/// Partitions of a GPU of the inventory, alike.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryPartition {
    /// As NVIDIA names it (`1g.10gb`).
    pub profile: String,
    pub memory_mib: u64,
    #[serde(default = "one")]
    pub count: u32,
    /// Defaults to the GPU's model, ` MIG ` and the profile (as NVML names a MIG device).
    #[serde(default)]
    pub model: Option<String>,
    /// Beside the GPU's own, which its partitions have too.
    #[serde(default)]
    pub traits: std::collections::BTreeSet<String>,
}

/// A GPU of an inventory host, whole or a partition, with its place.
#[derive(Debug, Clone)]
pub struct InventoryEntry {
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    pub unhealthy: Option<String>,
    pub attributes: gpgpums::GpuAttributes,
    /// A partition's parent index and profile.
    pub partition: Option<(u32, String)>,
    pub rcuda: SocketAddrV4,
}

impl InventoryGpu {
    /// `count` healthy GPUs of `model` and `memory_mib`, nothing more known of them.
    pub fn of(model: &str, memory_mib: u64, count: u32) -> InventoryGpu {
        InventoryGpu {
            model: model.to_owned(),
            memory_mib,
            count,
            unhealthy: None,
            compute_capability: None,
            cuda_version: None,
            uuid: None,
            traits: Default::default(),
            partitions: Vec::new(),
        }
    }

    /// What the operator states of it; the rest is its host's, set with its servers' endpoints
    /// (`InventoryHost::gpus`).
    pub fn attributes(&self) -> gpgpums::GpuAttributes {
        let (capability, cuda, uuid) = (self.compute_capability, self.cuda_version, &self.uuid);
        gpgpums::GpuAttributes::stated(capability, cuda, uuid.clone(), self.traits.clone())
    }
}

fn one() -> u32 {
    1
}

impl InventoryHost {
    /// The port of its first GPU's server.
    pub fn server_base_port(&self) -> u16 {
        self.server_base_port.unwrap_or(self.remoting.default_port())
    }

    /// The GPUs, each with its index and server endpoint: the whole ones, then each one's
    /// partitions, numbered as agents number them (`partition_index`: a partition's index and port
    /// stay when GPUs are added).
    pub fn gpus(&self) -> Vec<InventoryEntry> {
        let address = self.gpu_network_address.unwrap_or(Ipv4Addr::LOCALHOST);
        let base = self.server_base_port();
        let rcuda = |index: u32| {
            // Past the last port: refused at load (`check`).
            let offset = u16::try_from(index).unwrap_or(u16::MAX);
            SocketAddrV4::new(address, base.saturating_add(offset))
        };
        let whole: Vec<&InventoryGpu> =
            self.gpus.iter().flat_map(|gpu| std::iter::repeat_n(gpu, gpu.count as usize)).collect();
        let mut entries: Vec<InventoryEntry> = (0u32..)
            .zip(&whole)
            .map(|(index, gpu)| InventoryEntry {
                index,
                model: gpu.model.clone(),
                memory_mib: gpu.memory_mib,
                unhealthy: gpu.unhealthy.clone(),
                attributes: gpgpums::GpuAttributes { remoting: self.remoting, ..gpu.attributes() },
                partition: None,
                rcuda: rcuda(index),
            })
            .collect();
        for (parent, gpu) in (0u32..).zip(&whole) {
            let parts =
                gpu.partitions.iter().flat_map(|p| std::iter::repeat_n(p, p.count as usize));
            for (nth, part) in (0u32..).zip(parts) {
                let index = rodvr_contract::protocol::partition_index(parent, nth);
                let mut attributes = gpgpums::GpuAttributes {
                    uuid: None,
                    remoting: self.remoting,
                    ..gpu.attributes()
                };
                attributes.traits.extend(part.traits.iter().cloned());
                entries.push(InventoryEntry {
                    index,
                    model: part
                        .model
                        .clone()
                        .unwrap_or_else(|| format!("{} MIG {}", gpu.model, part.profile)),
                    memory_mib: part.memory_mib,
                    unhealthy: None,
                    attributes,
                    partition: Some((parent, part.profile.clone())),
                    rcuda: rcuda(index),
                });
            }
        }
        entries
    }

    /// The checks an agent's report of the same host gets: sizes, routable endpoints, topology.
    pub(super) fn check(&self, masked_range: Ipv4Cidr) -> Result<(), String> {
        if let Some((level, why)) = gpgpums::topology_problem(&self.topology) {
            let at = level.map_or("topology".to_owned(), |level| format!("topology.{level}"));
            return Err(format!("{at}: {why}"));
        }
        use rodvr_contract::protocol::{
            check_rcuda_endpoint, MAX_GPUS_PER_HOST, MAX_GPU_MEMORY_MIB,
        };
        let count: u64 = self
            .gpus
            .iter()
            .map(|g| {
                let parts: u64 = g.partitions.iter().map(|p| u64::from(p.count)).sum();
                u64::from(g.count).saturating_mul(parts.saturating_add(1))
            })
            .fold(0, u64::saturating_add);
        if count > MAX_GPUS_PER_HOST as u64 {
            return Err(format!("more than {MAX_GPUS_PER_HOST} GPUs (partitions count)"));
        }
        let whole: u64 = self.gpus.iter().map(|g| u64::from(g.count)).sum();
        let limit = rodvr_contract::protocol::MAX_WHOLE_GPUS_WITH_PARTITIONS;
        if whole > u64::from(limit) && self.gpus.iter().any(|g| !g.partitions.is_empty()) {
            return Err(format!(
                "gpus: partitions: a host with partitions has at most {limit} whole GPUs"
            ));
        }
        for gpu in &self.gpus {
            if let Some((field, why)) = gpu.attributes().problems().into_iter().next() {
                return Err(format!("gpus: {field}: {why}"));
            }
            if gpu.uuid.is_some() && gpu.count != 1 {
                return Err("gpus: uuid names one GPU: it needs count = 1".to_owned());
            }
            let mut taken = 0u64;
            for part in &gpu.partitions {
                if let Some(why) = gpgpums::profile_name_problem(&part.profile) {
                    return Err(format!("gpus: partitions: profile: {why}"));
                }
                if let Some(why) =
                    part.model.as_deref().and_then(gpgpums::traits::model_name_problem)
                {
                    return Err(format!("gpus: partitions: model: {why}"));
                }
                taken = taken.saturating_add(part.memory_mib.saturating_mul(u64::from(part.count)));
                if taken > gpu.memory_mib {
                    return Err(format!(
                        "gpus: partitions: memory_mib: the partitions of a {} of {} MiB have {taken} MiB",
                        gpu.model, gpu.memory_mib
                    ));
                }
            }
        }
        for entry in self.gpus() {
            if u32::from(self.server_base_port()) + entry.index > u32::from(u16::MAX) {
                return Err(format!(
                    "server_base_port: GPU {}'s server would listen past port 65535 ({} + {})",
                    entry.index,
                    self.server_base_port(),
                    entry.index
                ));
            }
            if self.server_base_port == Some(0) {
                return Err("server_base_port: must not be 0".to_owned());
            }
            if !(1..=MAX_GPU_MEMORY_MIB).contains(&entry.memory_mib) {
                return Err(format!("gpus: memory_mib must be between 1 and {MAX_GPU_MEMORY_MIB}"));
            }
            if let Some((field, why)) = entry.attributes.problems().into_iter().next() {
                return Err(format!("gpus: partitions: {field}: {why}"));
            }
            // Without an address the host is simulated (in-process agents): nothing is routed.
            if self.gpu_network_address.is_some() {
                check_rcuda_endpoint(entry.rcuda, masked_range)
                    .map_err(|why| format!("gpu_network_address: {why}"))?;
            }
        }
        Ok(())
    }
}
