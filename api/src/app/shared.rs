//! What the application layer's modules share: the VM as its requests see it, what a view shows
//! of the queue, and the terms every booking applies. Here, below the modules that launch,
//! attach, queue and book, so that none of them imports another for a type.

use std::collections::HashMap;
use std::time::Duration;

use gpgpums::VmId;

use crate::cloudinit::{RcudaDevice, RcudaEnv};
use crate::db;
use crate::model::{CgpuRecord, CgpuState, VmRecord};

/// A VM with its cGPUs.
#[derive(Debug, Clone)]
pub struct VmDetails {
    pub vm: VmRecord,
    pub cgpus: Vec<CgpuRecord>,
    /// Set by a read of the VM by id that found neither queue entries nor events of it, in the
    /// same snapshot: its view need not read them, and is the same for every read at these
    /// versions (see [`super::rendered`]). None: not known.
    pub view_versions: Option<ViewVersions>,
}

/// The versions a VM's view depends on (see [`VmDetails::view_versions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewVersions {
    /// The VM's `version`.
    pub vm: i64,
    /// Its cGPUs' (`cgpus_version`).
    pub cgpus: i64,
}

/// The rCUDA environment of a VM's cGPUs (in attach order): its live ones, numbered from 0.
pub fn rcuda_env(cgpus: &[CgpuRecord]) -> RcudaEnv {
    RcudaEnv {
        devices: cgpus
            .iter()
            .filter(|c| c.state == CgpuState::Live)
            .map(|c| RcudaDevice {
                address: c.masked_address,
                port: c.masked_port,
                gpu_number: c.rcuda_gpu_number,
            })
            .collect(),
    }
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
