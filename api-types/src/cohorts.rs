//! Cohorts: projects that lend each other the quota they do not use (`/v1/cohorts`).

use std::collections::BTreeMap;

use gpgpums::CohortTerms;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::quotas::{ModelQuotaLimits, ModelQuotaUsage};

/// A project's terms in its cohort. Only GPU resources are lent: a project's VM limit and its
/// limits per GPU model stay walls.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CohortMemberTerms {
    /// How far past its own quota the project may run on what the others lend; `null` (or
    /// absent) per resource: as far as they lend.
    #[serde(default)]
    pub borrowing_limit: ModelQuotaLimits,
    /// How much of its unused quota the others may borrow; `null` (or absent) per resource: all
    /// of it.
    #[serde(default)]
    pub lending_limit: ModelQuotaLimits,
    /// Whether its launches and attaches borrow when they do not say (`borrow` absent).
    #[serde(default)]
    pub borrow_by_default: bool,
}

/// `PUT /v1/cohorts/{name}`: the cohort's members (project ids) and their terms. Replaces the
/// members it had; a project may be in one cohort only.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CohortRequest {
    pub members: BTreeMap<String, CohortMemberTerms>,
}

/// One member of a cohort: its terms, and what it lends and borrows now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CohortMemberView {
    pub terms: CohortMemberTerms,
    /// What it holds past its own quota now.
    pub borrowed: ModelQuotaUsage,
    /// What it leaves unused of its quota and lets the others borrow now.
    pub lendable: ModelQuotaUsage,
}

/// A cohort: its members, and what they lend and borrow in all.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CohortView {
    pub name: String,
    pub members: BTreeMap<String, CohortMemberView>,
    /// What the members could lend now, in all.
    pub lendable: ModelQuotaUsage,
    /// What the members hold past their own quotas now, in all.
    pub borrowed: ModelQuotaUsage,
}

/// Cohorts as a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CohortList {
    pub cohorts: Vec<CohortView>,
}

impl From<CohortMemberTerms> for CohortTerms {
    fn from(t: CohortMemberTerms) -> CohortTerms {
        CohortTerms {
            borrowing_limit: t.borrowing_limit.into(),
            lending_limit: t.lending_limit.into(),
            borrow_by_default: t.borrow_by_default,
        }
    }
}

impl From<CohortTerms> for CohortMemberTerms {
    fn from(t: CohortTerms) -> CohortMemberTerms {
        CohortMemberTerms {
            borrowing_limit: t.borrowing_limit.into(),
            lending_limit: t.lending_limit.into(),
            borrow_by_default: t.borrow_by_default,
        }
    }
}
