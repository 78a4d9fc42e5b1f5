//! Project quotas: how much a project may hold at once, checked against what it holds.
//!
//! As Nova, Cinder and Neutron do, each project has limits (from the service's defaults unless an
//! operator set its own), here on cGPUs, GPU memory, exclusive GPUs and VMs. The [`QuotaLedger`]
//! knows every VM's project and the cGPUs it holds, so a check is a few additions, not a database
//! scan. The service keeps one ledger beside its [`crate::Pool`], loaded and changed in the same
//! transaction as the bookings: two replicas cannot both see room that is there only once. A VM's
//! cGPUs change only with bookings, which the ledger sees; whether a VM still counts changes with
//! its state (a failed or terminated VM stops counting before its cGPUs are released), so the
//! caller counts VMs where states are kept and passes the count to [`QuotaLedger::charge`].
//!
//! A check happens where something is booked: a VM (its launch's cGPUs, and the VM itself) or an
//! attach (its cGPUs). What is already held is never taken back when a limit is lowered below it:
//! the project just cannot book more until it is under again.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{ProjectId, VmId};
use crate::model::{CgpuAssignment, Mode, Request};

/// What a project holds, or asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub cgpus: u64,
    /// GPU memory booked: a shared cGPU's MiB, an exclusive cGPU's whole GPU.
    pub memory_mib: u64,
    pub exclusive_gpus: u64,
    pub vms: u64,
}

impl Usage {
    /// What `cgpus` hold.
    pub fn of_cgpus<'a>(cgpus: impl IntoIterator<Item = &'a CgpuAssignment>) -> Usage {
        cgpus.into_iter().fold(Usage::default(), |mut usage, cgpu| {
            usage.cgpus += 1;
            usage.memory_mib += cgpu.memory_mib;
            usage.exclusive_gpus += u64::from(cgpu.mode == Mode::Exclusive);
            usage
        })
    }

    /// What `request` asks for before it is placed: its cGPUs, their memory when shared, and
    /// whole GPUs when exclusive (whose memory is known once placed).
    pub fn asked(request: &Request) -> Usage {
        let n = u64::from(request.ncgpus);
        match request.mode {
            Mode::Shared => Usage {
                cgpus: n,
                memory_mib: n.saturating_mul(request.gpu_memory_mib.unwrap_or(0)),
                ..Usage::default()
            },
            Mode::Exclusive => Usage { cgpus: n, exclusive_gpus: n, ..Usage::default() },
        }
    }

    /// One VM more, with what its cGPUs hold.
    pub fn vm_with(cgpus: Usage) -> Usage {
        Usage { vms: 1, ..cgpus }
    }

    pub fn get(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Cgpus => self.cgpus,
            Resource::MemoryMib => self.memory_mib,
            Resource::ExclusiveGpus => self.exclusive_gpus,
            Resource::Vms => self.vms,
        }
    }

    fn plus(self, other: Usage) -> Usage {
        Usage {
            cgpus: self.cgpus.saturating_add(other.cgpus),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            exclusive_gpus: self.exclusive_gpus.saturating_add(other.exclusive_gpus),
            vms: self.vms.saturating_add(other.vms),
        }
    }

    fn minus(self, other: Usage) -> Usage {
        Usage {
            cgpus: self.cgpus.saturating_sub(other.cgpus),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            exclusive_gpus: self.exclusive_gpus.saturating_sub(other.exclusive_gpus),
            vms: self.vms.saturating_sub(other.vms),
        }
    }
}

/// The limits of one project; `None`: no limit on that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub cgpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub exclusive_gpus: Option<u64>,
    pub vms: Option<u64>,
    /// The highest priority the project's requests may ask for (not a resource: nothing is
    /// booked against it). `None` in a project's own limits: the default limits' ceiling; in the
    /// default limits: none.
    pub max_priority: Option<u32>,
}

impl Quota {
    pub fn get(&self, resource: Resource) -> Option<u64> {
        match resource {
            Resource::Cgpus => self.cgpus,
            Resource::MemoryMib => self.memory_mib,
            Resource::ExclusiveGpus => self.exclusive_gpus,
            Resource::Vms => self.vms,
        }
    }

    /// Whether a project that holds `in_use` may book `requested` more: the first resource whose
    /// limit the two together would pass, if any. A resource not requested is never refused, even
    /// when it is over its limit already (a limit lowered below use).
    pub fn check(
        &self,
        project: &ProjectId,
        in_use: Usage,
        requested: Usage,
    ) -> Result<(), QuotaExceeded> {
        for resource in Resource::ALL {
            let (wanted, held) = (requested.get(resource), in_use.get(resource));
            match self.get(resource) {
                Some(limit) if wanted > 0 && held.saturating_add(wanted) > limit => {
                    return Err(QuotaExceeded {
                        project: project.clone(),
                        resource,
                        limit,
                        in_use: held,
                        requested: wanted,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A resource a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Cgpus,
    MemoryMib,
    ExclusiveGpus,
    Vms,
}

impl Resource {
    pub const ALL: [Resource; 4] =
        [Resource::Cgpus, Resource::MemoryMib, Resource::ExclusiveGpus, Resource::Vms];

    /// The name the API and the configuration use.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Cgpus => "cgpus",
            Resource::MemoryMib => "memory_mib",
            Resource::ExclusiveGpus => "exclusive_gpus",
            Resource::Vms => "vms",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A booking that would take a project past a limit (Nova's convention: the resource, the limit,
/// what is in use and what was requested).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quota exceeded for {resource} in project {project}: limit {limit}, in use {in_use}, \
     requested {requested}"
)]
pub struct QuotaExceeded {
    pub project: ProjectId,
    pub resource: Resource,
    pub limit: u64,
    pub in_use: u64,
    pub requested: u64,
}

/// Every project's limits and what each holds, by VM; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct QuotaLedger {
    default: Quota,
    limits: BTreeMap<ProjectId, Quota>,
    usage: HashMap<ProjectId, Usage>,
    holders: HashMap<VmId, (ProjectId, Usage)>,
    changes: u64,
}

impl QuotaLedger {
    /// A ledger whose projects have `default` limits until one is set.
    pub fn new(default: Quota) -> Self {
        QuotaLedger { default, ..QuotaLedger::default() }
    }

    /// How many changes the ledger has taken (a caller that must undo them on failure compares).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Whether `project` may book `usage` more, with `vms_in_use` as in [`Self::charge`].
    pub fn check(
        &self,
        project: &ProjectId,
        usage: Usage,
        vms_in_use: u64,
    ) -> Result<(), QuotaExceeded> {
        let in_use = Usage { vms: vms_in_use, ..self.usage(project) };
        self.limits(project).0.check(project, in_use, usage)
    }

    /// The highest priority `project`'s requests may ask for, if any (see [`Quota::max_priority`]).
    pub fn max_priority(&self, project: &ProjectId) -> Option<u32> {
        self.limits(project).0.max_priority
    }

    /// The project's own limits (`Some`), or back to the default (`None`).
    pub fn set_limits(&mut self, project: ProjectId, quota: Option<Quota>) {
        self.changes += 1;
        match quota {
            Some(quota) => self.limits.insert(project, quota),
            None => self.limits.remove(&project),
        };
    }

    /// The project's limits, and whether they are its own rather than the default. Its own
    /// limits without a `max_priority` have the default's.
    pub fn limits(&self, project: &ProjectId) -> (Quota, bool) {
        match self.limits.get(project) {
            Some(quota) => {
                let max_priority = quota.max_priority.or(self.default.max_priority);
                (Quota { max_priority, ..*quota }, true)
            }
            None => (self.default, false),
        }
    }

    /// What the project's VMs hold (its `vms` is 0: the caller counts VMs).
    pub fn usage(&self, project: &ProjectId) -> Usage {
        self.usage.get(project).copied().unwrap_or_default()
    }

    /// Every project that holds something or has limits of its own.
    pub fn projects(&self) -> impl Iterator<Item = &ProjectId> {
        let mut all: Vec<&ProjectId> = self.limits.keys().chain(self.usage.keys()).collect();
        all.sort();
        all.dedup();
        all.into_iter()
    }

    /// The project `vm` is charged to, if it holds anything.
    pub fn project_of(&self, vm: &VmId) -> Option<&ProjectId> {
        self.holders.get(vm).map(|(project, _)| project)
    }

    /// Charges `usage` to `vm` of `project` if the project's limits allow it, with `vms_in_use`
    /// the project's VMs as the caller counts them (`usage.vms` is 1 for a new VM); nothing
    /// changes otherwise. A VM is charged to one project only.
    pub fn charge(
        &mut self,
        vm: VmId,
        project: &ProjectId,
        usage: Usage,
        vms_in_use: u64,
    ) -> Result<(), QuotaExceeded> {
        if let Some((owner, _)) = self.holders.get(&vm) {
            assert_eq!(owner, project, "VM {vm} is charged to another project");
        }
        self.check(project, usage, vms_in_use)?;
        self.record(vm, project, usage);
        Ok(())
    }

    /// Charges `usage` without checking: what storage says is held (a restart, another
    /// replica's booking) is held, whatever the limits say now.
    pub fn restore(&mut self, vm: VmId, project: &ProjectId, usage: Usage) {
        self.record(vm, project, usage);
    }

    /// Records `usage` but its `vms` (which the caller counts).
    fn record(&mut self, vm: VmId, project: &ProjectId, usage: Usage) {
        let usage = Usage { vms: 0, ..usage };
        self.changes += 1;
        let held = self.holders.entry(vm).or_insert_with(|| (project.clone(), Usage::default()));
        held.1 = held.1.plus(usage);
        let total = self.usage.entry(project.clone()).or_default();
        *total = total.plus(usage);
    }

    /// Gives back part of what `vm` holds (a detached cGPU); never more than it holds.
    pub fn refund(&mut self, vm: &VmId, usage: Usage) {
        let Some((project, held)) = self.holders.get_mut(vm) else { return };
        self.changes += 1;
        let usage = Usage {
            cgpus: usage.cgpus.min(held.cgpus),
            memory_mib: usage.memory_mib.min(held.memory_mib),
            exclusive_gpus: usage.exclusive_gpus.min(held.exclusive_gpus),
            vms: usage.vms.min(held.vms),
        };
        *held = held.minus(usage);
        if let Some(total) = self.usage.get_mut(project) {
            *total = total.minus(usage);
        }
    }

    /// Gives back all `vm` holds (a VM that ended); what it held.
    pub fn release(&mut self, vm: &VmId) -> Option<Usage> {
        let (project, held) = self.holders.remove(vm)?;
        self.changes += 1;
        if let Some(total) = self.usage.get_mut(&project) {
            *total = total.minus(held);
            if *total == Usage::default() {
                self.usage.remove(&project);
            }
        }
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(n: u128) -> VmId {
        VmId::from_uuid(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_charge_past_a_limit_names_it_and_changes_nothing() {
        let alpha = ProjectId::new("alpha").unwrap();
        let mut ledger =
            QuotaLedger::new(Quota { cgpus: Some(4), vms: Some(2), ..Quota::default() });
        let two = Usage { cgpus: 2, memory_mib: 2048, ..Usage::default() };
        ledger.charge(vm(1), &alpha, Usage::vm_with(two), 0).unwrap();
        let more = Usage::vm_with(Usage { cgpus: 3, ..two });
        let err = ledger.charge(vm(2), &alpha, more, 1).unwrap_err();
        assert_eq!(
            (err.resource, err.limit, err.in_use, err.requested),
            (Resource::Cgpus, 4, 2, 3)
        );
        assert_eq!(
            err.to_string(),
            "quota exceeded for cgpus in project alpha: limit 4, in use 2, requested 3"
        );
        assert_eq!(ledger.usage(&alpha), two);
        // The rest fits; a third VM does not.
        ledger.charge(vm(2), &alpha, Usage::vm_with(two), 1).unwrap();
        let err = ledger.charge(vm(3), &alpha, Usage::vm_with(Usage::default()), 2).unwrap_err();
        assert_eq!((err.resource, err.in_use, err.requested), (Resource::Vms, 2, 1));
        // Releasing gives everything back; refunds give back only what is held.
        ledger.refund(&vm(1), Usage { cgpus: 5, memory_mib: 1024, ..Usage::default() });
        let left = Usage { cgpus: 2, memory_mib: 3072, ..Usage::default() };
        assert_eq!(ledger.usage(&alpha), left);
        assert_eq!(ledger.release(&vm(1)), Some(Usage { memory_mib: 1024, ..Usage::default() }));
        assert_eq!(ledger.release(&vm(2)), Some(two));
        assert_eq!(ledger.usage(&alpha), Usage::default());
    }

    #[test]
    fn own_limits_replace_the_default_and_a_lowered_limit_refuses_only_more() {
        let (alpha, beta) = (ProjectId::new("alpha").unwrap(), ProjectId::new("beta").unwrap());
        let mut ledger = QuotaLedger::new(Quota { cgpus: Some(2), ..Quota::default() });
        ledger.set_limits(beta.clone(), Some(Quota::default()));
        let many = Usage::vm_with(Usage { cgpus: 100, ..Usage::default() });
        ledger.charge(vm(1), &beta, many, 0).unwrap();
        assert!(ledger.charge(vm(2), &alpha, many, 0).is_err());
        ledger.set_limits(beta.clone(), Some(Quota { cgpus: Some(10), ..Quota::default() }));
        assert_eq!(ledger.limits(&beta), (Quota { cgpus: Some(10), ..Quota::default() }, true));
        // Over its new limit, beta keeps what it holds and may still add what is not limited.
        ledger.charge(vm(3), &beta, Usage::vm_with(Usage::default()), 1).unwrap();
        let err =
            ledger.charge(vm(3), &beta, Usage { cgpus: 1, ..Usage::default() }, 2).unwrap_err();
        assert_eq!((err.limit, err.in_use, err.requested), (10, 100, 1));
        ledger.set_limits(beta.clone(), None);
        assert_eq!(ledger.limits(&beta), (Quota { cgpus: Some(2), ..Quota::default() }, false));
        assert_eq!(ledger.projects().cloned().collect::<Vec<_>>(), [beta]);
    }
}
