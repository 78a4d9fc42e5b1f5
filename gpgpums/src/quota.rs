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
//!
//! Limits may also be per GPU model (a project's share of the scarce H100s, beside its totals:
//! KAI's users ask for quotas per GPU type). Which model a request lands on is known only once it
//! is placed, unless it names one, so a model the project has no room left on is taken out of
//! the request before it is placed ([`QuotaLedger::within_model_limits`], and
//! [`crate::booking`] books it so): the request lands on
//! the models it still may use, and is refused, naming the model, only when none is left. The
//! ledger keeps each VM's use per model (from the pool, which knows each GPU's model:
//! [`crate::Pool::holding`]) so that a release gives each model back what it held.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::{CohortName, ProjectId, VmId};
use crate::model::{CgpuAssignment, Mode, Request};

mod cohort;
pub use cohort::{Admission, CohortBalance, CohortTerms, Loan, LENT};

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

    /// What a model's limits count of it (a VM is not of any model).
    fn of_model(self) -> Usage {
        Usage { vms: 0, ..self }
    }

    pub(crate) fn plus(self, other: Usage) -> Usage {
        Usage {
            cgpus: self.cgpus.saturating_add(other.cgpus),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            exclusive_gpus: self.exclusive_gpus.saturating_add(other.exclusive_gpus),
            vms: self.vms.saturating_add(other.vms),
        }
    }

    /// Each resource's smaller of the two.
    fn min(self, other: Usage) -> Usage {
        Usage {
            cgpus: self.cgpus.min(other.cgpus),
            memory_mib: self.memory_mib.min(other.memory_mib),
            exclusive_gpus: self.exclusive_gpus.min(other.exclusive_gpus),
            vms: self.vms.min(other.vms),
        }
    }

    pub(crate) fn minus(self, other: Usage) -> Usage {
        Usage {
            cgpus: self.cgpus.saturating_sub(other.cgpus),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            exclusive_gpus: self.exclusive_gpus.saturating_sub(other.exclusive_gpus),
            vms: self.vms.saturating_sub(other.vms),
        }
    }
}

/// The most GPU models a project's limits may name.
pub const MAX_MODEL_LIMITS: usize = 64;

/// The limits of one project; `None`: no limit on that resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub cgpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub exclusive_gpus: Option<u64>,
    pub vms: Option<u64>,
    /// The highest priority the project's requests may ask for (not a resource: nothing is
    /// booked against it). `None` in a project's own limits: the default limits' ceiling; in the
    /// default limits: none.
    pub max_priority: Option<u32>,
    /// Limits on what the project holds of one GPU model, by the model's exact name, beside the
    /// totals above (a model without an entry is limited by the totals only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelLimits>,
}

/// A project's limits on one GPU model; `None`: no limit on that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimits {
    pub cgpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub exclusive_gpus: Option<u64>,
}

impl ModelLimits {
    /// The limit on `resource` (never one on VMs: a VM is of no model).
    pub fn get(&self, resource: Resource) -> Option<u64> {
        match resource {
            Resource::Cgpus => self.cgpus,
            Resource::MemoryMib => self.memory_mib,
            Resource::ExclusiveGpus => self.exclusive_gpus,
            Resource::Vms => None,
        }
    }
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
    /// when it is over its limit already (a limit lowered below use). Totals only: see
    /// [`Quota::check_model`].
    pub fn check(
        &self,
        project: &ProjectId,
        in_use: Usage,
        requested: Usage,
    ) -> Result<(), QuotaExceeded> {
        exceeded(|r| self.get(r), in_use, requested).map_or(Ok(()), |(resource, limit)| {
            Err(QuotaExceeded::new(project, None, resource, limit, in_use, requested))
        })
    }

    /// As [`Quota::check`], against the limits on `model` and what the project holds of it.
    pub fn check_model(
        &self,
        project: &ProjectId,
        model: &str,
        in_use: Usage,
        requested: Usage,
    ) -> Result<(), QuotaExceeded> {
        let Some(limits) = self.models.get(model) else { return Ok(()) };
        exceeded(|r| limits.get(r), in_use, requested).map_or(Ok(()), |(resource, limit)| {
            Err(QuotaExceeded::new(project, Some(model), resource, limit, in_use, requested))
        })
    }
}

/// The first resource whose limit `in_use` and `requested` together pass, with the limit; a
/// resource not requested is never refused.
fn exceeded(
    limit: impl Fn(Resource) -> Option<u64>,
    in_use: Usage,
    requested: Usage,
) -> Option<(Resource, u64)> {
    Resource::ALL.into_iter().find_map(|resource| {
        let (wanted, held) = (requested.get(resource), in_use.get(resource));
        limit(resource)
            .filter(|&limit| wanted > 0 && held.saturating_add(wanted) > limit)
            .map(|limit| (resource, limit))
    })
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
/// what is in use and what was requested), and the GPU model where the limit is that model's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct QuotaExceeded {
    pub project: ProjectId,
    pub model: Option<String>,
    pub resource: Resource,
    pub limit: u64,
    pub in_use: u64,
    pub requested: u64,
    /// The cohort whose lending `limit` includes: the request asked to borrow and could not
    /// borrow enough.
    pub cohort: Option<CohortName>,
    /// `limit` and `in_use` count what the project holds on loan of `model` (its terms'
    /// `borrowing_limit_by_model` in `cohort`), not all it holds.
    pub on_loan: bool,
}

impl QuotaExceeded {
    fn new(
        project: &ProjectId,
        model: Option<&str>,
        resource: Resource,
        limit: u64,
        in_use: Usage,
        requested: Usage,
    ) -> Self {
        QuotaExceeded {
            project: project.clone(),
            model: model.map(str::to_owned),
            resource,
            limit,
            in_use: in_use.get(resource),
            requested: requested.get(resource),
            cohort: None,
            on_loan: false,
        }
    }
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quota exceeded for {}", self.resource)?;
        if self.on_loan {
            write!(f, " on loan")?;
        }
        if let Some(model) = &self.model {
            write!(f, " of GPU model {model}")?;
        }
        write!(f, " in project {}", self.project)?;
        if let Some(cohort) = &self.cohort {
            write!(f, " (with what cohort {cohort} lends)")?;
        }
        write!(f, ": limit {}, in use {}, requested {}", self.limit, self.in_use, self.requested)
    }
}

/// What some cGPUs hold: in all ([`Usage::of_cgpus`]), and per GPU model (from
/// [`crate::Pool::holding`], which knows each GPU's model).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    pub usage: Usage,
    /// By model, each once, in name order; their `vms` is 0.
    pub models: Vec<(String, Usage)>,
}

impl Holding {
    /// One VM more, with what its cGPUs hold.
    pub fn vm_with(self) -> Holding {
        Holding { usage: Usage::vm_with(self.usage), ..self }
    }

    /// Adds one cGPU on a GPU of `model`.
    pub(crate) fn add(&mut self, model: &str, cgpu: &CgpuAssignment) {
        let one = Usage::of_cgpus([cgpu]);
        self.usage = self.usage.plus(one);
        match self.models.binary_search_by(|(m, _)| m.as_str().cmp(model)) {
            Ok(i) => self.models[i].1 = self.models[i].1.plus(one),
            Err(i) => self.models.insert(i, (model.to_owned(), one)),
        }
    }
}

impl From<Usage> for Holding {
    /// What holds no cGPU of a known model (a VM alone, or a test's round numbers).
    fn from(usage: Usage) -> Holding {
        Holding { usage, models: Vec::new() }
    }
}

/// What one VM holds, and the project it is charged to.
#[derive(Debug, Clone)]
struct Holder {
    project: ProjectId,
    usage: Usage,
    /// By model, each once (names shared through [`QuotaLedger::names`]).
    models: Vec<(Arc<str>, Usage)>,
}

/// Every project's limits and what each holds, by VM; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct QuotaLedger {
    default: Quota,
    limits: BTreeMap<ProjectId, Quota>,
    usage: HashMap<ProjectId, Usage>,
    /// What each project holds of each GPU model.
    model_usage: HashMap<ProjectId, BTreeMap<Arc<str>, Usage>>,
    holders: HashMap<VmId, Holder>,
    /// Every model name held, once: a million VMs share a few names.
    names: HashSet<Arc<str>>,
    /// Each cohort's members and their terms ([`cohort`]).
    cohorts: BTreeMap<CohortName, BTreeMap<ProjectId, CohortTerms>>,
    cohort_of: HashMap<ProjectId, CohortName>,
    /// What each cohort's members lend and borrow in all, kept as they change: a check of a
    /// request that borrows reads it instead of summing over the members.
    cohort_totals: HashMap<CohortName, CohortBalance>,
    /// Whether any member's terms limit what it borrows of a GPU model: most ledgers' requests
    /// skip looking.
    model_borrowing_limits: bool,
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

    /// The project's own limits, or the default's, as stored (see [`Self::limits`]).
    fn quota(&self, project: &ProjectId) -> &Quota {
        self.limits.get(project).unwrap_or(&self.default)
    }

    /// Whether `project` may book `usage` more, with `vms_in_use` as in [`Self::charge`]. Totals
    /// only: which models `usage` is of is known once it is placed ([`Self::within_model_limits`]).
    pub fn check(
        &self,
        project: &ProjectId,
        usage: Usage,
        vms_in_use: u64,
    ) -> Result<(), QuotaExceeded> {
        let in_use = Usage { vms: vms_in_use, ..self.usage(project) };
        self.quota(project).check(project, in_use, usage)
    }

    /// `request` as the project's limits per GPU model let it be placed: without the models it
    /// has no room left on for what the request asks ([`Usage::asked`]), among those it names or
    /// (naming none) `fleet_models`. Unchanged (borrowed) when no model it could use is taken
    /// out; refused, naming the first such model, when every one is.
    pub fn within_model_limits<'r>(
        &self,
        project: &ProjectId,
        request: &'r Request,
        fleet_models: &[String],
    ) -> Result<Cow<'r, Request>, QuotaExceeded> {
        let quota = self.quota(project);
        let loan_limits = self.model_borrowing_limits(project);
        if quota.models.is_empty() && loan_limits.is_none() {
            return Ok(Cow::Borrowed(request));
        }
        let asked = Usage::asked(request).of_model();
        let named = &request.constraints.models;
        let candidates = if named.is_empty() { fleet_models } else { named.as_slice() };
        // Cheap first (a project limits few models; the fleet's are sorted): most requests have
        // room on every model they may use.
        let candidate = |model: &str| match named.is_empty() {
            true => fleet_models.binary_search_by(|m| m.as_str().cmp(model)).is_ok(),
            false => named.iter().any(|m| m == model),
        };
        let is_blocked = |(model, limits, in_use): (&str, &ModelLimits, Usage)| {
            candidate(model) && exceeded(|r| limits.get(r), in_use, asked).is_some()
        };
        let loan_blocked = |model: &String| {
            candidate(model) && self.check_model_loan(project, model, asked, asked).is_err()
        };
        if !self.model_rooms(project, quota).any(is_blocked)
            && !loan_limits.into_iter().flat_map(BTreeMap::keys).any(loan_blocked)
        {
            return Ok(Cow::Borrowed(request));
        }
        let blocked = |model: &str| self.model_refusal(project, quota, model, asked, asked);
        let mut allowed: Vec<String> =
            candidates.iter().filter(|m| blocked(m).is_none()).cloned().collect();
        if allowed.is_empty() {
            let first = candidates.iter().find_map(|m| blocked(m)).expect("one is blocked");
            return Err(first);
        }
        allowed.sort_unstable();
        allowed.dedup();
        let mut narrowed = request.clone();
        narrowed.constraints.models = allowed;
        Ok(Cow::Owned(narrowed))
    }

    /// The limit that took a model out of `request` to make `narrowed`.
    pub(crate) fn first_blocked(
        &self,
        project: &ProjectId,
        request: &Request,
        narrowed: &Request,
    ) -> Option<QuotaExceeded> {
        let quota = self.quota(project);
        let asked = Usage::asked(request).of_model();
        let loan_limits = self.model_borrowing_limits(project).into_iter().flat_map(BTreeMap::keys);
        let mut taken_out = quota
            .models
            .keys()
            .chain(loan_limits)
            .filter(|m| !narrowed.constraints.models.contains(m));
        taken_out.find_map(|model| self.model_refusal(project, quota, model, asked, asked))
    }

    /// Why `project` may not book `requested` more of `model`, in a booking of `in_all`: its
    /// limit on the model, or what its cohort terms let it hold on loan of it.
    fn model_refusal(
        &self,
        project: &ProjectId,
        quota: &Quota,
        model: &str,
        requested: Usage,
        in_all: Usage,
    ) -> Option<QuotaExceeded> {
        let wall = self.check_model_use(project, quota, model, requested);
        wall.and_then(|()| self.check_model_loan(project, model, requested, in_all)).err()
    }

    /// What `project` holds of `model`.
    fn model_usage_of(&self, project: &ProjectId, model: &str) -> Usage {
        let held = self.model_usage.get(project).and_then(|h| h.get(model));
        held.copied().unwrap_or_default()
    }

    /// Whether `project`, holding what it holds of `model`, may book `requested` more of it
    /// under `quota`'s limits on that model.
    fn check_model_use(
        &self,
        project: &ProjectId,
        quota: &Quota,
        model: &str,
        requested: Usage,
    ) -> Result<(), QuotaExceeded> {
        quota.check_model(project, model, self.model_usage_of(project, model), requested)
    }

    /// The highest priority `project`'s requests may ask for, if any (see [`Quota::max_priority`]).
    pub fn max_priority(&self, project: &ProjectId) -> Option<u32> {
        self.quota(project).max_priority.or(self.default.max_priority)
    }

    /// The project's own limits (`Some`), or back to the default (`None`).
    pub fn set_limits(&mut self, project: ProjectId, quota: Option<Quota>) {
        self.changes += 1;
        let before = self.member_balance(&project);
        let key = project.clone();
        match quota {
            Some(quota) => self.limits.insert(project, quota),
            None => self.limits.remove(&project),
        };
        self.cohort_adjust(&key, before);
    }

    /// The project's limits, and whether they are its own rather than the default. Its own
    /// limits without a `max_priority` have the default's.
    pub fn limits(&self, project: &ProjectId) -> (Quota, bool) {
        let quota =
            Quota { max_priority: self.max_priority(project), ..self.quota(project).clone() };
        (quota, self.limits.contains_key(project))
    }

    /// What the project's VMs hold (its `vms` is 0: the caller counts VMs).
    pub fn usage(&self, project: &ProjectId) -> Usage {
        self.usage.get(project).copied().unwrap_or_default()
    }

    /// The VMs whose holdings are charged to `project`, in no order (a pass over every VM).
    pub fn vms_of<'a>(&'a self, project: &'a ProjectId) -> impl Iterator<Item = &'a VmId> + 'a {
        self.holders.iter().filter(move |(_, h)| &h.project == project).map(|(vm, _)| vm)
    }

    /// What the project's VMs hold of each GPU model, in name order.
    pub fn model_usage(&self, project: &ProjectId) -> impl Iterator<Item = (&str, Usage)> {
        self.model_usage.get(project).into_iter().flatten().map(|(m, u)| (&**m, *u))
    }

    /// The project's dominant shares of its limits (as in DRF: the largest of use/limit), as the
    /// queue orders projects by them: of its totals, and of its limits on each model, so that
    /// what it holds of one model does not hold back its requests for another
    /// ([`Shares::of`]). A project with no limit at all is measured against the `pool` instead
    /// (the largest of its share of the GPUs' memory and of the GPUs it holds whole): without
    /// quotas, a project using more of the pool waits behind one using less, not in arrival
    /// order. `vms_in_use` as in [`Self::charge`].
    pub fn shares(&self, project: &ProjectId, vms_in_use: u64, pool: &PoolSize) -> Shares {
        let quota = self.quota(project);
        let usage = Usage { vms: vms_in_use, ..self.usage(project) };
        let limited = Resource::ALL
            .iter()
            .filter_map(|&r| quota.get(r).map(|limit| share(usage.get(r), limit)))
            .max();
        let total = match limited {
            Some(total) => total,
            None if quota.models.is_empty() => {
                [(usage.memory_mib, pool.memory_mib), (usage.exclusive_gpus, pool.gpus)]
                    .into_iter()
                    .filter(|&(_, size)| size > 0)
                    .map(|(used, size)| share(used, size))
                    .max()
                    .unwrap_or(0)
            }
            None => 0,
        };
        let models = self
            .model_rooms(project, quota)
            .map(|(model, limits, usage)| {
                let most = Resource::ALL
                    .iter()
                    .filter_map(|&r| limits.get(r).map(|limit| share(usage.get(r), limit)))
                    .max();
                (model.to_owned(), most.unwrap_or(0))
            })
            .collect();
        Shares { total, models }
    }

    /// Each model `quota` limits, with its limits and what `project` holds of it: both sorted
    /// by model, walked side by side (this is on the queue's path for every waiting request).
    fn model_rooms<'q>(
        &'q self,
        project: &ProjectId,
        quota: &'q Quota,
    ) -> impl Iterator<Item = (&'q str, &'q ModelLimits, Usage)> + 'q {
        let held = match quota.models.is_empty() {
            true => None,
            false => self.model_usage.get(project),
        };
        let mut held = held.into_iter().flatten().peekable();
        quota.models.iter().map(move |(model, limits)| {
            while held.next_if(|(m, _)| &***m < model.as_str()).is_some() {}
            let in_use = held.next_if(|(m, _)| &***m == model.as_str()).map(|(_, u)| *u);
            (model.as_str(), limits, in_use.unwrap_or_default())
        })
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
        self.holders.get(vm).map(|holder| &holder.project)
    }

    /// Charges `holding` to `vm` of `project` if the project's limits allow it, in all and per
    /// model, with `vms_in_use` the project's VMs as the caller counts them (`holding.usage.vms`
    /// is 1 for a new VM); nothing changes otherwise. A VM is charged to one project only.
    pub fn charge(
        &mut self,
        vm: VmId,
        project: &ProjectId,
        holding: &Holding,
        vms_in_use: u64,
    ) -> Result<(), QuotaExceeded> {
        self.charge_as(vm, project, holding, vms_in_use, false).map(drop)
    }

    /// As [`QuotaLedger::charge`], past the project's limits too when `borrow` and its cohort
    /// lends enough ([`QuotaLedger::check_as`]); how it was admitted.
    pub fn charge_as(
        &mut self,
        vm: VmId,
        project: &ProjectId,
        holding: &Holding,
        vms_in_use: u64,
        borrow: bool,
    ) -> Result<Admission, QuotaExceeded> {
        if let Some(holder) = self.holders.get(&vm) {
            assert_eq!(&holder.project, project, "VM {vm} is charged to another project");
        }
        let admission = self.check_as(project, holding.usage, vms_in_use, borrow)?;
        let quota = self.quota(project);
        for (model, usage) in &holding.models {
            if let Some(refused) = self.model_refusal(project, quota, model, *usage, holding.usage)
            {
                return Err(refused);
            }
        }
        self.record(vm, project, holding);
        Ok(admission)
    }

    /// Whether [`QuotaLedger::charge_as`] would take `holding` for `project` now. Changes
    /// nothing.
    pub fn admits(
        &self,
        project: &ProjectId,
        holding: &Holding,
        vms_in_use: u64,
        borrow: bool,
    ) -> bool {
        let quota = self.quota(project);
        self.check_as(project, holding.usage, vms_in_use, borrow).is_ok()
            && holding.models.iter().all(|(model, usage)| {
                self.model_refusal(project, quota, model, *usage, holding.usage).is_none()
            })
    }

    /// Charges `holding` without checking: what storage says is held (a restart, another
    /// replica's booking) is held, whatever the limits say now.
    pub fn restore(&mut self, vm: VmId, project: &ProjectId, holding: &Holding) {
        self.record(vm, project, holding);
    }

    /// Records `holding` but its `vms` (which the caller counts).
    fn record(&mut self, vm: VmId, project: &ProjectId, holding: &Holding) {
        let usage = holding.usage.of_model();
        self.changes += 1;
        let before = self.member_balance(project);
        let holder = self.holders.entry(vm).or_insert_with(|| Holder {
            project: project.clone(),
            usage: Usage::default(),
            models: Vec::new(),
        });
        holder.usage = holder.usage.plus(usage);
        let total = self.usage.entry(project.clone()).or_default();
        *total = total.plus(usage);
        self.cohort_adjust(project, before);
        if holding.models.is_empty() {
            return;
        }
        let holder = self.holders.get_mut(&vm).expect("recorded above");
        let by_model = self.model_usage.entry(project.clone()).or_default();
        for (model, usage) in &holding.models {
            let usage = usage.of_model();
            let name = match self.names.get(model.as_str()) {
                Some(name) => name.clone(),
                None => {
                    let name: Arc<str> = Arc::from(model.as_str());
                    self.names.insert(name.clone());
                    name
                }
            };
            match holder.models.iter_mut().find(|(m, _)| **m == **model) {
                Some((_, held)) => *held = held.plus(usage),
                None => holder.models.push((name.clone(), usage)),
            }
            let total = by_model.entry(name).or_default();
            *total = total.plus(usage);
        }
    }

    /// Gives back part of what `vm` holds (detached cGPUs); never more than it holds, in all or
    /// of a model.
    pub fn refund(&mut self, vm: &VmId, holding: &Holding) {
        let Some(project) = self.holders.get(vm).map(|h| h.project.clone()) else { return };
        let before = self.member_balance(&project);
        let holder = self.holders.get_mut(vm).expect("looked up above");
        self.changes += 1;
        let usage = holding.usage.min(holder.usage);
        holder.usage = holder.usage.minus(usage);
        if let Some(total) = self.usage.get_mut(&holder.project) {
            *total = total.minus(usage);
        }
        let mut by_model = self.model_usage.get_mut(&holder.project);
        for (model, usage) in &holding.models {
            let Some(i) = holder.models.iter().position(|(m, _)| **m == **model) else { continue };
            let usage = usage.min(holder.models[i].1);
            holder.models[i].1 = holder.models[i].1.minus(usage);
            if holder.models[i].1 == Usage::default() {
                holder.models.swap_remove(i);
            }
            if let Some(by_model) = by_model.as_deref_mut() {
                take_from(by_model, model, usage);
            }
        }
        self.cohort_adjust(&project, before);
    }

    /// Gives back all `vm` holds (a VM that ended); what it held.
    pub fn release(&mut self, vm: &VmId) -> Option<Usage> {
        let holder = self.holders.remove(vm)?;
        self.changes += 1;
        let before = self.member_balance(&holder.project);
        if let Some(total) = self.usage.get_mut(&holder.project) {
            *total = total.minus(holder.usage);
            if *total == Usage::default() {
                self.usage.remove(&holder.project);
            }
        }
        if let Some(by_model) = self.model_usage.get_mut(&holder.project) {
            for (model, usage) in &holder.models {
                take_from(by_model, model, *usage);
            }
            if by_model.is_empty() {
                self.model_usage.remove(&holder.project);
            }
        }
        self.cohort_adjust(&holder.project, before);
        Some(holder.usage)
    }
}

/// `used` of `limit`, in millionths.
fn share(used: u64, limit: u64) -> u64 {
    match limit {
        0 if used == 0 => 0,
        0 => u64::MAX,
        _ => u64::try_from(u128::from(used) * 1_000_000 / u128::from(limit)).unwrap_or(u64::MAX),
    }
}

/// What a project without limits is measured against ([`QuotaLedger::shares`]): the pool's GPU
/// memory and its GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSize {
    pub memory_mib: u64,
    pub gpus: u64,
}

/// A project's dominant shares, in millionths: see [`QuotaLedger::shares`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shares {
    total: u64,
    /// Per model it has limits on, in name order.
    models: Vec<(String, u64)>,
}

impl Shares {
    /// The share a request for `models` (any model when empty) is ordered by: the largest of the
    /// totals' and of the limited models it may land on.
    pub fn of(&self, models: &[String]) -> u64 {
        let admits = |model: &str| models.is_empty() || models.iter().any(|m| m == model);
        let per_model = self.models.iter().filter(|(m, _)| admits(m)).map(|(_, share)| *share);
        per_model.fold(self.total, u64::max)
    }
}

/// Takes `usage` from what `by_model` counts of `model`, forgetting the model at zero.
fn take_from(by_model: &mut BTreeMap<Arc<str>, Usage>, model: &str, usage: Usage) {
    if let Some(total) = by_model.get_mut(model) {
        *total = total.minus(usage);
        if *total == Usage::default() {
            by_model.remove(model);
        }
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
        ledger.charge(vm(1), &alpha, &Holding::from(Usage::vm_with(two)), 0).unwrap();
        let more = Usage::vm_with(Usage { cgpus: 3, ..two });
        let err = ledger.charge(vm(2), &alpha, &Holding::from(more), 1).unwrap_err();
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
        ledger.charge(vm(2), &alpha, &Holding::from(Usage::vm_with(two)), 1).unwrap();
        let err = ledger
            .charge(vm(3), &alpha, &Holding::from(Usage::vm_with(Usage::default())), 2)
            .unwrap_err();
        assert_eq!((err.resource, err.in_use, err.requested), (Resource::Vms, 2, 1));
        // Releasing gives everything back; refunds give back only what is held.
        ledger.refund(
            &vm(1),
            &Holding::from(Usage { cgpus: 5, memory_mib: 1024, ..Usage::default() }),
        );
        let left = Usage { cgpus: 2, memory_mib: 3072, ..Usage::default() };
        assert_eq!(ledger.usage(&alpha), left);
        assert_eq!(ledger.release(&vm(1)), Some(Usage { memory_mib: 1024, ..Usage::default() }));
        assert_eq!(ledger.release(&vm(2)), Some(two));
        assert_eq!(ledger.usage(&alpha), Usage::default());
    }

    #[test]
    fn models_at_their_limit_are_taken_out_of_requests_and_shares_count_per_model() {
        let alpha = ProjectId::new("alpha").unwrap();
        let limit = |cgpus| ModelLimits { cgpus: Some(cgpus), ..ModelLimits::default() };
        let models = [("A100", limit(2)), ("H100", limit(1)), ("L4", limit(4)), ("T4", limit(8))];
        let quota = Quota {
            models: models.iter().map(|(m, l)| ((*m).to_owned(), *l)).collect(),
            ..Quota::default()
        };
        let mut ledger = QuotaLedger::new(Quota::default());
        ledger.set_limits(alpha.clone(), Some(quota));
        // Held: 1 H100 (at its limit), 2 L4 (half), and a model without limits.
        let mut holding = Holding::default();
        for (model, n) in [("H100", 1), ("L4", 2), ("B200", 3)] {
            let one = Usage { cgpus: 1, ..Usage::default() };
            holding.models.push((model.to_owned(), Usage { cgpus: n, ..Usage::default() }));
            holding.usage = (0..n).fold(holding.usage, |u, _| u.plus(one));
        }
        holding.models.sort_by(|a, b| a.0.cmp(&b.0));
        ledger.charge(vm(1), &alpha, &holding, 0).unwrap();
        let fleet: Vec<String> =
            ["A100", "B200", "H100", "L4", "T4"].iter().map(|m| (*m).to_owned()).collect();
        let one = Request::shared(1, 1024);
        let narrowed = ledger.within_model_limits(&alpha, &one, &fleet).unwrap();
        assert_eq!(narrowed.constraints.models, ["A100", "B200", "L4", "T4"]);
        // Three cGPUs: L4 (2 + 3 > 4) and A100 (3 > 2) are out too.
        let three = Request::shared(3, 1024);
        let narrowed = ledger.within_model_limits(&alpha, &three, &fleet).unwrap();
        assert_eq!(narrowed.constraints.models, ["B200", "T4"]);
        // Naming only models at their limit: refused, naming the first named.
        let mut named = three.clone();
        named.constraints.models = vec!["L4".into(), "H100".into()];
        let err = ledger.within_model_limits(&alpha, &named, &fleet).unwrap_err();
        assert_eq!((err.model.as_deref(), err.in_use, err.limit), (Some("L4"), 2, 4));
        // Naming a model with room: unchanged.
        named.constraints.models = vec!["T4".into()];
        assert!(matches!(ledger.within_model_limits(&alpha, &named, &fleet), Ok(Cow::Borrowed(_))));
        // Shares: of the H100s, all; of the L4s, half; of the T4s, none.
        let shares = ledger.shares(&alpha, 0, &PoolSize::default());
        let share = |model: &str| shares.of(&[model.to_owned()]);
        assert_eq!((share("H100"), share("L4"), share("T4")), (1_000_000, 500_000, 0));
        assert_eq!(shares.of(&[]), 1_000_000, "a request for any model: the largest");
    }

    #[test]
    fn own_limits_replace_the_default_and_a_lowered_limit_refuses_only_more() {
        let (alpha, beta) = (ProjectId::new("alpha").unwrap(), ProjectId::new("beta").unwrap());
        let mut ledger = QuotaLedger::new(Quota { cgpus: Some(2), ..Quota::default() });
        ledger.set_limits(beta.clone(), Some(Quota::default()));
        let many = Usage::vm_with(Usage { cgpus: 100, ..Usage::default() });
        ledger.charge(vm(1), &beta, &Holding::from(many), 0).unwrap();
        assert!(ledger.charge(vm(2), &alpha, &Holding::from(many), 0).is_err());
        ledger.set_limits(beta.clone(), Some(Quota { cgpus: Some(10), ..Quota::default() }));
        assert_eq!(ledger.limits(&beta), (Quota { cgpus: Some(10), ..Quota::default() }, true));
        // Over its new limit, beta keeps what it holds and may still add what is not limited.
        ledger.charge(vm(3), &beta, &Holding::from(Usage::vm_with(Usage::default())), 1).unwrap();
        let err = ledger
            .charge(vm(3), &beta, &Holding::from(Usage { cgpus: 1, ..Usage::default() }), 2)
            .unwrap_err();
        assert_eq!((err.limit, err.in_use, err.requested), (10, 100, 1));
        ledger.set_limits(beta.clone(), None);
        assert_eq!(ledger.limits(&beta), (Quota { cgpus: Some(2), ..Quota::default() }, false));
        assert_eq!(ledger.projects().cloned().collect::<Vec<_>>(), [beta]);
    }
}
