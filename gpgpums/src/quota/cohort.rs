//! Cohorts: projects that lend each other the quota they do not use.
//!
//! A project's quota is its guaranteed share. In a cohort it may also run past it, on what the
//! cohort's other members leave unused, as Kueue's cohorts and KAI's over-quota do: a booking that
//! passes the project's limits is admitted as *borrowed* when the request chose to borrow, its
//! project's `borrowing_limit` allows the part past the limit, and the cohort has that much to
//! lend. What a member lends is its limit less what it holds, at most its `lending_limit`; what the
//! members borrow together never passes what the members lend together (counted per resource).
//!
//! Only the GPU resources (cGPUs, GPU memory, exclusive GPUs) are lent: a project's VM count and
//! its limits per GPU model stay walls. A member's terms may also bound what it borrows of one GPU
//! model (`borrowing_limit_by_model`: keep loans off a scarce model, or cap them there); the ledger
//! does not know which of a project's cGPUs are on loan, so it counts them as on that model as far
//! as the project holds the model: a bound that is never passed, at the price of refusing some
//! bookings whose loans are really on other models ([`QuotaLedger::check_model_loan`]). A member's own guarantee is never touched by the loans: a
//! booking within its limits is admitted as before, whatever the cohort has lent, and the capacity
//! it needs comes back by reclaiming loans (the planner's part, not the ledger's).
//!
//! Which cGPUs of a booking are borrowed is decided once, at admission ([`QuotaLedger::split_borrowed`]):
//! the first ones fill what is left of the guarantee, the rest are on loan.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{QuotaExceeded, QuotaLedger, Resource, Usage};
use crate::ids::{CohortName, ProjectId, VmId};
use crate::quota::ModelLimits;

/// The GPU resources a cohort lends (a VM is not lent: see the module docs).
pub const LENT: [Resource; 3] = [Resource::Cgpus, Resource::MemoryMib, Resource::ExclusiveGpus];

/// A project's terms in its cohort.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CohortTerms {
    /// How far past its own limit the project may run on borrowed capacity, per resource; a
    /// resource without one: as far as the cohort has to lend.
    #[serde(default)]
    pub borrowing_limit: ModelLimits,
    /// How much of its unused quota the others may borrow, per resource; a resource without one:
    /// all it does not use.
    #[serde(default)]
    pub lending_limit: ModelLimits,
    /// Whether the project's requests borrow when they do not say (`borrow` absent).
    #[serde(default)]
    pub borrow_by_default: bool,
    /// How much the project may hold on loan of a GPU model, by the model's exact name, beside
    /// `borrowing_limit` (a model without an entry: bounded by the totals only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub borrowing_limit_by_model: BTreeMap<String, ModelLimits>,
}

/// A cGPU admitted past its project's quota, on what its cohort lends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loan {
    pub vm: VmId,
    pub index: u32,
    /// When it was admitted: the youngest loans are taken back first.
    pub since_ms: i64,
}

/// How a booking was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Within the project's limits.
    Guaranteed,
    /// Past them, on what its cohort lends.
    Borrowed,
}

/// What a cohort's members lend and borrow now, per lent resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CohortBalance {
    /// What the members could lend: each one's limit less its use, at most its lending limit.
    pub lendable: Usage,
    /// What the members hold past their own limits.
    pub borrowed: Usage,
}

impl QuotaLedger {
    /// Puts `members` in cohort `name` on their terms (`None`: the cohort is gone and its members
    /// keep only their own quotas). A project is in one cohort at most: naming it here takes it
    /// out of any other (the service refuses that before it gets here). What is on loan stays
    /// held; only new bookings see the new terms.
    pub fn set_cohort(
        &mut self,
        name: CohortName,
        members: Option<BTreeMap<ProjectId, CohortTerms>>,
    ) {
        self.changes += 1;
        if let Some(old) = self.cohorts.remove(&name) {
            for project in old.keys() {
                self.cohort_of.remove(project);
            }
        }
        self.cohort_totals.remove(&name);
        let Some(members) = members else {
            self.note_model_borrowing_limits();
            return;
        };
        let mut left = Vec::new();
        for project in members.keys() {
            if let Some(other) = self.cohort_of.insert(project.clone(), name.clone()) {
                if let Some(others) = self.cohorts.get_mut(&other) {
                    others.remove(project);
                    left.push(other);
                }
            }
        }
        self.cohorts.insert(name.clone(), members);
        self.note_model_borrowing_limits();
        for cohort in left.into_iter().chain([name]) {
            let totals = self.recount(&cohort);
            self.cohort_totals.insert(cohort, totals);
        }
    }

    /// What `project` could lend and borrows now, if it is in a cohort: its part of the cohort's
    /// totals (see [`QuotaLedger::cohort_adjust`]).
    pub fn member_balance(&self, project: &ProjectId) -> Option<CohortBalance> {
        if self.cohort_of.is_empty() {
            return None;
        }
        let (_, terms) = self.cohort_of(project)?;
        Some(CohortBalance {
            lendable: self.lendable(project, terms),
            borrowed: self.borrowed(project),
        })
    }

    /// Brings `project`'s cohort's totals up to date after a change of what it holds or of its
    /// limits, `before` being its part from before the change.
    pub(super) fn cohort_adjust(&mut self, project: &ProjectId, before: Option<CohortBalance>) {
        let Some(before) = before else { return };
        let Some(after) = self.member_balance(project) else { return };
        let Some(name) = self.cohort_of.get(project) else { return };
        let totals = self.cohort_totals.entry(name.clone()).or_default();
        totals.lendable = totals.lendable.plus(after.lendable).minus(before.lendable);
        totals.borrowed = totals.borrowed.plus(after.borrowed).minus(before.borrowed);
    }

    /// A cohort's totals summed over its members.
    fn recount(&self, name: &CohortName) -> CohortBalance {
        let mut balance = CohortBalance::default();
        for project in self.cohorts.get(name).into_iter().flat_map(BTreeMap::keys) {
            let part = self.member_balance(project).unwrap_or_default();
            balance.lendable = balance.lendable.plus(part.lendable);
            balance.borrowed = balance.borrowed.plus(part.borrowed);
        }
        balance
    }

    /// Whether every cohort's kept totals are what its members lend and borrow (the ledger's
    /// own bookkeeping, for tests and audits): the first cohort whose are not, if any.
    pub fn audit_cohorts(&self) -> Result<(), String> {
        for name in self.cohorts.keys() {
            let (kept, counted) = (self.balance(name), self.recount(name));
            if kept != counted {
                return Err(format!("cohort {name}: kept {kept:?}, counted {counted:?}"));
            }
        }
        Ok(())
    }

    /// Whether a request of `project` borrows: as it `asked`, or (not saying) as its terms in
    /// its cohort say; never outside a cohort.
    pub fn borrows(&self, project: &ProjectId, asked: Option<bool>) -> bool {
        self.cohort_of(project).is_some_and(|(_, terms)| asked.unwrap_or(terms.borrow_by_default))
    }

    /// The cohort `project` is in, and its terms there.
    pub fn cohort_of(&self, project: &ProjectId) -> Option<(&CohortName, &CohortTerms)> {
        let name = self.cohort_of.get(project)?;
        let terms = self.cohorts.get(name)?.get(project)?;
        Some((name, terms))
    }

    /// Every cohort, by name, with its members' terms.
    pub fn cohorts(
        &self,
    ) -> impl Iterator<Item = (&CohortName, &BTreeMap<ProjectId, CohortTerms>)> {
        self.cohorts.iter()
    }

    /// A cohort's members, if it exists.
    pub fn cohort(&self, name: &CohortName) -> Option<&BTreeMap<ProjectId, CohortTerms>> {
        self.cohorts.get(name)
    }

    /// What a cohort's members lend and borrow now.
    pub fn balance(&self, name: &CohortName) -> CohortBalance {
        self.cohort_totals.get(name).cloned().unwrap_or_default()
    }

    /// What `project` holds past its limits now, per lent resource.
    pub fn borrowed(&self, project: &ProjectId) -> Usage {
        let quota = self.quota(project);
        let usage = self.usage(project);
        usage_of(|r| match quota.get(r) {
            Some(limit) => usage.get(r).saturating_sub(limit),
            None => 0,
        })
    }

    /// What `project` leaves unused of its limits and lets others borrow, per lent resource.
    pub fn lendable(&self, project: &ProjectId, terms: &CohortTerms) -> Usage {
        let quota = self.quota(project);
        let usage = self.usage(project);
        usage_of(|r| match quota.get(r) {
            Some(limit) => {
                let unused = limit.saturating_sub(usage.get(r));
                terms.lending_limit.get(r).map_or(unused, |most| unused.min(most))
            }
            None => 0,
        })
    }

    /// As [`QuotaLedger::check`], but a booking past the project's limits is admitted as
    /// borrowed when `borrow` and its cohort lets it (see the module docs); refused otherwise,
    /// naming the first resource past what it may hold with what it may borrow.
    pub fn check_as(
        &self,
        project: &ProjectId,
        usage: Usage,
        vms_in_use: u64,
        borrow: bool,
    ) -> Result<Admission, QuotaExceeded> {
        let refused = match self.check(project, usage, vms_in_use) {
            Ok(()) => return Ok(Admission::Guaranteed),
            Err(e) => e,
        };
        let Some((cohort, terms)) = self.cohort_of(project).filter(|_| borrow) else {
            return Err(refused);
        };
        // A VM is not lent: its limit holds whatever else the booking passes.
        let quota = self.quota(project);
        let vms = Usage { vms: usage.vms, ..Usage::default() };
        quota.check(project, Usage { vms: vms_in_use, ..Usage::default() }, vms)?;
        let held = self.usage(project);
        // What the other members lend, less what they borrow themselves.
        let totals = self.balance(cohort);
        let spare = totals.lendable.minus(self.lendable(project, terms));
        let others_borrow = totals.borrowed.minus(self.borrowed(project));
        for resource in LENT {
            let (Some(limit), wanted) = (quota.get(resource), usage.get(resource)) else {
                continue;
            };
            let past = held.get(resource).saturating_add(wanted).saturating_sub(limit);
            if wanted == 0 || past == 0 {
                continue;
            }
            let cohort_room = spare.get(resource).saturating_sub(others_borrow.get(resource));
            let may_borrow =
                terms.borrowing_limit.get(resource).map_or(cohort_room, |b| b.min(cohort_room));
            if past > may_borrow {
                let mut e = QuotaExceeded::new(project, None, resource, limit, held, usage);
                e.limit = limit.saturating_add(may_borrow);
                e.cohort = Some(cohort.clone());
                return Err(e);
            }
        }
        Ok(Admission::Borrowed)
    }

    /// Notes whether any member's terms limit what it borrows of a GPU model.
    fn note_model_borrowing_limits(&mut self) {
        let mut terms = self.cohorts.values().flat_map(BTreeMap::values);
        self.model_borrowing_limits = terms.any(|t| !t.borrowing_limit_by_model.is_empty());
    }

    /// The borrowing limits `project`'s terms set per GPU model, if any.
    pub(super) fn model_borrowing_limits(
        &self,
        project: &ProjectId,
    ) -> Option<&BTreeMap<String, ModelLimits>> {
        if !self.model_borrowing_limits {
            return None;
        }
        let (_, terms) = self.cohort_of(project)?;
        Some(&terms.borrowing_limit_by_model).filter(|limits| !limits.is_empty())
    }

    /// Whether `project` may book `requested` more of `model`, in a booking of `in_all`, without
    /// holding more of the model on loan than its terms' `borrowing_limit_by_model` allow. What
    /// it would hold on loan of the model is counted as what it would hold past its quota, as far
    /// as it would hold the model (see the module docs); a resource not requested is never
    /// refused.
    pub(super) fn check_model_loan(
        &self,
        project: &ProjectId,
        model: &str,
        requested: Usage,
        in_all: Usage,
    ) -> Result<(), QuotaExceeded> {
        if !self.model_borrowing_limits {
            return Ok(());
        }
        let Some((cohort, terms)) = self.cohort_of(project) else { return Ok(()) };
        let Some(limits) = terms.borrowing_limit_by_model.get(model) else { return Ok(()) };
        let quota = self.quota(project);
        let held = self.usage(project);
        let held_of_model = self.model_usage_of(project, model);
        for resource in LENT {
            let (Some(most), Some(limit)) = (limits.get(resource), quota.get(resource)) else {
                continue;
            };
            let wanted = requested.get(resource);
            if wanted == 0 {
                continue;
            }
            let on_loan = |of_model: u64, total: u64| of_model.min(total.saturating_sub(limit));
            let of_model = held_of_model.get(resource);
            let after = on_loan(
                of_model.saturating_add(wanted),
                held.get(resource).saturating_add(in_all.get(resource).max(wanted)),
            );
            if after > most {
                let mut e =
                    QuotaExceeded::new(project, Some(model), resource, most, held, requested);
                e.in_use = on_loan(of_model, held.get(resource));
                e.cohort = Some(cohort.clone());
                e.on_loan = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// `loans`, each with what it holds (`None`: booked no more, left out), split into those
    /// still on loan, the youngest first, and those within their project's quota now: of each
    /// project, its youngest loans are on loan while what they hold does not pass what the project
    /// holds past its quota; its older ones are its own again (its other cGPUs ended).
    pub fn split_loans<'l>(
        &self,
        loans: impl IntoIterator<Item = (&'l Loan, Option<Usage>)>,
    ) -> (Vec<&'l Loan>, Vec<&'l Loan>) {
        let mut held: Vec<(&Loan, &ProjectId, Usage)> = loans
            .into_iter()
            .filter_map(|(loan, holds)| Some((loan, self.project_of(&loan.vm)?, holds?)))
            .collect();
        held.sort_by_key(|(loan, ..)| {
            (std::cmp::Reverse(loan.since_ms), loan.vm, std::cmp::Reverse(loan.index))
        });
        let mut left: HashMap<&ProjectId, Usage> = HashMap::new();
        let (mut on_loan, mut own) = (Vec::new(), Vec::new());
        for (loan, project, holds) in held {
            let over = left.entry(project).or_insert_with(|| self.borrowed(project));
            if LENT.iter().any(|&r| holds.get(r) > 0 && over.get(r) > 0) {
                *over = over.minus(holds);
                on_loan.push(loan);
            } else {
                own.push(loan);
            }
        }
        (on_loan, own)
    }

    /// Which of `cgpus` (what each holds, in booking order) a booking for `project` would hold
    /// past its limits: the first ones fill what is left of them, each one after is on loan.
    /// Decided before the booking is charged.
    pub fn split_borrowed(&self, project: &ProjectId, cgpus: &[Usage]) -> Vec<bool> {
        let quota = self.quota(project);
        let held = self.usage(project);
        let mut total = held;
        cgpus
            .iter()
            .map(|cgpu| {
                total = total.plus(Usage { vms: 0, ..*cgpu });
                LENT.iter().any(|&r| quota.get(r).is_some_and(|limit| total.get(r) > limit))
            })
            .collect()
    }
}

/// A usage of the lent resources, each from `f`.
fn usage_of(f: impl Fn(Resource) -> u64) -> Usage {
    Usage {
        cgpus: f(Resource::Cgpus),
        memory_mib: f(Resource::MemoryMib),
        exclusive_gpus: f(Resource::ExclusiveGpus),
        vms: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::VmId;
    use crate::model::Request;
    use crate::quota::{Holding, Quota};

    fn vm(n: u128) -> VmId {
        VmId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn cgpus(n: u64) -> Usage {
        Usage { cgpus: n, ..Usage::default() }
    }

    /// alpha and beta have 4 cGPUs each; beta lends at most `lend`, alpha borrows at most
    /// `borrow`.
    fn cohort(lend: Option<u64>, borrow: Option<u64>) -> (QuotaLedger, ProjectId, ProjectId) {
        let (alpha, beta) = (ProjectId::new("alpha").unwrap(), ProjectId::new("beta").unwrap());
        let mut ledger = QuotaLedger::new(Quota { cgpus: Some(4), ..Quota::default() });
        let alpha_terms = CohortTerms {
            borrowing_limit: ModelLimits { cgpus: borrow, ..ModelLimits::default() },
            ..CohortTerms::default()
        };
        let beta_terms = CohortTerms {
            lending_limit: ModelLimits { cgpus: lend, ..ModelLimits::default() },
            ..CohortTerms::default()
        };
        let members = [(alpha.clone(), alpha_terms), (beta.clone(), beta_terms)];
        ledger.set_cohort(CohortName::new("lab").unwrap(), Some(members.into_iter().collect()));
        (ledger, alpha, beta)
    }

    #[test]
    fn a_project_borrows_what_its_cohort_leaves_unused_and_only_when_it_asks() {
        let (mut ledger, alpha, beta) = cohort(None, None);
        let six = Usage::vm_with(cgpus(6));
        let refused = ledger.charge_as(vm(1), &alpha, &Holding::from(six), 0, false).unwrap_err();
        assert_eq!((refused.limit, refused.cohort), (4, None), "no borrowing unasked");
        assert_eq!(
            ledger.split_borrowed(&alpha, &[cgpus(1); 6]),
            [0, 0, 0, 0, 1, 1].map(|b| b == 1)
        );
        assert_eq!(
            ledger.charge_as(vm(1), &alpha, &Holding::from(six), 0, true),
            Ok(Admission::Borrowed)
        );
        assert_eq!(ledger.borrowed(&alpha), cgpus(2));
        let balance = ledger.balance(&CohortName::new("lab").unwrap());
        assert_eq!((balance.lendable, balance.borrowed), (cgpus(4), cgpus(2)));
        // Beta still has its whole guarantee, loans or not.
        let four = Usage::vm_with(cgpus(4));
        assert_eq!(
            ledger.charge_as(vm(2), &beta, &Holding::from(four), 0, false),
            Ok(Admission::Guaranteed)
        );
        // Now nothing is left to lend: alpha may not borrow more.
        let err = ledger.check_as(&alpha, cgpus(1), 1, true).unwrap_err();
        assert_eq!((err.limit, err.in_use, err.requested), (4, 6, 1));
        assert_eq!(
            err.to_string(),
            "quota exceeded for cgpus in project alpha (with what cohort lab lends): limit 4, \
             in use 6, requested 1"
        );
    }

    #[test]
    fn the_lending_and_borrowing_limits_bound_a_loan() {
        let (ledger, alpha, _) = cohort(Some(3), None);
        assert_eq!(ledger.check_as(&alpha, cgpus(7), 0, true), Ok(Admission::Borrowed));
        let err = ledger.check_as(&alpha, cgpus(8), 0, true).unwrap_err();
        assert_eq!((err.limit, err.cohort.unwrap().as_str()), (7, "lab"));
        let (ledger, alpha, _) = cohort(None, Some(1));
        assert_eq!(ledger.check_as(&alpha, cgpus(5), 0, true), Ok(Admission::Borrowed));
        assert_eq!(ledger.check_as(&alpha, cgpus(6), 0, true).unwrap_err().limit, 5);
    }

    #[test]
    fn vms_and_projects_outside_a_cohort_stay_walls() {
        let (mut ledger, alpha, _) = cohort(None, None);
        ledger.set_limits(
            alpha.clone(),
            Some(Quota { cgpus: Some(4), vms: Some(1), ..Quota::default() }),
        );
        let err = ledger.check_as(&alpha, Usage::vm_with(cgpus(1)), 1, true).unwrap_err();
        assert_eq!(err.resource, Resource::Vms);
        // Past both its cGPUs and its VMs: the cGPUs could be borrowed, the VM cannot.
        let err = ledger.check_as(&alpha, Usage::vm_with(cgpus(5)), 1, true).unwrap_err();
        assert_eq!((err.resource, err.cohort), (Resource::Vms, None));
        let gamma = ProjectId::new("gamma").unwrap();
        assert_eq!(ledger.check_as(&gamma, cgpus(5), 0, true).unwrap_err().cohort, None);
        // The cohort gone, alpha keeps its quota only.
        ledger.set_cohort(CohortName::new("lab").unwrap(), None);
        assert!(ledger.cohort_of(&alpha).is_none());
        assert!(ledger.check_as(&alpha, cgpus(5), 0, true).is_err());
    }

    /// A holding of `n` cGPUs of each model named.
    fn of_models(models: &[(&str, u64)]) -> Holding {
        let mut holding = Holding::default();
        for &(model, n) in models {
            holding.models.push((model.to_owned(), cgpus(n)));
            holding.usage = holding.usage.plus(cgpus(n));
        }
        holding
    }

    /// `project` of cohort `lab` may hold at most `cgpus` on loan of model H200.
    fn limit_loans_of_h200(ledger: &mut QuotaLedger, project: &ProjectId, cgpus: u64) {
        let lab = CohortName::new("lab").unwrap();
        let mut members = ledger.cohort(&lab).unwrap().clone();
        let limits = ModelLimits { cgpus: Some(cgpus), ..ModelLimits::default() };
        members.get_mut(project).unwrap().borrowing_limit_by_model =
            BTreeMap::from([("H200".to_owned(), limits)]);
        ledger.set_cohort(lab, Some(members));
    }

    #[test]
    fn a_borrowing_limit_by_model_bounds_what_is_on_loan_of_that_model() {
        let (mut ledger, alpha, _) = cohort(None, None);
        limit_loans_of_h200(&mut ledger, &alpha, 1);
        // Alpha's own 4 cGPUs on A100s; one H200 on loan is within its terms, a second is not.
        ledger.charge_as(vm(1), &alpha, &of_models(&[("A100", 4)]), 0, false).unwrap();
        let h200 = of_models(&[("H200", 1)]);
        assert!(ledger.admits(&alpha, &h200, 1, true));
        ledger.charge_as(vm(2), &alpha, &h200, 1, true).unwrap();
        assert!(!ledger.admits(&alpha, &h200, 2, true));
        let err = ledger.charge_as(vm(3), &alpha, &h200, 2, true).unwrap_err();
        assert_eq!((err.model.as_deref(), err.limit, err.in_use), (Some("H200"), 1, 1));
        assert_eq!(
            err.to_string(),
            "quota exceeded for cgpus on loan of GPU model H200 in project alpha (with what \
             cohort lab lends): limit 1, in use 1, requested 1"
        );
        // Other models are bounded by the totals only.
        ledger.charge_as(vm(3), &alpha, &of_models(&[("A100", 2)]), 2, true).unwrap();
        // A request that may go anywhere is kept off the H200s; naming only them, refused.
        let fleet = ["A100".to_owned(), "H200".to_owned()];
        let request = Request::shared(1, 0);
        let narrowed = ledger.within_model_limits(&alpha, &request, &fleet).unwrap();
        assert_eq!(narrowed.constraints.models, ["A100"]);
        let mut named = request.clone();
        named.constraints.models = vec!["H200".to_owned()];
        let err = ledger.within_model_limits(&alpha, &named, &fleet).unwrap_err();
        assert!(err.on_loan && err.cohort.is_some(), "{err:?}");
        // Within its quota, a project is never held back by what it may borrow.
        let gone = [vm(2), vm(3)].map(|v| ledger.release(&v));
        assert!(gone.iter().all(Option::is_some));
        ledger.release(&vm(1));
        assert!(ledger.admits(&alpha, &of_models(&[("H200", 4)]), 0, false));
        assert!(ledger.admits(&alpha, &of_models(&[("H200", 5)]), 0, true));
        assert!(!ledger.admits(&alpha, &of_models(&[("H200", 6)]), 0, true));
    }

    #[test]
    fn a_booking_on_several_models_counts_its_own_guaranteed_part_first() {
        let (mut ledger, alpha, _) = cohort(None, None);
        limit_loans_of_h200(&mut ledger, &alpha, 0);
        ledger.charge_as(vm(1), &alpha, &of_models(&[("A100", 3)]), 0, false).unwrap();
        // The A100 fills the guarantee, the H200 would be on loan: refused whatever the order.
        let both = of_models(&[("A100", 1), ("H200", 1)]);
        assert!(!ledger.admits(&alpha, &both, 1, true));
        assert!(ledger.admits(&alpha, &of_models(&[("A100", 2)]), 1, true));
        assert!(ledger.admits(&alpha, &of_models(&[("H200", 1)]), 1, true));
    }
}
