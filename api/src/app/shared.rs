//! What the application layer's modules share: the VM as its requests see it, what a view shows
//! of the queue, and the terms every booking applies. Here, below the modules that launch,
//! attach, queue and book, so that none of them imports another for a type.

use std::collections::HashMap;
use std::time::Duration;

use gpgpums::VmId;

use crate::cloudinit::{self, GpuDevice, GpuEnv};
use crate::config::Config;
use crate::db;
use crate::model::{CgpuRecord, CgpuState, VmRecord};

/// A VM with its cGPUs.
#[derive(Debug, Clone)]
pub struct VmDetails {
    pub vm: VmRecord,
    pub cgpus: Vec<CgpuRecord>,
    /// Whether its view needs the VM's queue entries and events read.
    pub extras: Extras,
}

/// A saga handed over by the process that has just written its VM (see
/// [`super::App::spawn_saga_from`]): the VM and its cGPUs as written and, for a launch its
/// placement has just booked, the cloud-init built there for them. Built once: a saga resumed
/// from the store builds it again from what is stored (the request, its cGPUs, the service's
/// masking), which gives the same bytes.
#[derive(Debug, Clone)]
pub struct SagaStart {
    pub details: VmDetails,
    pub user_data: Option<Vec<u8>>,
}

impl From<VmDetails> for SagaStart {
    fn from(details: VmDetails) -> Self {
        SagaStart { details, user_data: None }
    }
}

/// What a VM's view shows besides the VM and its cGPUs: its places in the queue and its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extras {
    /// Not known: the view reads them.
    Unknown,
    /// Neither, as of the snapshot `vm` was read in (a read by id checks in the same statement),
    /// or as of its write when nothing was added since such a read (see
    /// [`VmRecord::extras_version`]). With `versions`, the view is the same for every read at
    /// them (see [`super::rendered`]).
    None { versions: Option<ViewVersions> },
}

impl Extras {
    /// The versions a view without extras is kept under, if known.
    pub fn versions(self) -> Option<ViewVersions> {
        match self {
            Extras::None { versions } => versions,
            Extras::Unknown => None,
        }
    }
}

/// The versions a VM's view depends on (see [`Extras::None`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewVersions {
    /// The VM's `version`.
    pub vm: i64,
    /// Its cGPUs' (`cgpus_version`).
    pub cgpus: i64,
}

/// The remote-GPU environment of `vm` with `cgpus` (in attach order): its live ones, numbered
/// from 0, in its layer, and its lost ones as missing.
pub fn gpu_env(vm: &VmRecord, cgpus: &[CgpuRecord]) -> GpuEnv {
    GpuEnv {
        remoting: vm.spec.remoting(),
        devices: cgpus
            .iter()
            .filter(|c| c.state == CgpuState::Live)
            .map(|c| GpuDevice {
                address: c.masked_address,
                port: c.masked_port,
                gpu_number: c.rcuda_gpu_number,
                cgpu: c.index,
            })
            .collect(),
        missing: {
            // By index, as the agent lists them.
            let mut missing: Vec<u32> =
                cgpus.iter().filter(|c| c.state == CgpuState::Lost).map(|c| c.index).collect();
            missing.sort_unstable();
            missing
        },
    }
}

/// The cloud-init user_data of `vm` with `cgpus`: its remote-GPU environment, where it reads it
/// live, and its owner's own user_data.
pub fn vm_user_data(
    config: &Config,
    vm: &VmRecord,
    cgpus: &[CgpuRecord],
) -> Result<Vec<u8>, cloudinit::UserDataError> {
    let env = gpu_env(vm, cgpus);
    let boot = cloudinit::BootEnv {
        env: &env,
        metadata: config.masking.metadata_endpoint(),
        lupine_library_dir: &config.remoting.lupine_library_dir,
    };
    cloudinit::user_data(&boot, vm.spec.user_data.as_deref().map(str::as_bytes))
}

/// A request waiting in the queue, as its VM's owner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// 1: next.
    pub position: u64,
    pub queued: db::Queued,
    pub enqueued_ms: i64,
    pub deadline_ms: Option<i64>,
}

/// What a list of VMs shows of the queue and of events (see [`super::App::queue_and_events`]).
#[derive(Debug, Default)]
pub struct QueueAndEvents {
    pub entries: HashMap<VmId, Vec<QueueEntry>>,
    pub events: HashMap<VmId, Vec<db::VmEvent>>,
}

/// The longest a queued launch waits on a cloud that creates servers as their tenant, whatever
/// `queue.queue_timeout_secs` says (0 included): every trust gsaasd holds has an end.
pub const MAX_DELEGATED_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
