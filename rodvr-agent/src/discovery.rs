//! What GPUs this host has and which rCUDA daemon serves each.
//!
//! NVML is the truth when an NVIDIA driver is loaded (`nvml-wrapper` loads `libnvidia-ml` at run
//! time, so the agent builds and runs on hosts without it); otherwise the operator lists the GPUs in
//! the config file. Both sit behind [`GpuDiscovery`]. Each GPU gets its own rCUDA daemon on
//! `base_port + index`, so a VM always addresses its cGPU as device 0 and learns nothing about the
//! host's GPU layout. A GPU's id is `<host>:<local id>` (the NVML UUID, the configured id, or
//! `gpu<index>`): gsaasd accepts from each host only ids under its own name.
//!
//! A GPU in MIG mode is reported with its MIG instances, each a GPU of its own (a partition)
//! naming its parent: gsaasd books the partitions and never the parent whole. NVML numbers the
//! instances per GPU; a partition's index here is [`partition_index`] of its parent's and its
//! own, past any whole GPU's, so its rCUDA port stays put while other GPUs come and go (gsaasd's
//! inventory numbers partitions so too).

use gpgpums::ids::{GpuId, HostId};
use gpgpums::{GpuAttributes, MajorMinor};

use crate::config::{GpuConfig, RcudaConfig};
use rodvr_contract::protocol::{partition_index, GpuReport, HostKind, RcudaEndpoint};

/// A GPU as found, before an rCUDA endpoint is assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundGpu {
    pub index: u32,
    pub id: Option<String>,
    pub model: String,
    pub memory_mib: u64,
    pub rcuda_port: Option<u16>,
    /// Why the GPU is unhealthy when found; none: healthy.
    pub unhealthy: Option<String>,
    pub attributes: GpuAttributes,
    /// Set for a partition: its parent's index and its profile.
    pub partition: Option<(u32, String)>,
    /// Whether the GPU is in MIG mode, where the driver says (a GPU that does not support MIG,
    /// a partition, or one from the config: `None`).
    pub mig_mode: Option<bool>,
}

/// A MIG instance's profile from its NVML name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`), or, when
/// the name has none, from its memory (`5gb`).
pub fn mig_profile(name: &str, memory_mib: u64) -> String {
    name.rsplit_once(" MIG ")
        .map(|(_, profile)| profile.trim().to_owned())
        .filter(|profile| gpgpums::profile_name_problem(profile).is_none())
        .unwrap_or_else(|| format!("{}gb", memory_mib.div_ceil(1024)))
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("NVML query failed")]
    Nvml(#[source] nvml_wrapper::error::NvmlError),
    #[error("GPU id {id:?} is invalid")]
    BadId { id: String, source: gpgpums::ids::IdError },
    #[error("GPU id {id:?} must be non-empty and hold no ':' (the host's name is put before it)")]
    LocalId { id: String },
    #[error("GPU {index}'s rCUDA port {base} + {index} is above 65535")]
    PortOverflow { index: u32, base: u16 },
    #[error("GPUs were found but no [rcuda] address is configured")]
    NoRcudaAddress,
    #[error("GPU {index} is a partition of GPU {parent}, which is not found")]
    NoParent { index: u32, parent: u32 },
}

pub trait GpuDiscovery: std::fmt::Debug + Send + Sync {
    fn gpus(&self) -> Result<Vec<FoundGpu>, DiscoveryError>;

    /// Each GPU's health now, by index: why it is unhealthy, or `None`. Asked before every
    /// heartbeat, so a GPU that fails stops taking cGPUs within one heartbeat.
    fn health(&self) -> Vec<(u32, Option<String>)>;

    /// Where the GPUs come from, for people: NVML with its driver's version, or the config.
    fn source(&self) -> String;

    /// The GPU memory each process holds now (bytes, by host PID, over every GPU), as the driver
    /// counts it; `None` where nothing can tell (no NVML).
    fn process_memory(&self) -> Option<std::collections::HashMap<u32, u64>> {
        None
    }
}

/// GPUs listed in the config file.
#[derive(Debug, Clone)]
pub struct ConfiguredGpus(pub Vec<GpuConfig>);

impl GpuDiscovery for ConfiguredGpus {
    fn gpus(&self) -> Result<Vec<FoundGpu>, DiscoveryError> {
        Ok(self
            .0
            .iter()
            .map(|g| FoundGpu {
                index: g.index,
                id: g.id.clone(),
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                rcuda_port: g.rcuda_port,
                unhealthy: g.unhealthy.clone(),
                attributes: g.attributes(),
                partition: g.parent.zip(g.profile.clone()),
                mig_mode: None,
            })
            .collect())
    }

    /// What the operator wrote in the config (`unhealthy = "..."` on a GPU).
    fn health(&self) -> Vec<(u32, Option<String>)> {
        self.0.iter().map(|g| (g.index, g.unhealthy.clone())).collect()
    }

    fn source(&self) -> String {
        "the config's GPUs (no NVIDIA driver found)".to_owned()
    }
}

/// GPUs reported by the NVIDIA driver, with their health: a GPU is unhealthy when NVML cannot
/// reach it (fallen off the bus), when it counts uncorrectable ECC errors since the driver
/// loaded or has memory pages waiting to be retired (both need a GPU reset), or after a critical
/// XID error (watched by a thread on NVML's event set; sticky until the agent restarts, as the
/// errors NVML calls critical all need a reset).
pub struct NvmlGpus {
    nvml: &'static nvml_wrapper::Nvml,
    xids: XidLog,
}

/// Each GPU's last critical XID error, by index.
type XidLog = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, u64>>>;

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlGpus")
    }
}

impl NvmlGpus {
    /// `None` when no NVIDIA driver is present. NVML stays loaded for the process's life (the
    /// event thread borrows it).
    pub fn open() -> Option<Self> {
        let nvml: &'static nvml_wrapper::Nvml =
            Box::leak(Box::new(nvml_wrapper::Nvml::init().ok()?));
        let xids = XidLog::default();
        watch_xids(nvml, &xids);
        Some(NvmlGpus { nvml, xids })
    }
}

/// Records each GPU's last critical XID error, by index, from NVML's event set.
fn watch_xids(nvml: &'static nvml_wrapper::Nvml, xids: &XidLog) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let Ok(count) = nvml.device_count() else { return };
    // One event set and thread per GPU: a GPU that refuses events (not every one supports them)
    // costs only its own watch.
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else { continue };
        let Ok(set) = nvml.create_event_set() else { return };
        let Ok(set) = device.register_events(EventTypes::CRITICAL_XID_ERROR, set) else {
            continue;
        };
        let xids = std::sync::Arc::clone(xids);
        let spawned =
            std::thread::Builder::new().name(format!("nvml-xid-{index}")).spawn(move || loop {
                match set.wait(10_000) {
                    Ok(event) => {
                        let xid = match event.event_data {
                            Some(XidError::Value(xid)) => xid,
                            _ => 0,
                        };
                        xids.lock().unwrap_or_else(|p| p.into_inner()).insert(index, xid);
                    }
                    Err(nvml_wrapper::error::NvmlError::Timeout) => {}
                    Err(_) => std::thread::sleep(std::time::Duration::from_secs(10)),
                }
            });
        if let Err(e) = spawned {
            eprintln!("rodvr-agent: cannot watch GPU {index}'s XID errors: {e}");
        }
    }
}

impl GpuDiscovery for NvmlGpus {
    fn gpus(&self) -> Result<Vec<FoundGpu>, DiscoveryError> {
        let count = self.nvml.device_count().map_err(DiscoveryError::Nvml)?;
        let health: std::collections::HashMap<u32, Option<String>> =
            self.health().into_iter().collect();
        // The driver's CUDA version, as NVML encodes it: 12040 is 12.4.
        let cuda_version = self.nvml.sys_cuda_driver_version().ok().and_then(|v| {
            let v = u16::try_from(v).ok()?;
            Some(MajorMinor::new(v / 1000, v % 1000 / 10))
        });
        let mut found = Vec::new();
        for index in 0..count {
            let dev = self.nvml.device_by_index(index).map_err(DiscoveryError::Nvml)?;
            let uuid = dev.uuid().map_err(DiscoveryError::Nvml)?;
            let compute_capability = dev.cuda_compute_capability().ok().and_then(|cc| {
                Some(MajorMinor::new(u16::try_from(cc.major).ok()?, u16::try_from(cc.minor).ok()?))
            });
            let unhealthy = health.get(&index).cloned().flatten();
            let attributes = |uuid: String| GpuAttributes {
                compute_capability,
                cuda_version,
                uuid: Some(uuid),
                traits: Default::default(),
                // The host's, set with its servers' endpoints (`inventory`).
                remoting: Default::default(),
                managed: false,
                mps: false,
            };
            let mig_mode = dev.mig_mode().ok().map(|mode| mode.current == 1);
            found.push(FoundGpu {
                index,
                id: Some(uuid.clone()),
                model: dev.name().map_err(DiscoveryError::Nvml)?,
                memory_mib: dev.memory_info().map_err(DiscoveryError::Nvml)?.total >> 20,
                rcuda_port: None,
                unhealthy,
                attributes: attributes(uuid),
                partition: None,
                mig_mode,
            });
            // MIG mode on (1): its instances, each a partition of it. A slot without one answers
            // NotFound.
            if mig_mode != Some(true) {
                continue;
            }
            let slots = dev.mig_device_count().map_err(DiscoveryError::Nvml)?;
            for mig_index in 0..slots {
                let Ok(instance) = dev.mig_device_by_index(mig_index) else { continue };
                let uuid = instance.uuid().map_err(DiscoveryError::Nvml)?;
                let name = instance.name().map_err(DiscoveryError::Nvml)?;
                let memory_mib = instance.memory_info().map_err(DiscoveryError::Nvml)?.total >> 20;
                found.push(FoundGpu {
                    index: partition_index(index, mig_index),
                    id: Some(uuid.clone()),
                    partition: Some((index, mig_profile(&name, memory_mib))),
                    model: name,
                    memory_mib,
                    rcuda_port: None,
                    // Its parent's health covers it (gsaasd's pool): the heartbeats' health
                    // is the physical GPUs'.
                    unhealthy: None,
                    attributes: attributes(uuid),
                    mig_mode: None,
                });
            }
        }
        Ok(found)
    }

    fn health(&self) -> Vec<(u32, Option<String>)> {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
        use nvml_wrapper::error::NvmlError;
        let Ok(count) = self.nvml.device_count() else { return Vec::new() };
        let xids = self.xids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (0..count)
            .map(|index| {
                let device = match self.nvml.device_by_index(index) {
                    Ok(device) => device,
                    Err(NvmlError::GpuLost) => {
                        return (index, Some("fallen off the bus (NVML: GPU is lost)".into()))
                    }
                    Err(e) => return (index, Some(format!("NVML cannot reach it: {e}"))),
                };
                let why = if let Some(xid) = xids.get(&index) {
                    Some(format!("critical XID error {xid}"))
                } else if let Ok(n @ 1..) =
                    device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                {
                    Some(format!("{n} uncorrectable ECC errors since the driver loaded"))
                } else if let Ok(true) = device.are_pages_pending_retired() {
                    Some("memory pages wait to be retired (the GPU needs a reset)".into())
                } else if let Err(NvmlError::GpuLost) = device.uuid() {
                    Some("fallen off the bus (NVML: GPU is lost)".into())
                } else {
                    None
                };
                (index, why)
            })
            .collect()
    }

    fn source(&self) -> String {
        let driver = self.nvml.sys_driver_version().unwrap_or_else(|e| format!("unknown ({e})"));
        format!("NVML, driver {driver}")
    }

    fn process_memory(&self) -> Option<std::collections::HashMap<u32, u64>> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let count = self.nvml.device_count().ok()?;
        let mut held: std::collections::HashMap<u32, u64> = Default::default();
        for index in 0..count {
            // A GPU that cannot answer tells nothing of its processes; the others still do.
            let Ok(device) = self.nvml.device_by_index(index) else { continue };
            let processes = device.running_compute_processes().ok()?;
            for process in processes {
                if let UsedGpuMemory::Used(bytes) = process.used_gpu_memory {
                    *held.entry(process.pid).or_default() += bytes;
                }
            }
        }
        Some(held)
    }
}

/// NVML when a driver is present, the config file otherwise.
pub fn default_discovery(configured: &[GpuConfig]) -> Box<dyn GpuDiscovery> {
    match NvmlGpus::open() {
        Some(nvml) => Box::new(nvml),
        None => Box::new(ConfiguredGpus(configured.to_vec())),
    }
}

/// Assigns each found GPU its id and rCUDA endpoint, and each partition its parent's id.
pub fn inventory(
    host: &HostId,
    found: Vec<FoundGpu>,
    rcuda: Option<&RcudaConfig>,
) -> Result<Vec<GpuReport>, DiscoveryError> {
    let gpu_id = |g: &FoundGpu| {
        let local = g.id.clone().unwrap_or_else(|| format!("gpu{}", g.index));
        if local.is_empty() || local.contains(':') {
            return Err(DiscoveryError::LocalId { id: local });
        }
        let id = format!("{host}:{local}");
        GpuId::new(id.clone()).map_err(|source| DiscoveryError::BadId { id, source })
    };
    let ids: Vec<(u32, GpuId)> =
        found.iter().map(|g| Ok((g.index, gpu_id(g)?))).collect::<Result<_, _>>()?;
    found
        .into_iter()
        .zip(ids.iter().map(|(_, id)| id.clone()))
        .map(|(g, id)| {
            let rcuda = rcuda.ok_or(DiscoveryError::NoRcudaAddress)?;
            let partition = match &g.partition {
                None => None,
                Some((parent, profile)) => {
                    let (_, parent_id) = ids
                        .iter()
                        .find(|(index, _)| index == parent)
                        .ok_or(DiscoveryError::NoParent { index: g.index, parent: *parent })?;
                    Some(gpgpums::Partition { parent: parent_id.clone(), profile: profile.clone() })
                }
            };
            let base = rcuda.base_port();
            let port = match g.rcuda_port {
                Some(p) => p,
                None => u16::try_from(u32::from(base) + g.index)
                    .map_err(|_| DiscoveryError::PortOverflow { index: g.index, base })?,
            };
            Ok(GpuReport {
                id,
                index: g.index,
                model: g.model,
                memory_mib: g.memory_mib,
                rcuda: RcudaEndpoint { address: rcuda.address, port, gpu_number: 0 },
                unhealthy: g.unhealthy.as_deref().map(rodvr_contract::protocol::health_reason),
                attributes: GpuAttributes {
                    remoting: rcuda.remoting,
                    managed: rcuda.managed,
                    mps: rcuda.managed && rcuda.mps,
                    ..g.attributes
                },
                partition,
            })
        })
        .collect()
}

/// What discovery found, one line per GPU, as `rodvr-agent gpus` prints it (for operators, and
/// `scripts/gpu-check.sh` on a GPU machine): index, model, memory, compute capability, the
/// driver's CUDA version, UUID, MIG mode (or the partition's parent and profile), health.
pub fn describe(found: &[FoundGpu]) -> String {
    let mut out = String::new();
    for g in found {
        let version = |v: Option<MajorMinor>| v.map_or("?".to_owned(), |v| v.to_string());
        let mig = match (&g.partition, g.mig_mode) {
            (Some((parent, profile)), _) => format!("partition {profile} of GPU {parent}"),
            (None, Some(true)) => "MIG on".to_owned(),
            (None, Some(false)) => "MIG off".to_owned(),
            (None, None) => "MIG n/a".to_owned(),
        };
        out.push_str(&format!(
            "GPU {}: {} | {} MiB | compute capability {} | CUDA {} | {} | {} | {}\n",
            g.index,
            g.model,
            g.memory_mib,
            version(g.attributes.compute_capability),
            version(g.attributes.cuda_version),
            g.attributes.uuid.as_deref().or(g.id.as_deref()).unwrap_or("no UUID"),
            mig,
            g.unhealthy.as_deref().map_or("healthy".to_owned(), |why| format!("unhealthy: {why}")),
        ));
    }
    out
}

/// compute-GPU when the host has GPUs, compute-rGPU otherwise.
pub fn host_kind(gpus: &[GpuReport]) -> HostKind {
    if gpus.is_empty() {
        HostKind::ComputeRgpu
    } else {
        HostKind::ComputeGpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole GPU as an operator lists it, nothing more known.
    fn whole_gpu(index: u32, model: &str, memory_mib: u64) -> GpuConfig {
        GpuConfig {
            index,
            model: model.into(),
            memory_mib,
            id: None,
            rcuda_port: None,
            unhealthy: None,
            compute_capability: None,
            cuda_version: None,
            uuid: None,
            traits: Default::default(),
            parent: None,
            profile: None,
        }
    }

    #[test]
    fn one_rcuda_daemon_per_gpu() {
        let host = HostId::new("cg0").unwrap();
        let gpus = ConfiguredGpus(vec![
            whole_gpu(0, "K20m", 4800),
            GpuConfig {
                id: Some("GPU-1".into()),
                unhealthy: Some("fan failed".into()),
                compute_capability: Some(MajorMinor::new(3, 5)),
                traits: ["CUSTOM_RACK_R1".to_owned()].into(),
                ..whole_gpu(1, "K20m", 4800)
            },
        ]);
        let rcuda = RcudaConfig {
            base_port: Some(8308),
            ..RcudaConfig::unmanaged("10.232.0.2".parse().unwrap())
        };
        let inv = inventory(&host, gpus.gpus().unwrap(), Some(&rcuda)).unwrap();
        assert_eq!(inv[0].id.as_str(), "cg0:gpu0");
        assert_eq!(inv[1].id.as_str(), "cg0:GPU-1");
        assert_eq!(inv[1].rcuda.socket_addr(), "10.232.0.2:8309".parse().unwrap());
        assert!(inv.iter().all(|g| g.rcuda.gpu_number == 0));
        assert_eq!(inv[1].attributes.compute_capability, Some(MajorMinor::new(3, 5)));
        assert!(inv[1].attributes.traits.contains("CUSTOM_RACK_R1"));
        assert_eq!(
            (inv[0].unhealthy.as_deref(), inv[1].unhealthy.as_deref()),
            (None, Some("fan failed"))
        );
        assert_eq!(gpus.health(), vec![(0, None), (1, Some("fan failed".into()))]);
        assert_eq!(host_kind(&inv), HostKind::ComputeGpu);
        assert!(matches!(
            inventory(&host, gpus.gpus().unwrap(), None),
            Err(DiscoveryError::NoRcudaAddress)
        ));
        assert_eq!(host_kind(&[]), HostKind::ComputeRgpu);
        // A LUPINE host: every GPU's server speaks it, on LUPINE's port unless one is set.
        let lupine =
            RcudaConfig { remoting: gpgpums::Remoting::Lupine, base_port: None, ..rcuda.clone() };
        let inv = inventory(&host, gpus.gpus().unwrap(), Some(&lupine)).unwrap();
        assert_eq!(inv[1].rcuda.socket_addr(), "10.232.0.2:14834".parse().unwrap());
        assert!(inv.iter().all(|g| g.attributes.remoting == gpgpums::Remoting::Lupine));
        assert!(inv[1].attributes.traits.contains("CUSTOM_RACK_R1"));
        let colon =
            ConfiguredGpus(vec![GpuConfig { id: Some("cg1:gpu0".into()), ..gpus.0[0].clone() }]);
        assert!(matches!(
            inventory(&host, colon.gpus().unwrap(), Some(&rcuda)),
            Err(DiscoveryError::LocalId { .. })
        ));
    }

    #[test]
    fn partitions_name_their_parent_and_keep_their_place() {
        let host = HostId::new("cg0").unwrap();
        let whole = GpuConfig { id: Some("GPU-a".into()), ..whole_gpu(0, "A100", 81920) };
        let part = |mig: u32| GpuConfig {
            index: partition_index(0, mig),
            model: "A100 MIG 3g.40gb".into(),
            memory_mib: 40960,
            id: None,
            parent: Some(0),
            profile: Some("3g.40gb".into()),
            ..whole.clone()
        };
        let gpus = ConfiguredGpus(vec![whole.clone(), part(0), part(1)]);
        let rcuda = RcudaConfig {
            base_port: Some(8308),
            ..RcudaConfig::unmanaged("10.232.0.2".parse().unwrap())
        };
        let inv = inventory(&host, gpus.gpus().unwrap(), Some(&rcuda)).unwrap();
        assert_eq!(inv[0].partition, None);
        let partition = inv[2].partition.as_ref().unwrap();
        assert_eq!(
            (partition.parent.as_str(), partition.profile.as_str()),
            ("cg0:GPU-a", "3g.40gb")
        );
        assert_eq!((inv[1].id.as_str(), inv[2].index), ("cg0:gpu100", 101));
        // Its own daemon, past the whole GPUs' ports.
        assert_eq!(inv[2].rcuda.socket_addr(), "10.232.0.2:8409".parse().unwrap());
        let range = "100.127.0.0/16".parse().unwrap();
        let report = rodvr_contract::protocol::HostReport {
            host: host.clone(),
            kind: host_kind(&inv),
            agent_url: "http://10.0.0.1:7450".into(),
            gpus: inv,
            applied_generation: None,
            topology: Default::default(),
            rtt_us: None,
            managed: None,
            gpu_address: None,
            local_vms: None,
        };
        assert_eq!(report.validate(range), Ok(()));
        // A partition of a GPU the host does not have.
        let orphan = ConfiguredGpus(vec![whole.clone(), GpuConfig { parent: Some(7), ..part(0) }]);
        assert!(matches!(
            inventory(&host, orphan.gpus().unwrap(), Some(&rcuda)),
            Err(DiscoveryError::NoParent { index: 100, parent: 7 })
        ));
    }

    #[test]
    fn mig_profiles_come_from_nvml_names() {
        assert_eq!(mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864), "1g.5gb");
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", 9984), "1g.10gb+me");
        // A name without one (or with garbage after MIG): its memory, rounded up.
        assert_eq!(mig_profile("NVIDIA H100", 9984), "10gb");
        assert_eq!(mig_profile("X MIG \u{1b}[2J", 9984), "10gb");
        assert_eq!(partition_index(0, 0), 100);
        assert_eq!(partition_index(7, 6), 806);
    }
}
