//! Cohorts through the API: operators putting projects in a cohort on their terms, and what the
//! members lend and borrow (the decisions are [`gpgpums::quota`]'s cohort part, made where
//! bookings are: [`super::bookings`] and the queue's rounds).
//!
//! Like quotas, a cohort changes in a pool transaction: the generation moves, so every replica
//! reloads its ledger before its next booking and none admits a loan on old terms.

use std::collections::BTreeMap;

use gpgpums::traits::model_name_problem;
use gpgpums::{CohortName, CohortTerms, ProjectId, QuotaLedger, Resource, Usage, MAX_MODEL_LIMITS};

use super::App;
use crate::auth::Caller;
use crate::config::MAX_QUOTA_LIMIT;
use crate::db::now_ms;
use crate::error::Error;
use crate::policy::{actions, Target};

/// The most projects one cohort may have.
pub const MAX_COHORT_MEMBERS: usize = 1000;

/// A cohort and what its members lend and borrow now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CohortStatus {
    pub name: CohortName,
    /// Each member, by project: its terms, what it borrows and what it could lend now.
    pub members: Vec<(ProjectId, CohortTerms, Usage, Usage)>,
    pub lendable: Usage,
    pub borrowed: Usage,
    /// The version of its members' terms ([`version`]): its `ETag`.
    pub version: String,
}

fn status(quotas: &QuotaLedger, name: &CohortName) -> Option<CohortStatus> {
    let terms = quotas.cohort(name)?;
    let members = terms
        .iter()
        .map(|(project, terms)| {
            let part = quotas.member_balance(project).unwrap_or_default();
            (project.clone(), terms.clone(), part.borrowed, part.lendable)
        })
        .collect();
    let balance = quotas.balance(name);
    Some(CohortStatus {
        name: name.clone(),
        members,
        lendable: balance.lendable,
        borrowed: balance.borrowed,
        version: version(terms),
    })
}

/// A version of a cohort's members and their terms (an FNV digest of them as JSON, which orders
/// them): the same on every replica and release while they are the same.
pub fn version(members: &BTreeMap<ProjectId, CohortTerms>) -> String {
    let json = serde_json::to_vec(members).expect("terms serialize");
    super::vms::digest(&json)
}

/// A cohort's name from the path: a bad one is a 404 to those who list cohorts, as for any name
/// that names nothing.
fn cohort_name(name: &str) -> Result<CohortName, Error> {
    CohortName::new(name).map_err(|_| Error::NotFound { kind: "cohort", id: name.to_owned() })
}

/// `members` checked: project ids, limits in range, at most [`MAX_COHORT_MEMBERS`].
fn checked_members(
    members: BTreeMap<String, CohortTerms>,
) -> Result<BTreeMap<ProjectId, CohortTerms>, Error> {
    if members.len() > MAX_COHORT_MEMBERS {
        let reason = format!("{} members are more than {MAX_COHORT_MEMBERS}", members.len());
        return Err(Error::invalid("members", reason));
    }
    let mut checked = BTreeMap::new();
    for (project, terms) in members {
        let id = ProjectId::new(&project)
            .map_err(|e| Error::invalid(format!("members.{project}"), e.to_string()))?;
        let by_model = &terms.borrowing_limit_by_model;
        if by_model.len() > MAX_MODEL_LIMITS {
            let reason = format!("{} models are more than {MAX_MODEL_LIMITS}", by_model.len());
            return Err(Error::invalid(
                format!("members.{project}.borrowing_limit_by_model"),
                reason,
            ));
        }
        let models = by_model.iter().map(|(model, limits)| {
            (format!("borrowing_limit_by_model.{model}"), *limits, model_name_problem(model))
        });
        let totals =
            [("borrowing_limit", terms.borrowing_limit), ("lending_limit", terms.lending_limit)]
                .map(|(which, limits)| (which.to_owned(), limits, None));
        for (which, limits, name_problem) in totals.into_iter().chain(models) {
            if let Some(problem) = name_problem {
                return Err(Error::invalid(
                    format!("members.{project}.borrowing_limit_by_model"),
                    problem,
                ));
            }
            for resource in [Resource::Cgpus, Resource::MemoryMib, Resource::ExclusiveGpus] {
                if let Some(limit) = limits.get(resource).filter(|l| *l > MAX_QUOTA_LIMIT) {
                    return Err(Error::invalid(
                        format!("members.{project}.{which}.{resource}"),
                        format!("{limit} is above the maximum {MAX_QUOTA_LIMIT}"),
                    ));
                }
            }
        }
        checked.insert(id, terms);
    }
    Ok(checked)
}

impl App {
    /// Every cohort (admins).
    pub async fn cohorts(&self, caller: &Caller) -> Result<Vec<CohortStatus>, Error> {
        self.policy.authorize(actions::COHORT_LIST, caller, Target::Service)?;
        self.read_pool_and_quotas(|_, quotas| {
            quotas.cohorts().filter_map(|(name, _)| status(quotas, name)).collect()
        })
        .await
    }

    /// One cohort (admins).
    pub async fn cohort(&self, caller: &Caller, name: &str) -> Result<CohortStatus, Error> {
        self.policy.authorize(actions::COHORT_LIST, caller, Target::Service)?;
        let name = cohort_name(name)?;
        let found = self.read_pool_and_quotas(|_, quotas| status(quotas, &name)).await?;
        found.ok_or_else(|| Error::NotFound { kind: "cohort", id: name.to_string() })
    }

    /// Makes cohort `name` hold exactly `members` on their terms, or ends it (`None`; admins).
    /// A project already in another cohort is refused (409): it leaves that one first. What is
    /// on loan stays held; new bookings see the new terms. `if_match`: only if the cohort is at
    /// one of these versions ([`CohortStatus::version`]; `*`: any, so it must exist), or 409
    /// `version_conflict`, changing nothing: an admin's read-change-write never undoes another's.
    pub async fn set_cohort(
        &self,
        caller: &Caller,
        name: &str,
        members: Option<BTreeMap<String, CohortTerms>>,
        if_match: Option<&[String]>,
    ) -> Result<Option<CohortStatus>, Error> {
        self.policy.authorize(actions::COHORT_SET, caller, Target::Service)?;
        let name = CohortName::new(name).map_err(|e| Error::invalid("name", e.to_string()))?;
        let members = members.map(checked_members).transpose()?;
        if members.as_ref().is_some_and(BTreeMap::is_empty) {
            let reason = "a cohort needs a member; DELETE ends one";
            return Err(Error::invalid("members", reason));
        }
        let mut pool_tx = self.pool_tx().await?;
        let (_, quotas, tx) = pool_tx.parts_with_quotas();
        if members.is_none() && quotas.cohort(&name).is_none() {
            return Err(Error::NotFound { kind: "cohort", id: name.to_string() });
        }
        if let Some(expected) = if_match {
            let now = quotas.cohort(&name).map(version);
            let matches = |v: &String| now.as_ref().is_some_and(|now| v == "*" || v == now);
            if !expected.iter().any(matches) {
                return Err(Error::VersionConflict(format!(
                    "cohort {name} {} since it was read: read it again and make the change on \
                     what it holds now",
                    if now.is_some() { "changed" } else { "no longer exists" }
                )));
            }
        }
        for project in members.iter().flat_map(BTreeMap::keys) {
            if let Some((other, _)) = quotas.cohort_of(project).filter(|(n, _)| **n != name) {
                return Err(Error::Conflict(format!(
                    "project {project} is in cohort {other}: take it out of that one first"
                )));
            }
        }
        tx.set_cohort(&name, members.as_ref(), now_ms()).await?;
        quotas.set_cohort(name.clone(), members);
        let after = status(quotas, &name);
        pool_tx.commit().await?;
        // More to lend may let queued requests that borrow start.
        self.trigger_queue();
        Ok(after)
    }
}
