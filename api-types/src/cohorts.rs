//! Cohorts: projects that lend each other the quota they do not use (`/v1/cohorts`).

use std::collections::BTreeMap;

use gpgpums::CohortTerms;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::quotas::{ModelQuotaLimits, ModelQuotaUsage};

/// A project's terms in its cohort. Only GPU resources are lent: a project's VM limit and its
/// limits per GPU model stay walls.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
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
    /// How much it may hold on loan of a GPU model, by the model's exact name (at most 64), beside
    /// `borrowing_limit`; a model without an entry: the totals only. What it holds on loan of a
    /// model is counted as what it holds past its quota, as far as it holds that model.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub borrowing_limit_by_model: BTreeMap<String, ModelQuotaLimits>,
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
    /// The version of the members and their terms, also the `ETag` of `GET` and `PUT
    /// /v1/cohorts/{name}`: sent back in `If-Match` (quoted), a `PUT` or `DELETE` changes the
    /// cohort only if nobody has changed it since (409 `version_conflict` otherwise).
    #[serde(default)]
    pub version: String,
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
            borrowing_limit_by_model: by_model(t.borrowing_limit_by_model),
        }
    }
}

impl From<CohortTerms> for CohortMemberTerms {
    fn from(t: CohortTerms) -> CohortMemberTerms {
        CohortMemberTerms {
            borrowing_limit: t.borrowing_limit.into(),
            lending_limit: t.lending_limit.into(),
            borrow_by_default: t.borrow_by_default,
            borrowing_limit_by_model: by_model(t.borrowing_limit_by_model),
        }
    }
}

/// Limits by model, converted.
fn by_model<A, B: From<A>>(limits: BTreeMap<String, A>) -> BTreeMap<String, B> {
    limits.into_iter().map(|(model, limits)| (model, limits.into())).collect()
}
