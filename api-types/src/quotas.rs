//! Project quotas: limits per resource and what a project uses.

use std::collections::BTreeMap;

use gpgpums::{ModelLimits, Quota, Usage};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Limits per resource; `null` (or absent) is no limit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// cGPUs held at once.
    #[serde(default)]
    pub cgpus: Option<u64>,
    /// GPU memory booked at once, MiB (an exclusive cGPU books its whole GPU).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Whole GPUs held exclusively at once.
    #[serde(default)]
    pub exclusive_gpus: Option<u64>,
    /// VMs being created or ready.
    #[serde(default)]
    pub vms: Option<u64>,
    /// The highest `priority` the project's launches may ask for (0 to the service's
    /// `queue.max_priority`). Unlike the others, `null` (or absent) in a `PUT` is the service's
    /// default (`quotas.max_priority`, 0 unless configured); a view always shows the number.
    #[serde(default)]
    pub max_priority: Option<u32>,
    /// Limits on one GPU model each, by the model's exact name (as `gsaas pool` shows it), beside
    /// the totals above. A launch or attach that names no model is placed on the models the
    /// project still has room on; one whose every model is at its limit is refused (403). A `PUT`
    /// replaces them all; absent or `{}`: none.
    #[serde(default)]
    pub models: BTreeMap<String, ModelQuotaLimits>,
}

/// Limits on one GPU model; `null` (or absent) is no limit.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelQuotaLimits {
    /// cGPUs on GPUs of the model held at once.
    #[serde(default)]
    pub cgpus: Option<u64>,
    /// The model's GPU memory booked at once, MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// GPUs of the model held exclusively at once.
    #[serde(default)]
    pub exclusive_gpus: Option<u64>,
}

/// What a project uses of each resource.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaUsage {
    pub cgpus: u64,
    pub memory_mib: u64,
    pub exclusive_gpus: u64,
    pub vms: u64,
    /// What the project holds of each GPU model it holds any of.
    pub models: BTreeMap<String, ModelQuotaUsage>,
}

/// What a project holds of one GPU model (or, in a cohort's view, of the lent resources).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelQuotaUsage {
    pub cgpus: u64,
    pub memory_mib: u64,
    pub exclusive_gpus: u64,
}

/// A project's quota: its limits and what it uses.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaView {
    pub project: String,
    pub limits: QuotaLimits,
    /// `true`: the project's own limits; `false`: the service's defaults.
    pub own_limits: bool,
    pub usage: QuotaUsage,
    /// The cohort the project is in, if any: it may borrow past its limits on what the cohort's
    /// other members leave unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// What it holds past its limits now, borrowed from its cohort.
    #[serde(default)]
    pub borrowed: ModelQuotaUsage,
}

/// Quotas as a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    pub quotas: Vec<QuotaView>,
}

impl From<QuotaLimits> for Quota {
    fn from(l: QuotaLimits) -> Quota {
        Quota {
            cgpus: l.cgpus,
            memory_mib: l.memory_mib,
            exclusive_gpus: l.exclusive_gpus,
            vms: l.vms,
            max_priority: l.max_priority,
            models: l.models.into_iter().map(|(m, l)| (m, l.into())).collect(),
        }
    }
}

impl From<Quota> for QuotaLimits {
    fn from(q: Quota) -> QuotaLimits {
        QuotaLimits {
            cgpus: q.cgpus,
            memory_mib: q.memory_mib,
            exclusive_gpus: q.exclusive_gpus,
            vms: q.vms,
            max_priority: q.max_priority,
            models: q.models.into_iter().map(|(m, l)| (m, l.into())).collect(),
        }
    }
}

impl From<ModelQuotaLimits> for ModelLimits {
    fn from(l: ModelQuotaLimits) -> ModelLimits {
        ModelLimits { cgpus: l.cgpus, memory_mib: l.memory_mib, exclusive_gpus: l.exclusive_gpus }
    }
}

impl From<ModelLimits> for ModelQuotaLimits {
    fn from(l: ModelLimits) -> ModelQuotaLimits {
        ModelQuotaLimits {
            cgpus: l.cgpus,
            memory_mib: l.memory_mib,
            exclusive_gpus: l.exclusive_gpus,
        }
    }
}

impl From<Usage> for ModelQuotaUsage {
    /// Its GPU resources (a VM is of no model, and not lent).
    fn from(u: Usage) -> ModelQuotaUsage {
        ModelQuotaUsage {
            cgpus: u.cgpus,
            memory_mib: u.memory_mib,
            exclusive_gpus: u.exclusive_gpus,
        }
    }
}
